"""One attempt at a batch of one pool, whatever the execution mode: under the node lock, every op not yet
done decided in turn through the core (ipam.decide) on the pool, then one compare-and-swap write.
ipam.retry runs attempts until one writes; each op's state (ipam.operation.Op.to) says where it is. The two
execution modes (a plugin process: ipam.exec_plain; the agent: ipam.batch) differ only in what
they pass: the pool's `Memory`, and whether the batch releases its DELs' reservations itself.

What the attempt knows of the pool beyond a read is one explicit per-pool value, `Memory`. A plugin
process has none (an empty one per call: it reads the pool, decides, writes, retries). The agent keeps
one per pool (ipam.batch): its batch then starts from the pool as its own last write left it,
when no other holder of the node lock wrote since: a batch of DELs always, one with ADDs while the pool
is not `hot` (no race lost to another node and no foreign write seen lately: on a pool this node alone
writes, an ADD then costs no read). Such a view may lack the latest writes of others: a DEL that finds
nothing in it looks at the stored pool before saying so, a removal that no longer fits is a Conflict
like any other, and a write with ADDs decided on it needs the whole pool unchanged since (a Conflict:
the retry, and for a while the pool's next ADDs, read the pool).

On a pool other nodes write too (`hot`) and a store that checks whole versions (not `merges`), the
reservations a pass created took round trips during which the pool may have moved on: the pool is read
again and the batch decided again on it (each op keeps the address it reserved, no request), so the
write follows its read at once instead of losing the compare-and-swap to whoever wrote meanwhile. A
merging store guards entry by entry: no need."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from cni import faults, log
from cni.errors import CniError, TryAgainError
from ipam import allocator, decide, nodelock, operation, reservations
from ipam.allocator import SnapshotView
from ipam.decide import Changes
from ipam.model import Pool, PoolUpdate, PoolView
from ipam.operation import Op
from ipam.ranges import IPRange, same_network
from ipam.retry import retrying
from ipam.store.base import Conflict, StoreUnavailable

TYPE_CHECKING = False
if TYPE_CHECKING:  # (typing costs every call: annotations only)
    from contextlib import AbstractContextManager
    from typing import Protocol

    from ipam.reservations import Reservations
    from ipam.retry import Retry
    from ipam.store.base import Store

    class Access(Protocol):
        """What an attempt uses of its pool's store and configuration (ipam.engine.Engine is one): the
        executors and the attempt reach the engine through this, never by importing it."""

        store: Store
        retry: Retry
        reservations: Reservations

        def view(self, rng: IPRange, floor: str = "") -> PoolView: ...
        def commit(self, view: PoolView, update: PoolUpdate) -> str: ...
        def post(self, view: PoolView, update: PoolUpdate) -> Callable[[], str] | None: ...
        def atomic(self, pool: str = "", node: str = "") -> AbstractContextManager[nodelock.Held | None]: ...
        def lean_for(self, op: Op) -> bool: ...
        def reservation_name(self, rng: IPRange, offset: int) -> str: ...

KEPT, CACHED, STORED = "kept", "cached", "stored"
SOURCES = (KEPT, CACHED, STORED)  # where a batch's view of the pool comes from, in order (decide_batch)
HOT_SECONDS = 10.0  # after a race lost to another node, this node's calls scatter at once for this long


class Memory:
    """What a process remembers of one pool between its batches (module docstring): empty in a plugin
    process; the agent keeps one per pool, used by one batch at a time (its combiner's).

    - `last`, `count`: the pool as this process' last write left it (the store's answer) and the node
      lock's counter then: usable while the counter moved by exactly one (no other holder since);
    - `floor`: the pool's version after that write: a read at least that new (a server's cache) sees it;
    - `hot_until`, `foreign_until` (monotonic): a race lost to another node lately (the next ADDs spread
      their candidates at once), a write outside this node's lock seen lately (ADDs read the pool)."""

    def __init__(self, kept: bool = False) -> None:
        self.last: Pool | None = None
        self.count = -1
        self.floor = ""
        self.hot_until = self.foreign_until = 0.0
        self.kept = kept  # this process keeps it across batches (the agent): else nothing is noted

    def hot(self) -> bool | None:
        """Whether other nodes race this one on the pool; None: not known (a plugin process)."""
        return time.monotonic() < self.hot_until if self.kept else None

    def heat(self, seconds: float) -> None:
        self.hot_until = time.monotonic() + seconds

    def foreign(self) -> bool:
        return time.monotonic() < self.foreign_until

    def seen_foreign(self, seconds: float) -> None:
        self.foreign_until = time.monotonic() + seconds

    def view(self, lock: nodelock.Held | None) -> Pool | None:
        """The pool as the last write left it, if no other holder of the node lock wrote since."""
        if not self.kept or self.last is None or lock is None or lock.count != (self.count + 1) % 2**63:
            return None
        return self.last

    def wrote(self, lock: nodelock.Held | None, pool: Pool | None, version: str) -> None:
        if self.kept:
            self.last, self.count = (pool, lock.count) if lock is not None else (None, -1)
            self.floor = version


class Pass:
    """One pass of decisions over ops (Attempt.decide_all): the changes, the ops decided, whether any
    reservation was created on the way, and whether it stopped on a snapshot found `stale`."""

    def __init__(self, changes: Changes) -> None:
        self.changes = changes
        self.decided: list[Op] = []
        self.claimed = False
        self.stale = False


class Sent:
    """A batch's write as begun under the node lock (Attempt._send): its ops, the lock it was begun
    under, the update, and the version after it (`version`) or the wait for it (`waiting`)."""

    def __init__(self, decided: list[Op], lock: nodelock.Held | None, update: PoolUpdate) -> None:
        self.decided, self.lock, self.update = decided, lock, update
        self.version: str | None = None
        self.waiting: Callable[[], str] | None = None


class Attempt:
    """Attempts at the batch `ops` of pool `name` until one writes (`run`); `ops` is the batch's list
    (the agent's arrivals join it). `reread` once a write of it failed: every attempt after it reads the
    pool as stored (a cached read may not hold what that write met)."""

    def __init__(
        self, engine: Access, name: str, ops: list[Op], memory: Memory, releases: bool = False
    ) -> None:
        self.e, self.name, self.ops, self.memory = engine, name, ops, memory
        self.releases = releases  # DELs release their reservations in the batch, and are written only then
        self.reread = False
        self.lock: nodelock.Held | None = None  # the node lock of the attempt under way (its notes)

    def run(self) -> None:
        kind = "allocating" if self.ops[0].kind == "add" else "releasing"
        retrying(self.e.retry, f"{kind} in {self.ops[0].rng.cidr}", self.step)

    def step(self) -> None:
        """One read-modify-write of the pool for every op of the batch not yet done: each decided in
        turn against the pool plus the decisions before it, then one write, begun under the node lock
        and awaited after it (a write through a shared pool's turn waits for other nodes' writes: the
        node's next writers decide meanwhile). A Conflict on the write leaves every op pending (the
        retry reads the pool again; reservations already made are kept)."""
        pending = [op for op in self.ops if not op.done]
        if not pending:
            return
        undecide(pending)  # an attempt before this one failed: its decisions are void
        with self.e.atomic(self.name, pending[0].owner.node) as lock:
            sent = self._locked(lock, pending)
        self._written(sent)

    def _locked(self, lock: nodelock.Held | None, pending: list[Op]) -> Sent:
        self.lock = lock
        if lock is not None:  # what a holder that died left (ipam.reservations); this call's claims noted
            if lock.left:
                reservations.free_left(self.e.reservations, lambda: self.e.view(pending[0].rng), lock)
            for op in pending:
                for name, offset in op.claims.mine.items():
                    reservations.note_claim(lock, name, offset, op.owner)
        memory = self.memory
        hot = memory.hot()
        lost = sum(op.claims.lost for op in pending)
        view, got, cached = self.decide_batch(pending[0].rng, lock, pending, hot)
        if sum(op.claims.lost for op in pending) > lost:
            memory.heat(HOT_SECONDS)  # races lost to other nodes: the next calls here spread at once
        return self._send(view, got.changes, cached, got.decided, lock)

    def _send(
        self, view: PoolView, changes: Changes, cached: bool, decided: list[Op], lock: nodelock.Held | None
    ) -> Sent:  # fmt: skip
        """The batch's one write begun (none when it changes nothing): written at once, or waiting."""
        update = changes.update()
        whole = cached and any(op.kind == "add" for op in decided)
        update = PoolUpdate(update.put, update.remove, whole, decided[0].owner.node if decided else "")
        sent = Sent(decided, lock, update)
        if not update or (view.version is None and not update.put):
            sent.version = view.version
            return sent
        with self._failing(sent):
            sent.waiting = self.e.post(view, update)
            if sent.waiting is None:
                sent.version = self.e.commit(view, update)
                faults.point("store-commit")  # tests: inside the store transaction, before it ends
        return sent

    def _written(self, sent: Sent) -> None:
        """The write of `sent` awaited (outside the node lock), then its ops written."""
        if sent.waiting is not None:
            with self._failing(sent):
                sent.version = sent.waiting()
        memory = self.memory
        if sent.version is not None:
            pool = self.e.store.written(self.name, sent.version) if memory.kept else None
            memory.wrote(sent.lock, pool, sent.version)
        for op in sent.decided:  # a mode that releases in the batch: its DELs written once released
            if op.kind == "add" or not self.releases:
                op.to(operation.WRITTEN)
        for op in sent.decided:
            if op.kind == "add":
                log.debug("%s %s: %s (%s)", op.owner.container_id, op.owner.ifname,
                          op.rng.address(op.offsets[0]), self.name)  # fmt: skip

    @contextlib.contextmanager
    def _failing(self, sent: Sent) -> Iterator[None]:
        """What a failed write of `sent` leaves for the retry."""
        try:
            yield
        except StoreUnavailable:  # the server may have applied the write all the same (StoreBusy:
            # a read timeout, a 504): a retry may find these entries gone, their reservations not
            for op in sent.decided:
                op.sent += [f for f in op.freed if f not in op.sent]
            raise
        except Conflict:
            self.reread = True  # not a cached read next time: it may not hold what we met
            if sent.update.whole:  # written since the view this process kept: read it for a while
                self.memory.seen_foreign(HOT_SECONDS)
            else:
                self.memory.heat(HOT_SECONDS)  # another node wrote this pool meanwhile
            raise

    # ---- deciding ---------------------------------------------------------------------------------

    def decide_batch(
        self, rng: IPRange, lock: nodelock.Held | None, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass, bool]:
        """Decide the batch on the first of the pool's SOURCES that serves it: (the view decided on, the
        pass, whether the view is the one this process kept). A source that is not there is skipped; a
        pass on one that may lack newer writes (`_lacking`: stopped stale, an ADD failed on it, a DEL
        found nothing) is undone and the batch decided on the next; `stored` is final.

        - `kept`: the pool as this process' last write left it (Memory.view: the agent, while no other
          holder of the node lock wrote since), for DELs, and for ADDs while no other node raced this one
          on the pool and no foreign write was seen lately: an ADD must see every entry of its pod, also
          one written outside this node's lock (upstream whereabouts during a migration), so a write
          with ADDs decided on it needs the whole pool still at its version. The pass stops at the first
          candidate whose reservation is newer than the snapshot (stale: no lost race); when it lacks,
          `cached` is skipped.
        - `cached`: the pool read at least as new as this process' last write of it (Memory.floor: a
          server's cache holds that write); not after a failed write (`reread`), nor without a floor (a
          plugin process).
        - `stored`: the pool as stored.
        Each op keeps the reservations it made whatever the source."""
        before = [op.claims.lost for op in pending]  # (every op pending: step)
        tried = False
        for source in SOURCES:
            view = self._read(source, rng, lock, pending, hot, tried)
            if view is None:
                continue
            tried = True
            view, got = self._decide_on(source, rng, view, [op for op in pending if not op.done], hot)
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
        self, source: str, rng: IPRange, lock: nodelock.Held | None, pending: list[Op], hot: bool | None,
        tried: bool,
    ) -> PoolView | None:  # fmt: skip
        """The pool from `source` (decide_batch), or None when that source is not there."""
        if source == KEPT:
            pool = self.memory.view(lock) if _trusts_snapshot(self.memory, pending, hot) else None
            return None if pool is None or not same_network(pool.range, rng) else SnapshotView(pool)
        if source == CACHED:
            floor = "" if self.reread or tried else self.memory.floor
            return self.e.view(rng, floor) if floor else None
        return self.e.view(rng)

    def _decide_on(
        self, source: str, rng: IPRange, view: PoolView, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass]:
        """Decide on `view`: the view decided on and the pass. On a pool other nodes write too (`hot`)
        and a store that checks whole versions, when the pass on a read created reservations: decided
        again on the pool read again if it moved meanwhile (module docstring)."""
        got = self.decide_all(view, pending, hot, snapshot=source == KEPT)
        if source != KEPT and hot and got.claimed and not self.e.store.merges:
            again = self.e.view(rng)
            if again.version != view.version:
                undecide(pending)
                return again, self.decide_all(again, [op for op in pending if not op.done], hot)
        return view, got

    def decide_all(
        self, view: PoolView, pending: list[Op], hot: bool | None, snapshot: bool = False,
        changes: Changes | None = None,
    ) -> Pass:  # fmt: skip
        """Decide every op on `view` (after the decisions already in `changes`, if given). An op's own
        failure is final for it. On the node's `snapshot`, the pass stops as soon as a candidate's
        reservation shows the snapshot out of date (Pass.stale: decide on the pool as stored)."""
        done = Pass(changes if changes is not None else Changes(view))
        created = sum(len(op.claims.created) for op in pending)
        for op in pending:
            try:
                if op.kind == "del":  # the entries as stored (reservations follow them)
                    freed = decide.one(done.changes, decide.Del(op.owner), ())
                    assert isinstance(freed, decide.Freed)
                    op.freed = freed.offsets
                elif not self._decide_add(op, done.changes, hot, snapshot):
                    done.stale = True
                    break
            except (StoreUnavailable, Conflict):
                raise
            except CniError as e:  # this op's own failure (pool exhausted, candidates keep going)
                op.to(operation.FAILED, e)
                continue
            op.to(operation.DECIDED)
            done.decided.append(op)
        done.claimed = sum(len(op.claims.created) for op in pending) > created
        return done

    def _decide_add(
        self, op: Op, changes: Changes, hot: bool | None = None, snapshot: bool = False
    ) -> bool:
        """Decide an ADD through the core (ipam.decide) until it needs no claim that is refused: each
        refused claim blocks that offset and the core decides again (a lost race: the batch's other ops
        keep off it too). False, undecided: on the node's `snapshot`, a candidate reserved by a racer
        after it was taken (the snapshot is stale). Its own failure (the pool full, a requested address
        taken, candidates taken again and again) is raised."""
        segments = allocator.segments_as_offsets(op.rng)
        while True:
            outcome = decide.add(changes, self._wanted(op, hot, segments), segments)
            decision = allocator.decision(op.rng, changes, op.owner, outcome)  # full, or a request refused
            assert isinstance(outcome, decide.Took)  # (decision() raised for any other)
            if outcome.claim:
                lost, blocked = op.claims.lost, len(op.claims.blocked)
                name = self.e.reservation_name(op.rng, decision.offset)
                if name not in op.claims.mine:  # (else kept: no request)
                    reservations.note_claim(self.lock, name, decision.offset, op.owner)
                if not self.e.reservations.claim(op, decision, changes.version):
                    if snapshot and op.claims.lost > lost and op.want is None:
                        return False  # reserved after the snapshot was taken: read the pool
                    self._refused(op, changes, decision.offset, lost, blocked)
                    continue
                faults.point("store-reserve")  # tests: the address reserved, the pool not yet written
            decide.apply(changes, outcome, op.owner, self.e.lean_for(op))
            op.offsets = [decision.offset]
            return True

    def _wanted(self, op: Op, hot: bool | None, segments: list[tuple[int, int]]) -> decide.Add:
        """What the core is asked for an ADD: the lowest free address; after a race lost (a candidate
        another writer of this network reserved first), and on a pool other nodes are racing on (`hot`:
        the agent's memory), the lowest free after a random point of the range, so the writers stop
        meeting on the same few lowest addresses. Stores that serialise writers (exclusive()) never
        lose races."""
        scatter = not self.e.store.serial and (hot is True or op.claims.lost > 0)
        if op.want is not None and op.want in op.claims.holders:  # refused by its reservation before
            raise allocator.taken(op.rng, op.want, op.claims.holders[op.want],
                                  f"reservation {self.e.reservation_name(op.rng, op.want)}")  # fmt: skip
        return decide.Add(
            op.owner, tuple(sorted(op.claims.mine.values())), frozenset(op.claims.blocked),
            claims=op.overlapping, start=decide.scatter(segments, self.e.retry.rand()) if scatter else None,
            want=op.want,
        )  # fmt: skip

    def _refused(self, op: Op, changes: Changes, offset: int, lost: int, blocked: int) -> None:
        """A claim of `offset` refused (Reservations.claim): progress when it was a race lost (the
        batch's other ops keep off it too) or an address held for good (one fewer to walk); the op gives
        up once none is made for the retry policy's deadline, or its limit is reached."""
        if op.want is not None and op.want in op.claims.holders:  # reserved for another attachment
            name = self.e.reservation_name(op.rng, op.want)
            raise allocator.taken(op.rng, op.want, op.claims.holders[op.want], f"reservation {name}")
        if op.claims.lost > lost:
            op.started = self.e.retry.clock()  # lost to a racer: progress elsewhere
            changes.hold(offset)  # and no other op of this batch tries it again
        elif len(op.claims.blocked) > blocked:  # held for good (another network): one
            op.started = self.e.retry.clock()  # address fewer to walk, a bounded walk
        now = self.e.retry.clock()
        if now - op.started > self.e.retry.deadline or now - op.begun > self.e.retry.limit:
            raise TryAgainError(
                f"allocating in {op.rng.cidr}: gave up: candidates keep being taken elsewhere"
            )


def undecide(ops: list[Op], failed: bool = False) -> None:
    """The decisions of `ops` void (their view was stale, or an attempt failed): pending again; with
    `failed`, also the failures met on that view."""
    for op in ops:
        if op.state == operation.DECIDED or (failed and op.state == operation.FAILED):
            op.to(operation.PENDING)


def _trusts_snapshot(memory: Memory, pending: list[Op], hot: bool | None) -> bool:
    """Whether the batch may start from the process' snapshot (Attempt.decide_batch)."""
    adds = any(op.kind == "add" for op in pending)
    shared = memory.last is not None and memory.last.shared  # other nodes' writes outdate it at once
    return memory.kept and (not adds or (not hot and not memory.foreign() and not shared))


def _failed_add(pending: list[Op]) -> bool:
    return any(op.kind == "add" and op.state == operation.FAILED for op in pending)


def _lacking(got: Pass, pending: list[Op]) -> bool:
    """The view a pass decided on may lack newer writes: it stopped stale, an ADD failed on it, or a DEL
    found nothing on it."""
    return got.stale or _failed_add(pending) or any(op.kind == "del" and not op.freed for op in got.decided)
