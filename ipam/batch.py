"""The agent's execution mode: several IPAM operations (ipam.operation) on one pool in one
read-modify-write. (A plugin process runs its own call: ipam.exec_plain.)

`run`: a call's ops go to their pool's `Combiner`, one per pool in the agent. The agent's threads queue
their ops on it and the pool's batch thread runs them: a batch takes everything queued when it starts
(at most MAX_BATCH), which is every call that arrived while the previous write was in flight, decides it
on one view and writes it once. N concurrent calls on one pool then cost one pool write instead of N
racing ones, with no timer: a batch starts as soon as the previous one is written. The batch thread
attempts each batch (ipam.attempt) with a store handle of its own and the pool's memory
(ipam.attempt.Memory); a DEL's reservations are released in the batch, after its write. Each caller
returns once its ops are written (a DEL: and released) or failed, never before: an answered ADD's pool
entry exists.

Unless its config opts in (`answer_before_write`, `answer_early`): the caller's thread decides its ops on
the pool as the last batch wrote it plus the ops answered and not yet written (`unwritten`), one caller
of the pool at a time; an ADD claims its reservation, and the call returns. Its op, pinned to its
address, goes to the queue, and a batch writes it with the others. Deciding does not wait for the write
in flight, so a batch holds what arrived during the previous one. An op that fails after its answer is
logged as an error; its reservation stays (the address is held, never handed out twice)."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading would cost every call
import time
from collections.abc import Callable, Hashable, Sequence

from cni import faults, log, metrics
from cni.errors import CniError, TryAgainError
from ipam import decide
from ipam.allocator import SnapshotView
from ipam.attempt import HOT_SECONDS, Attempt, Memory, undecide
from ipam.decide import Changes
from ipam.operation import DECIDED, FAILED, WRITTEN, Op
from ipam.ranges import same_network
from ipam.store.base import Conflict, StoreUnavailable

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    import contextlib
    from typing import Protocol

    from ipam.attempt import Access
    from ipam.config import IpamConfig
    from ipam.ranges import IPRange
    from ipam.store.base import Store

    class Shared(Access, Protocol):
        """What the agent's executor uses of the engine besides the attempt's part (Engine is one)."""

        conf: IpamConfig
        identity: str
        reopen: Callable[[], contextlib.AbstractContextManager[Store]] | None

        def pool_name(self, rng: IPRange) -> str: ...
        def release(self, op: Op) -> None: ...
        def on(self, store: Store) -> Shared: ...


MAX_BATCH = 128  # operations in one pool write (bounds a write's size and its retry cost)


class Unanswered(TryAgainError):
    """A caller of a combiner waited its whole budget: code 11. `held`: an op of the call is still in a
    batch under way, which owns it (and its claims) until that batch ends."""

    def __init__(self, msg: str, held: bool) -> None:
        super().__init__(msg)
        self.held = held


class Combiner:
    """One per pool (and store) in the agent; see the module docstring. Batches run in a thread of the
    combiner's own, started by the call that finds none running and ending when the queue is empty. The
    agent's call threads take their caller's network namespace and directory; the batch thread enters
    the agent's own (`share(home=...)`, opened at its start-up) before it runs anything, so the store is
    reached from the agent's namespace whichever call started it. The `execute` a caller passes opens
    its own store handle (a caller may go back to other work while the batch still runs others)."""

    def __init__(self) -> None:
        import threading  # the agent only: plugin processes have no combiner

        self._cv = threading.Condition(threading.Lock())
        self._queue: list[Op] = []
        self._running = False  # a batch thread is on (it ends when the queue is empty)
        self._execute_fn: Callable[[list[Op]], None] | None = None
        self.memory: Memory | None = None  # what the pool's batches remember between them (kept())
        self.deciding = threading.Lock()  # answer_early: one caller of the pool decides at a time
        self.unwritten: list[Op] = []  # answered early, not yet written or failed (under `deciding`)

    def kept(self) -> Memory:
        """What the pool's batches (and answer_early) remember of it, made on first use."""
        if self.memory is None:
            self.memory = Memory(kept=True)
        return self.memory

    def pending(self) -> int:
        """Operations queued and not yet taken into a batch."""
        with self._cv:
            return len(self._queue)

    def run(self, ops: Sequence[Op], execute: Callable[[list[Op]], None], wait: float = 300.0) -> None:
        """Queue `ops` and wait until they are done (written or failed), at most `wait` seconds (then
        Unanswered). `execute` must leave every op of its batch done or raise; a raised error becomes
        the error of every op of the batch not yet done. Every batch runs with the `execute` of its
        latest caller (each opens its own store handle; what differs between callers is on the ops)."""
        cv = self._cv
        deadline = time.monotonic() + wait
        with cv:
            self._queue.extend(ops)
            self._execute_fn = execute
            if not self._running:
                self._start()
            while not all(op.done for op in ops):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._give_up(ops, wait)
                cv.wait(left)

    def hand_over(self, ops: Sequence[Op], execute: Callable[[list[Op]], None]) -> None:
        """Queue ops already answered (answer_early) for a batch to write, without waiting."""
        with self._cv:
            self._queue.extend(ops)
            self._execute_fn = execute
            if not self._running:
                self._start()

    def _start(self) -> None:
        """A batch thread (under the condition's lock, no thread running)."""
        import threading

        self._running = True
        threading.Thread(target=self._batches, name="pool-batch", daemon=True).start()

    def _give_up(self, ops: Sequence[Op], wait: float) -> None:
        """A caller waited `wait` seconds (under the condition's lock): its ops still queued are withdrawn
        and it gets code 11; an op a batch holds stays that batch's (Unanswered says so)."""
        queued = [op for op in self._queue if any(op is o for o in ops)]
        self._queue = [op for op in self._queue if not any(op is o for o in ops)]
        taken = len([op for op in ops if not op.done]) - len(queued)
        raise Unanswered(f"the pool's batch did not answer within {wait:g}s", held=taken > 0)

    def _batches(self) -> None:
        """The combiner's batch thread: batches until the queue is empty, at home (`share`). Whatever
        goes wrong in it, the thread ends with `_running` cleared and what it held failed with the
        error (never a caller waiting for a thread that is gone); ops still queued get a new thread."""
        cv = self._cv
        held: list[Op] = []
        try:
            enter_home()
        except OSError as e:  # nothing run yet: every queued op fails with it, said in the log
            log.error("pool batch: cannot enter the agent's namespace and directory: %s", e.strerror)
            with cv:
                held, self._queue = self._queue, []
            self._end(held, e, restart=False)
            return
        try:
            while True:
                with cv:
                    if not self._queue:
                        self._running = False
                        cv.notify_all()
                        return
                    execute = self._execute_fn
                    held, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                faults.point("batch-take")
                if execute is not None:
                    self._execute(held, execute)
                self._prune()
                faults.point("batch-done")
                held = []
                with cv:
                    cv.notify_all()
        except BaseException as e:  # a bug in the bookkeeping: logged once, with its traceback
            log.error("pool batch failed: %r\n%s", e, log.traceback_text())
            self._end(held, e, restart=True)

    @staticmethod
    def _execute(held: list[Op], execute: Callable[[list[Op]], None]) -> None:
        try:
            execute(held)
        except Exception as e:
            for op in held:
                if not op.done:
                    op.to(FAILED, e)
        finally:  # each op runs in one batch: count its races lost once, when it is over
            metrics.conflict("reservation", sum(op.claims.lost for op in held))
            _failed_after_answer(held)

    def _end(self, held: list[Op], error: BaseException, restart: bool) -> None:
        """The batch thread is ending on `error`: the ops it held fail with it (code 11 unless it is a
        CNI error of its own), `_running` is cleared and the waiting callers woken; with `restart`, ops
        still queued get a new batch thread."""
        cause = error if isinstance(error, CniError) else TryAgainError(f"pool batch failed: {error!r}")
        with self._cv:
            try:
                for op in held:
                    if not op.done:
                        op.to(FAILED, cause)
                _failed_after_answer(held)
            finally:
                self._prune()
                self._running = False
                if restart and self._queue:
                    self._start()
                self._cv.notify_all()

    def _prune(self) -> None:
        """The ops answered early that are done leave `unwritten`."""
        with self.deciding:
            self.unwritten = [op for op in self.unwritten if not op.done]

    def settle(self, timeout: float) -> bool:
        """Wait until no batch runs and none is queued (the agent stopping); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._running or self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True


def _failed_after_answer(held: list[Op]) -> None:
    """An op answered before its write (answer_before_write) that then failed: its caller is gone, so
    the log says it (an ADD: the address its pod uses has no pool entry; its reservation holds it)."""
    for op in held:
        if op.answered and op.state == FAILED:
            what = op.rng.address(op.offsets[0]) if op.kind == "add" and op.offsets else op.rng.cidr
            log.error("%s %s %s: answered before its pool write, which then failed: %s", op.kind.upper(),
                      op.owner.container_id, what, op.error)  # fmt: skip


def enter_home() -> None:
    """This thread into the agent's own network namespace and working directory (`share(home=...)`;
    nothing without one): its own filesystem context first (unshare CLONE_FS), so that fchdir moves this
    thread alone, as cni.agent.server enter_caller does for a call thread."""
    fds = _Registry.home
    if fds is None:
        return
    import os  # (the agent only)

    net, cwd = fds
    os.unshare(os.CLONE_FS)
    os.fchdir(cwd)
    os.setns(net, os.CLONE_NEWNET)


class _Registry:
    enabled = False
    home: tuple[int, int] | None = None  # the agent's network namespace and cwd, as open descriptors
    lock = _thread.allocate_lock()
    combiners: dict[Hashable, Combiner] = {}


def share(enabled: bool = True, home: tuple[int, int] | None = None) -> None:
    """The agent turns this on once: concurrent calls of the process on one pool then share writes
    (Combiner); `home`: open descriptors of the agent's network namespace and working directory, which
    batch threads enter."""
    _Registry.enabled = enabled
    _Registry.home = home if enabled else None
    if not enabled:
        with _Registry.lock:
            _Registry.combiners.clear()


def sharing() -> bool:
    """Whether this process shares writes between its threads (the agent)."""
    return _Registry.enabled


def combiner(key: Hashable) -> Combiner:
    """The process' combiner for `key` (the agent: sharing)."""
    with _Registry.lock:
        found = _Registry.combiners.get(key)
        if found is None:
            found = _Registry.combiners[key] = Combiner()
        return found


def settle_all(timeout: float = 30.0) -> bool:
    """Every combiner of the process settled (Combiner.settle: the agent, before it exits, lets the
    batches under way and queued end). False if one did not within `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    with _Registry.lock:
        combiners = list(_Registry.combiners.values())
    return all(c.settle(max(0.0, deadline - time.monotonic())) for c in combiners)


# ---- the agent's execution mode: a call's ops through its pool's combiner ------------------------------


def run(engine: Shared, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) through the pool's combiner; each op's error is left on it.
    A call waits for a batch under way and its own, each bounded by the retry limit."""
    name = engine.pool_name(ops[0].rng)
    comb = combiner((engine.identity, name))
    execute = _executor(engine, name, comb)
    if all(op.early and op.overlapping for op in ops) and answer_early(engine, name, comb, ops, execute):
        return
    comb.run(ops, execute, 2 * engine.retry.limit)


def answer_early(
    engine: Shared, name: str, comb: Combiner, ops: list[Op], execute: Callable[[list[Op]], None]
) -> bool:
    """answer_before_write (module docstring): decide `ops` in the caller's thread on the pool as the
    last batch wrote it (else as read) plus the ops answered and not yet written, an ADD with its
    reservation claimed; answered ones go to the queue pinned to their address. True when the call is
    done (answered, or failed with an op's own error); False: through a batch as usual (a DEL that found
    nothing, where the stored pool decides; the store did not answer)."""
    rng = ops[0].rng
    with comb.deciding:
        memory, lost = comb.kept(), sum(op.claims.lost for op in ops)
        last = memory.last
        try:
            fits = last is not None and same_network(last.range, rng)
            view = SnapshotView(last) if last is not None and fits else engine.view(rng)
            changes = Changes(view)
            for op in comb.unwritten:
                _replay(engine, changes, op)
            got = Attempt(engine, name, ops, memory).decide_all(view, ops, memory.hot(), changes=changes)
        except (StoreUnavailable, Conflict):
            undecide(ops, failed=True)
            return False
        finally:
            if sum(op.claims.lost for op in ops) > lost:  # races lost to other nodes: scatter at once
                memory.heat(HOT_SECONDS)
        if any(op.kind == "del" and not op.freed for op in got.decided):
            undecide(ops)
            return False
        if any(op.state == FAILED for op in ops):
            return True
        for op in ops:
            if op.kind == "add":
                op.want = op.offsets[0]  # decided again after a lost write, it gets exactly this or fails
            op.answered = True
        comb.unwritten += ops
    comb.hand_over(ops, execute)
    return True


def _replay(engine: Shared, changes: Changes, op: Op) -> None:
    """An op answered and not yet written, on `changes` as its write will make it (its pinned address;
    nothing when the view already holds it)."""
    if op.kind == "del":
        decide.one(changes, decide.Del(op.owner), ())
        return
    outcome = decide.add(changes, decide.Add(op.owner, want=op.offsets[0]), [(op.offsets[0], op.offsets[0])])
    if isinstance(outcome, decide.Took):
        decide.apply(changes, outcome, op.owner, engine.lean_for(op))


def _executor(engine: Shared, name: str, comb: Combiner) -> Callable[[list[Op]], None]:
    """A batch as the combiner's thread runs it: with a store handle of its own (the callers' may be
    back at work elsewhere) and the pool's memory."""
    conf, reopen = engine.conf, engine.reopen

    def execute(group: list[Op]) -> None:
        from ipam.store.handles import BATCH, store_for

        with reopen() if reopen is not None else store_for(conf.store, BATCH) as store:
            e = engine.on(store)
            Attempt(e, name, group, comb.kept(), releases=True).run()
            _release_freed(e, group)

    return execute


def _release_freed(engine: Shared, group: list[Op]) -> None:
    """The batch's DELs release their reservations before the batch ends: its callers then return
    together and their next calls meet in the next batch. An op's failure is its own."""
    for op in group:
        if op.kind == "del" and op.state == DECIDED:
            try:
                engine.release(op)
            except CniError as e:
                op.to(FAILED, e)
                continue
            op.to(WRITTEN)
