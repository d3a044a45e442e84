"""One attempt at a batch of one pool, whatever the execution mode: under the node lock, every op not yet
done decided in turn through the core (ipam.decide) on a view of the pool, then one write, begun under the
lock and awaited after it. ipam.retry runs attempts until one writes; each op's state
(ipam.operation.Op.to) says where it is. The two execution modes (a plugin process: ipam.exec_plain; the
agent: ipam.batch) differ in what they pass: the read policy (`Reads`: where the view comes from and
what is noted of the outcome) and whether the batch releases its DELs' reservations itself.

A plugin process reads the pool as stored for every attempt and remembers nothing (`Stored`); the agent
decides on what it remembers of the pool when that is safe (ipam.agentreads). A write may wait for other
nodes' writes (a shared pool's turn, ipam.turn: Store.post_pool): it is begun under the node lock and
awaited after it, so the node's next writers decide meanwhile."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from cni import faults, log
from cni.errors import CniError, TryAgainError
from ipam import allocator, decide, nodelock, operation, reservations
from ipam.decide import Changes
from ipam.model import PoolUpdate, PoolView
from ipam.operation import Op
from ipam.ranges import IPRange
from ipam.retry import retrying
from ipam.store.base import Conflict, StoreUnavailable

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
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

    class Reads(Protocol):
        """An attempt's read policy: where its view of the pool comes from, and what it notes of how its
        decisions and writes went (`Stored`: a plugin process; ipam.agentreads.Remembered: the agent)."""

        def hot(self) -> bool | None:
            """Whether other nodes race this one on the pool; None: not known."""
            ...

        def exclusive(self) -> AbstractContextManager[object]:
            """Held around the node lock and the decisions (the agent: one batch of a pool at a time)."""
            ...

        def decide(
            self, attempt: Attempt, rng: IPRange, lock: nodelock.Held | None, pending: list[Op],
            hot: bool | None,
        ) -> tuple[PoolView, Pass, bool]:  # fmt: skip
            """The batch decided (attempt.decide_all) on a view: (the view, the pass, whether the view is
            a snapshot that may miss others' writes: a write with ADDs decided on it checks the whole
            pool's version)."""
            ...

        def raced(self) -> None:
            """Races were lost to other writers while deciding."""
            ...

        def conflicted(self, whole: bool) -> None:
            """The write was refused (another writer won)."""
            ...

        def sending(self, sent: Sent) -> AbstractContextManager[None]:
            """Held while the write of `sent` is awaited (outside the node lock)."""
            ...

        def wrote(self, attempt: Attempt, lock: nodelock.Held | None, version: str) -> None:
            """The write is done: the pool is at `version`."""
            ...


class Stored:
    """A plugin process' read policy (`Reads`): the pool as stored for every attempt, nothing kept."""

    def hot(self) -> bool | None:
        return None

    def exclusive(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()

    def decide(
        self, attempt: Attempt, rng: IPRange, lock: nodelock.Held | None, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass, bool]:  # fmt: skip
        view = attempt.e.view(rng)
        return view, attempt.decide_all(view, pending, hot), False

    def raced(self) -> None:
        return None

    def conflicted(self, whole: bool) -> None:
        return None

    def sending(self, sent: Sent) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wrote(self, attempt: Attempt, lock: nodelock.Held | None, version: str) -> None:
        return None


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
    """Attempts at the batch `ops` of pool `name` until one writes (`run`); `ops` is the batch's list.
    `reads`: the read policy (`Stored` unless given); `releases`: the batch releases its DELs'
    reservations itself and counts them written only then (the agent)."""

    def __init__(
        self, engine: Access, name: str, ops: list[Op], reads: Reads | None = None, releases: bool = False
    ) -> None:  # fmt: skip
        self.e, self.name, self.ops = engine, name, ops
        self.reads: Reads = reads if reads is not None else Stored()
        self.releases = releases
        self.lock: nodelock.Held | None = None  # the node lock of the attempt under way (its notes)

    def run(self) -> None:
        kind = "allocating" if self.ops[0].kind == "add" else "releasing"
        retrying(self.e.retry, f"{kind} in {self.ops[0].rng.cidr}", self.step)

    def step(self) -> None:
        """One read-modify-write of the pool for every op of the batch not yet done: each decided in
        turn against the pool plus the decisions before it, then one write, begun under the node lock
        and awaited after it. A Conflict on the write leaves every op pending (the retry reads the pool
        again; reservations already made are kept)."""
        pending = [op for op in self.ops if not op.done]
        if not pending:
            return
        undecide(pending)  # an attempt before this one failed: its decisions are void
        with self.reads.exclusive(), self.e.atomic(self.name, pending[0].owner.node) as lock:
            sent = self._locked(lock, pending)
        with self.reads.sending(sent):
            self._written(sent)

    def _locked(self, lock: nodelock.Held | None, pending: list[Op]) -> Sent:
        self.lock = lock
        if lock is not None:  # what a holder that died left (ipam.reservations); this call's claims noted
            if lock.left:
                reservations.free_left(self.e.reservations, lambda: self.e.view(pending[0].rng), lock)
            for op in pending:
                for name, offset in op.claims.mine.items():
                    reservations.note_claim(lock, name, offset, op.owner)
                for name, offset in op.claims.maybe.items():  # created unanswered: they may exist
                    reservations.note_claim(lock, name, offset, op.owner)
        lost = sum(op.claims.lost for op in pending)
        view, got, snapshot = self.reads.decide(self, pending[0].rng, lock, pending, self.reads.hot())
        if sum(op.claims.lost for op in pending) > lost:
            self.reads.raced()
        return self._send(view, got.changes, snapshot, got.decided, lock)

    def _send(
        self, view: PoolView, changes: Changes, snapshot: bool, decided: list[Op], lock: nodelock.Held | None
    ) -> Sent:  # fmt: skip
        """The batch's one write begun (none when it changes nothing): written at once, or waiting."""
        update = changes.update()
        whole = snapshot and any(op.kind == "add" for op in decided)
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
        if sent.version is not None:
            self.reads.wrote(self, sent.lock, sent.version)
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
            self.reads.conflicted(sent.update.whole)
            raise

    # ---- deciding ---------------------------------------------------------------------------------

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
        after it was taken (the snapshot is stale). Its own failure (the pool full, or too large for its
        store to take a new entry, a requested address taken, candidates taken again and again) is
        raised."""
        segments = allocator.segments_as_offsets(op.rng)
        while True:
            outcome = decide.add(changes, self._wanted(op, hot, segments), segments)
            decision = allocator.decision(op.rng, changes, op.owner, outcome)  # full, or a request refused
            assert isinstance(outcome, decide.Took)  # (decision() raised for any other)
            if outcome.kind == "new":  # the pool grows: within what its store holds (before any claim)
                entry = op.owner.bare() if self.e.lean_for(op) else op.owner
                self.e.store.admit(changes, entry, len(changes.put))
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
