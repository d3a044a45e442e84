"""What the agent remembers of a pool between its batches, and how a batch's view of the pool is chosen
from it: the agent's read policy (ipam.attempt.Reads; a plugin process reads the pool as stored,
ipam.attempt.Stored).

`Memory` (one per pool, kept in the pool's combiner, ipam.combiner): the pool as the agent's last write
left it, the node lock's counter then, the pool's version after that write (`floor`), whether other
nodes race this one on it (`hot`) or wrote it outside this node's lock (`foreign`), and the ADDs this
agent decided and whose writes are still waiting (`inflight`: a batch that decides meanwhile keeps off
their addresses).

`Remembered` (one per batch): the batch decided on the first of the pool's SOURCES that serves it:
- `kept`: the pool as the agent's last write left it, while no other holder of the node lock wrote
  since: for DELs always, for ADDs while the pool is not hot, no foreign write was seen lately and no
  other node shares the pool (Pool.shared: its writes take turns). An ADD must see every entry of its
  pod, also one written outside this node's lock (upstream whereabouts during a migration), so a write
  with ADDs decided on it needs the whole pool still at its version (PoolUpdate.whole). The pass stops
  at the first candidate whose reservation is newer than the snapshot (stale: no lost race); when it
  lacks, `cached` is skipped.
- `cached`: the pool read at least as new as the agent's last write of it (`floor`: a server's cache
  holds that write); not after a failed write in this batch (`reread`).
- `stored`: the pool as stored.
A pass on a view that may lack newer writes (it stopped stale, an ADD failed on it, a DEL found nothing)
is undone and the batch decided on the next source. On a hot pool and a store that checks whole
versions (not `merges`), the reservations a pass created took round trips during which the pool may have
moved on: the pool is read again and the batch decided again on it (each op keeps the address it
reserved, no request), so the write follows its read at once."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from ipam import nodelock
from ipam.allocator import SnapshotView
from ipam.attempt import Attempt, Pass, Sent, undecide
from ipam.decide import Changes
from ipam.model import Pool, PoolView
from ipam.operation import FAILED, Op
from ipam.ranges import IPRange, same_network

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from contextlib import AbstractContextManager

KEPT, CACHED, STORED = "kept", "cached", "stored"
SOURCES = (KEPT, CACHED, STORED)  # where a batch's view of the pool comes from, in order
HOT_SECONDS = 10.0  # after a race lost to another node, this node's calls scatter at once for this long


class Memory:
    """What the agent remembers of one pool (module docstring), used by its batches one decision at a
    time (the combiner's `batching` lock).

    - `last`, `count`: the pool as the agent's last write left it (the store's answer) and the node
      lock's counter then: usable while the counter moved by exactly one (no other holder since);
    - `floor`: the pool's version after that write: a read at least that new (a server's cache) sees it;
    - `hot_until`, `foreign_until` (monotonic): a race lost to another node lately (the next ADDs spread
      their candidates at once), a write outside this node's lock seen lately (ADDs read the pool);
    - `inflight`: offsets of ADDs decided and sent whose writes wait (a shared pool's turn)."""

    def __init__(self) -> None:
        self.last: Pool | None = None
        self.count = -1
        self.floor = ""
        self.hot_until = self.foreign_until = 0.0
        self.inflight: set[int] = set()

    def hot(self) -> bool:
        """Whether other nodes race this one on the pool."""
        return time.monotonic() < self.hot_until

    def heat(self, seconds: float) -> None:
        self.hot_until = time.monotonic() + seconds

    def foreign(self) -> bool:
        return time.monotonic() < self.foreign_until

    def seen_foreign(self, seconds: float) -> None:
        self.foreign_until = time.monotonic() + seconds

    def view(self, lock: nodelock.Held | None) -> Pool | None:
        """The pool as the last write left it, if no other holder of the node lock wrote since."""
        if self.last is None or lock is None or lock.count != (self.count + 1) % 2**63:
            return None
        return self.last

    def wrote(self, lock: nodelock.Held | None, pool: Pool | None, version: str) -> None:
        self.last, self.count = (pool, lock.count) if lock is not None else (None, -1)
        self.floor = version


class Remembered:
    """The agent's read policy for one batch (ipam.attempt.Reads; module docstring) over the pool's
    `memory`. `batching`: the lock that lets one batch of the pool decide and begin its write at a time
    (the combiner's); `waiting`: called when the batch's write waits for other writers (the combiner
    starts the next batch)."""

    def __init__(
        self, memory: Memory, batching: AbstractContextManager[object] | None = None,
        waiting: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.memory, self.batching, self.on_wait = memory, batching, waiting
        self.reread = False  # a write of this batch failed: every attempt after it reads the pool as stored

    def hot(self) -> bool:
        return self.memory.hot()

    def exclusive(self) -> AbstractContextManager[object]:
        return self.batching if self.batching is not None else contextlib.nullcontext()

    def decide(
        self, attempt: Attempt, rng: IPRange, lock: nodelock.Held | None, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass, bool]:  # fmt: skip
        """Decide the batch on the first of the pool's SOURCES that serves it (module docstring): (the
        view decided on, the pass, whether the view is the one the agent kept)."""
        before = [op.claims.lost for op in pending]  # (every op pending: Attempt.step)
        tried = False
        for source in SOURCES:
            view = self._read(attempt, source, rng, lock, pending, hot, tried)
            if view is None:
                continue
            tried = True
            undone = [op for op in pending if not op.done]
            view, got = self._decide_on(attempt, source, rng, view, undone, hot)
            if source == STORED or not _lacking(got, pending):
                return view, got, source == KEPT
            if got.stale or _failed_add(pending):  # the failures met on it void too
                if source == KEPT:
                    self.memory.seen_foreign(HOT_SECONDS)
                for op, n in zip(pending, before, strict=True):
                    op.claims.lost = n
                undecide(pending, failed=True)
            else:
                undecide(pending)
        raise AssertionError("the stored pool is always a source")  # (the loop returns on STORED)

    def _read(
        self, attempt: Attempt, source: str, rng: IPRange, lock: nodelock.Held | None, pending: list[Op],
        hot: bool | None, tried: bool,
    ) -> PoolView | None:  # fmt: skip
        """The pool from `source`, or None when that source is not there."""
        if source == KEPT:
            pool = self.memory.view(lock) if _trusts_snapshot(self.memory, pending, hot) else None
            return None if pool is None or not same_network(pool.range, rng) else SnapshotView(pool)
        if source == CACHED:
            floor = "" if self.reread or tried else self.memory.floor
            return attempt.e.view(rng, floor) if floor else None
        return attempt.e.view(rng)

    def _decide_on(
        self, attempt: Attempt, source: str, rng: IPRange, view: PoolView, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass]:  # fmt: skip
        """Decide on `view`, off the addresses of this agent's ADDs still waiting for their write; on a
        hot pool and a store that checks whole versions, decided again on the pool read again when the
        pass created reservations and the pool moved meanwhile (module docstring)."""
        got = attempt.decide_all(view, pending, hot, snapshot=source == KEPT, changes=self._changes(view))
        if source != KEPT and hot and got.claimed and not attempt.e.store.merges:
            again = attempt.e.view(rng)
            if again.version != view.version:
                undecide(pending)
                rest = [op for op in pending if not op.done]
                return again, attempt.decide_all(again, rest, hot, changes=self._changes(again))
        return view, got

    def _changes(self, view: PoolView) -> Changes:
        changes = Changes(view)
        for offset in self.memory.inflight:
            changes.hold(offset)
        return changes

    def raced(self) -> None:
        self.memory.heat(HOT_SECONDS)  # races lost to other nodes: the next calls here spread at once

    def conflicted(self, whole: bool) -> None:
        self.reread = True  # not a cached read next time: it may not hold what we met
        if whole:  # written since the view this process kept: read it for a while
            self.memory.seen_foreign(HOT_SECONDS)
        else:
            self.memory.heat(HOT_SECONDS)  # another node wrote this pool meanwhile

    @contextlib.contextmanager
    def sending(self, sent: Sent) -> Iterator[None]:
        """Around the wait for the batch's write: its ADDs' addresses in flight meanwhile, and the next
        batch started when the write waits for other writers."""
        offsets = {op.offsets[0] for op in sent.decided if op.kind == "add" and op.offsets}
        self.memory.inflight |= offsets
        try:
            if sent.waiting is not None and self.on_wait is not None:
                self.on_wait()
            yield
        finally:
            self.memory.inflight -= offsets

    def wrote(self, attempt: Attempt, lock: nodelock.Held | None, version: str) -> None:
        self.memory.wrote(lock, attempt.e.store.written(attempt.name, version), version)


def _trusts_snapshot(memory: Memory, pending: list[Op], hot: bool | None) -> bool:
    """Whether the batch may start from the agent's snapshot (Remembered.decide)."""
    adds = any(op.kind == "add" for op in pending)
    shared = memory.last is not None and memory.last.shared  # other nodes' writes outdate it at once
    return not adds or (not hot and not memory.foreign() and not shared)


def _failed_add(pending: list[Op]) -> bool:
    return any(op.kind == "add" and op.state == FAILED for op in pending)


def _lacking(got: Pass, pending: list[Op]) -> bool:
    """The view a pass decided on may lack newer writes: it stopped stale, an ADD failed on it, or a DEL
    found nothing on it."""
    return got.stale or _failed_add(pending) or any(op.kind == "del" and not op.freed for op in got.decided)
