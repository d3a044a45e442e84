"""Several IPAM operations on one pool in one read-modify-write: the pieces ipam.engine batches with.

- `Op`: one attachment's ADD or DEL in one range, with what it has claimed so far; `done` once its part
  of a committed write (or its own error) is final.
- `BatchView`: a PoolView over the stored pool plus the changes decided earlier in the same batch, so
  two operations of one batch never pick the same address, and one write commits them all.
- `Combiner`: flat combining across the threads of one process (the node-local agent). Each thread
  queues its operations on the pool's combiner and takes the combiner's lock; whoever holds it runs
  everything queued so far as one batch, so N concurrent calls on one pool cost one pool write instead
  of N racing ones, and their threads return as soon as a batch holding their operation is done. A
  plugin process has one operation: its batch is just that one (`Combiner.run` without sharing)."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading costs a call ~1 ms
import time
from collections.abc import Callable, Hashable, Sequence, Set

from cni import metrics
from cni.types.valueclass import field, valueclass
from ipam.model import Allocation, PoolUpdate, PoolView, Segment
from ipam.ranges import IPRange

MAX_BATCH = 128  # operations in one pool write (bounds a write's size and its retry cost)
PACE = 1.0  # the agent's combiners: wait as long as the previous write took before the next (Combiner)
PACE_MAX = 2.0  # seconds: the longest such wait (only writes slower than this reach it: huge pools)


@valueclass(frozen=False)
class Claims:
    blocked: set[int] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)  # reservations made by this op: name -> version
    mine: dict[str, int] = field(default_factory=dict)  # their offsets: name -> offset
    lost: int = 0  # candidates found reserved by someone else on this network


@valueclass(frozen=False)
class Op:
    kind: str  # "add" | "del"
    rng: IPRange
    owner: Allocation
    overlapping: bool
    claims: Claims = field(default_factory=Claims)
    offsets: list[int] = field(default_factory=list)  # add: [the address]
    freed: list[tuple[int, Allocation]] = field(default_factory=list)  # del: offsets and entries freed
    known: dict[str, str] = field(default_factory=dict)  # del: versions of the freed reservations, if known
    released: bool = False  # del: its reservations were released in its batch (the agent)
    reread: bool = False  # a write of its batch failed: the next attempt reads the pool as stored
    begun: float = 0.0  # when the op started
    started: float = 0.0  # when it last saw progress (its start, or a race lost to another writer)
    error: BaseException | None = None
    done: bool = False


def _numeric(item: tuple[str, Allocation]) -> tuple[int, str]:
    return len(item[0]), item[0]


class BatchView:
    """`base` with this batch's decisions applied. Offsets freed in the batch stay taken until the write
    commits (a freed address is never handed out again by the same write)."""

    def __init__(self, base: PoolView) -> None:
        self.base = base
        self.put: dict[str, Allocation] = {}
        self.remove: set[str] = set()
        self._held: set[int] = set()

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def range(self) -> str:
        return self.base.range

    @property
    def version(self) -> str | None:
        return self.base.version

    def count(self) -> int:
        return self.base.count() + len(self._held)

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        match = owner.same_pod_interface if by_pod else owner.same_attachment
        changed = self.remove | self.put.keys()
        out = [(k, a) for k, a in self.base.owned(owner, by_pod) if k not in changed]
        out += [(k, a) for k, a in self.put.items() if match(a)]
        return sorted(out, key=_numeric)

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        return self.base.lowest_free(segments, set(blocked) | self._held if self._held else blocked)

    def apply(self, update: PoolUpdate) -> None:
        for key in update.remove:
            self.put.pop(key, None)
            self.remove.add(key)
            if key.isdigit():
                self._held.add(int(key))
        for key, owner in update.put.items():
            self.remove.discard(key)
            self.put[key] = owner
            if key.isdigit():
                self._held.add(int(key))

    def hold(self, offset: int) -> None:
        """`offset` is someone else's (a reservation): no op of this batch picks it."""
        self._held.add(offset)

    def update(self) -> PoolUpdate:
        return PoolUpdate(put=dict(self.put), remove=frozenset(self.remove))


class Combiner:
    """One per pool (and store) in a process; see the module docstring.

    `pace` (the agent's: PACE): a batch starts no sooner than `pace` times the previous batch's duration
    after it ended (at most PACE_MAX seconds later). A write of a shared pool costs the API server CPU in
    proportion to the pool's size, and much more when writers of other nodes overlap it (the server redoes
    a write whose object changed under it): when writes are slow, the node waits as long again, so more
    operations join each write and the nodes' writes overlap less. When writes are fast the wait is as
    short as they are. A plugin process (one operation per batch) never waits."""

    def __init__(self, pace: float = 0.0) -> None:
        self._turn = _thread.allocate_lock()  # held by the thread running a batch
        self._queue_lock = _thread.allocate_lock()
        self._queue: list[Op] = []
        self.pace = pace
        self._took = self._ended = 0.0  # the previous batch: how long it ran, when it ended (monotonic)

    def pending(self) -> int:
        """Operations queued and not yet taken into a batch."""
        with self._queue_lock:
            return len(self._queue)

    def run(self, ops: Sequence[Op], execute: Callable[[list[Op]], None]) -> None:
        """Queue `ops`, then run batches until they are done. `execute` must leave every op of its
        batch done or raise; a raised error becomes the error of every op of the batch not yet done."""
        with self._queue_lock:
            self._queue.extend(ops)
        while not all(op.done for op in ops):
            with self._turn:
                if all(op.done for op in ops):
                    return
                if self.pace and self._took:
                    gap = pace_gap(self._took, time.monotonic() - self._ended, self.pace)
                    if gap > 0:
                        time.sleep(gap)
                with self._queue_lock:
                    batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                if not batch:
                    continue
                began = time.monotonic()
                try:
                    execute(batch)
                except BaseException as e:
                    for op in batch:
                        if not op.done:
                            op.error, op.done = e, True
                    if any(op in ops for op in batch) and not isinstance(e, Exception):
                        raise  # KeyboardInterrupt, SystemExit: this thread's own business
                finally:  # each op runs in one batch: count its races lost once, when it is over
                    metrics.conflict("reservation", sum(op.claims.lost for op in batch))
                    self._ended = time.monotonic()
                    self._took = self._ended - began


def pace_gap(took: float, since: float, pace: float = PACE, longest: float = PACE_MAX) -> float:
    """Seconds to wait before the next write of a pool, the previous one having taken `took` and ended
    `since` seconds ago: `pace` times its duration after its end, at most `longest` (<= 0: none). The
    agent's combiners and plugin processes holding the node lock (ipam.engine) pace alike."""
    return min(took * pace, longest) - since


class _Registry:
    enabled = False
    pace = 0.0
    lock = _thread.allocate_lock()
    combiners: dict[Hashable, Combiner] = {}


def share(enabled: bool = True, pace: float = PACE) -> None:
    """The agent turns this on once: concurrent calls of the process on one pool then share writes,
    paced by `pace` (Combiner)."""
    _Registry.enabled, _Registry.pace = enabled, pace
    if not enabled:
        with _Registry.lock:
            _Registry.combiners.clear()


def sharing() -> bool:
    """Whether this process shares writes between its threads (the agent)."""
    return _Registry.enabled


def combiner(key: Hashable) -> Combiner:
    """The process' combiner for `key` when sharing is on, else a private one (a batch of one call)."""
    if not _Registry.enabled:
        return Combiner()
    with _Registry.lock:
        found = _Registry.combiners.get(key)
        if found is None:
            found = _Registry.combiners[key] = Combiner(_Registry.pace)
        return found
