"""Several IPAM operations on one pool in one read-modify-write: the pieces ipam.engine batches with.

- `Op`: one attachment's ADD or DEL in one range, with what it has claimed so far, and where it is in its
  batch: `state`, one of pending -> decided -> answered -> written | failed, changed only by `Op.to`,
  which refuses a transition TRANSITIONS does not list. `done` once written or failed.
- `BatchView`: a PoolView over the stored pool plus the changes decided earlier in the same batch, so
  two operations of one batch never pick the same address, and one write commits them all.
- `Combiner`: flat combining across the threads of one process (the node-local agent). Each thread
  queues its operations on the pool's combiner and takes the combiner's lock; whoever holds it runs
  everything queued so far as one batch, so N concurrent calls on one pool cost one pool write instead
  of N racing ones, and their threads return as soon as a batch holding their operation is done. A
  plugin process has one operation: its batch is just that one (`Combiner.run` without sharing).
- Deferred writes (the agent, `share(defer=...)`, on a store whose reservations are authoritative: the
  engine decides): the thread running a batch answers each op as soon as it is decided (an ADD's
  address reserved cluster-wide, a DEL's entries found), keeps deciding the calls that arrive for
  `defer` seconds more, each answered at once, and then writes them all in one pool write. A node's
  pods go on to their next attachment meanwhile, so one write carries many of them: fewer writes of
  a shared pool, which the API server pays for by the pool's size, and fewer of them overlapping."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading would cost every call
import time
from collections.abc import Callable, Hashable, Sequence

from cni import faults, log, metrics
from cni.errors import CniError, TryAgainError
from cni.types.valueclass import field, valueclass
from ipam.decide import Changes
from ipam.model import Allocation
from ipam.ranges import IPRange

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

MAX_BATCH = 128  # operations in one pool write (bounds a write's size and its retry cost)
DEFER = 0.5  # the agent: seconds a batch keeps deciding (and answering) arrivals before its one write
WINDOW_PER_WRITE = 5.0  # a longer window after a slow write: this many times as long as it took
DEFER_MAX = 5.0  # seconds: the longest window
IDLE = 0.5  # seconds without an arrival that end a window early (its calls written without waiting)
REWRITES = 3  # batches an answered op whose write or release failed is taken into again (_owed)
PACE = 1.0  # the agent's combiners: wait as long as the previous write took before the next (Combiner)
PACE_MAX = 2.0  # seconds: the longest such wait (only writes slower than this reach it: huge pools)


PENDING, DECIDED, ANSWERED, WRITTEN, FAILED = "pending", "decided", "answered", "written", "failed"
FINAL = (WRITTEN, FAILED)
TRANSITIONS: dict[str, tuple[str, ...]] = {
    # decided on the batch's view; or its own error (pool full, request refused, store out of reach)
    PENDING: (DECIDED, FAILED),
    # answered before its write (deferred writes); written; its batch failed; or its decision dropped
    # (a stale snapshot, a write lost to a racer, an arrival put back in the queue): decided again
    DECIDED: (ANSWERED, WRITTEN, FAILED, PENDING),
    # its write: done, failed (the batch's error, or a DEL's reservation release), or lost to a racer
    # and retried (the op then decided again on the address it was answered with)
    ANSWERED: (WRITTEN, FAILED, PENDING),
    WRITTEN: (),
    # taken back: an answered op whose batch failed (_owed, REWRITES times at most), another process'
    # op handed back to the node queue, a failure met on a snapshot found stale
    FAILED: (PENDING,),
}


class IllegalTransition(RuntimeError):
    """An op moved between states TRANSITIONS does not connect: a bug in the batch's executor."""


class Unanswered(TryAgainError):
    """A caller of a deferring combiner waited its whole budget: code 11. `held`: an op of the call is
    still in a batch under way, which owns it (and its claims) until that batch ends."""

    def __init__(self, msg: str, held: bool) -> None:
        super().__init__(msg)
        self.held = held


@valueclass(frozen=False)
class Claims:
    blocked: set[int] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)  # reservations made by this op: name -> version
    mine: dict[str, int] = field(default_factory=dict)  # their offsets: name -> offset
    lost: int = 0  # candidates found reserved by someone else on this network
    holders: dict[int, Allocation] = field(default_factory=dict)  # blocked offsets: who reserved them


@valueclass(frozen=False)
class Op:
    kind: str  # "add" | "del"
    rng: IPRange
    owner: Allocation
    overlapping: bool
    claims: Claims = field(default_factory=Claims)
    offsets: list[int] = field(default_factory=list)  # add: [the address]
    want: int | None = None  # add: the requested address (ipam.requested): exactly it, or an error
    freed: list[tuple[int, Allocation]] = field(default_factory=list)  # del: offsets and entries freed
    # del: entries a write whose answer was lost (it may have been applied) freed: released after the
    # batch's write like `freed`, though the retry may no longer find them in the pool
    sent: list[tuple[int, Allocation]] = field(default_factory=list)
    known: dict[str, str] = field(default_factory=dict)  # del: versions of the freed reservations, if known
    rewrites: int = 0  # answered, its batch failed: how many batches it went back to the queue for
    begun: float = 0.0  # when the op started
    started: float = 0.0  # when it last saw progress (its start, or a race lost to another writer)
    error: BaseException | None = None  # set with FAILED (Op.to), cleared when taken back
    state: str = "pending"  # PENDING ... FAILED: changed by `to` alone
    told: bool = False  # its caller was answered before its write (entered ANSWERED once; set by `to`)
    counted: bool = False  # told, and in the gauge of answered calls not yet written (_unwritten)

    @property
    def done(self) -> bool:
        """Written, or failed with its own error: final unless a rewrite takes it back (_owed)."""
        return self.state in FINAL

    def to(self, state: str, error: BaseException | None = None) -> None:
        """The one place an op changes state: refuses a transition TRANSITIONS does not list. FAILED
        takes the op's error; any other state clears it."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.kind} {self.owner.container_id}: {self.state} -> {state}")
        if (error is None) == (state == FAILED):
            raise IllegalTransition(f"{self.kind} {self.owner.container_id}: {state} with error {error!r}")
        self.state, self.error = state, error
        self.told = self.told or state == ANSWERED


BatchView = Changes  # the pool plus a batch's decisions (ipam.decide)


class Combiner:
    """One per pool (and store) in a process; see the module docstring.

    `pace` (the agent's: PACE): a batch starts no sooner than `pace` times the previous batch's duration
    after it ended (at most PACE_MAX seconds later). A write of a shared pool costs the API server CPU in
    proportion to the pool's size, and much more when writers of other nodes overlap it (the server redoes
    a write whose object changed under it): when writes are slow, the node waits as long again, so more
    operations join each write and the nodes' writes overlap less. When writes are fast the wait is as
    short as they are. A plugin process (one operation per batch) never waits.

    `defer` (the agent's: DEFER; 0: off): batches run in a thread of the combiner's own (a caller may
    return before its write, so the write must not need the caller's thread or its store handle: the
    `execute` a caller passes opens its own), started by the call that finds none running. The agent's
    call threads take their caller's network namespace and directory; the batch thread enters the
    agent's own (`share(home=...)`, opened at its start-up) before it runs anything, so the store is
    reached from the agent's namespace whichever call started it. Callers wait until their ops are
    answered (`answer`) or done; the batch's thread takes arrivals with `more`."""

    def __init__(self, pace: float = 0.0, defer: float = 0.0, idle: float | None = None) -> None:
        self._turn = _thread.allocate_lock()  # held by the thread running a batch
        self._queue_lock = _thread.allocate_lock()
        self._queue: list[Op] = []
        self.pace = pace
        self.defer = defer
        self.idle = idle  # None: IDLE
        self._closing = False  # the agent is stopping: windows end at once (close)
        self._took = self._ended = 0.0  # the previous batch: how long it ran, when it ended (monotonic)
        self._cv: Any = None
        self._running = False  # deferring: a batch thread is on (it ends when the queue is empty)
        self._finished = 0  # deferring: batches done (settle waits for those under way when it began)
        self._settling = 0  # deferring: threads waiting in settle (settling)
        self._write_s = 0.0  # deferring: how long the last pool write took
        self._execute_fn: Callable[[list[Op]], None] | None = None
        self.memory: Any = None  # what the pool's batches remember between them (ipam.attempt.Memory)
        if defer:
            import threading  # the agent only (plugin processes never defer): a cost per call

            self._cv = threading.Condition(threading.Lock())

    def pending(self) -> int:
        """Operations queued and not yet taken into a batch."""
        with self._queue_lock:
            return len(self._queue)

    def run(self, ops: Sequence[Op], execute: Callable[[list[Op]], None], wait: float = 300.0) -> None:
        """Queue `ops`, then run batches until they are done (answered, when deferring). `execute` must
        leave every op of its batch done or raise; a raised error becomes the error of every op of the
        batch not yet done. Deferring, a caller waits at most `wait` seconds (then Unanswered)."""
        if self.defer:
            return self._run_deferred(ops, execute, wait)
        with self._queue_lock:
            self._queue.extend(ops)
        while not all(op.done for op in ops):
            with self._turn:
                if all(op.done for op in ops):
                    return
                self._wait_pace()
                with self._queue_lock:
                    batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                if not batch:
                    continue
                self._execute(batch, ops, execute)
        return None

    def _wait_pace(self) -> None:
        if self.pace and self._took:
            gap = pace_gap(self._took, time.monotonic() - self._ended, self.pace)
            if gap > 0:
                time.sleep(gap)

    def _execute(self, batch: list[Op], ops: Sequence[Op], execute: Callable[[list[Op]], None]) -> None:
        began = time.monotonic()
        try:
            execute(batch)
        except BaseException as e:
            for op in batch:
                if not op.done:
                    if op.told:  # its caller has its answer: what it left undone is logged here
                        log.warning("%s %s: the pool write after its answer failed: %s",
                                    op.owner.container_id, op.owner.ifname, e)  # fmt: skip
                    op.to(FAILED, e)
            if any(op in ops for op in batch) and not isinstance(e, Exception):
                raise  # KeyboardInterrupt, SystemExit: this thread's own business
        finally:  # each op runs in one batch: count its races lost once, when it is over
            metrics.conflict("reservation", sum(op.claims.lost for op in batch))
            self._ended = time.monotonic()
            self._took = self._ended - began

    # ---- deferred writes (the agent) --------------------------------------------------------------

    def _run_deferred(self, ops: Sequence[Op], execute: Callable[[list[Op]], None], wait: float) -> None:
        cv = self._cv
        deadline = time.monotonic() + wait
        with cv:
            self._queue.extend(ops)
            self._execute_fn = execute  # the latest caller's: any will do, each opens its own handle
            if not self._running:
                self._start()
            cv.notify_all()  # a running batch may take them (more)
            while not all(op.done or op.told for op in ops):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._give_up(ops, wait)
                cv.wait(left)

    def _start(self) -> None:
        """A batch thread (under the condition's lock, no thread running)."""
        import threading  # (imported by __init__ already: deferring)

        self._running = True
        threading.Thread(target=self._batches, name="pool-batch", daemon=True).start()

    def _give_up(self, ops: Sequence[Op], wait: float) -> None:
        """A caller waited `wait` seconds (under the condition's lock): its ops still queued are withdrawn
        and it gets code 11; an op a batch holds stays that batch's (Unanswered says so)."""
        queued = [op for op in self._queue if any(op is o for o in ops)]
        self._queue = [op for op in self._queue if not any(op is o for o in ops)]
        taken = len([op for op in ops if not (op.done or op.told)]) - len(queued)
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
                    # no pacing: the window (defer) already spaces the writes, and calls that arrive while
                    # no window is open (a write or a wait in progress) would only wait longer
                    held, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                faults.point("batch-take")
                if execute is not None:
                    self._one(held, execute)
                held = []
                with cv:
                    self._finished += 1
                    cv.notify_all()
        except BaseException as e:  # a bug in the bookkeeping: logged once, with its traceback
            log.error("pool batch failed: %r\n%s", e, log.traceback_text())
            self._end(held, e, restart=True)

    def _one(self, held: list[Op], execute: Callable[[list[Op]], None]) -> None:
        """One batch on the batch thread; `held` grows by the arrivals it answered (all written or
        failed when it returns)."""
        try:
            self._execute(held, (), execute)
        finally:
            faults.point("batch-owed")
            owed = _owed(held)
            if owed:
                with self._cv:
                    self._queue[:0] = owed
            faults.point("batch-unwritten")
            _uncount(held)

    def _end(self, held: list[Op], error: BaseException, restart: bool) -> None:
        """The batch thread is ending on `error`: the ops it held fail with it (code 11 unless it is a
        CNI error of its own), `_running` is cleared and the waiting callers woken; with `restart`, ops
        still queued get a new batch thread."""
        cause = error if isinstance(error, CniError) else TryAgainError(f"pool batch failed: {error!r}")
        with self._cv:
            try:
                for op in held:
                    if op.done:
                        continue
                    if op.told:  # its caller has its answer: what is left undone is said in the log
                        log.warning("%s %s: the pool write after its answer failed: %s",
                                    op.owner.container_id, op.owner.ifname, cause)  # fmt: skip
                    op.to(FAILED, cause)
                try:
                    _uncount(held)  # (the count is kept before the metric is reported)
                except Exception as e:
                    log.error("pool batch: the unwritten-calls gauge: %r", e)
            finally:
                self._running = False
                self._finished += 1
                if restart and self._queue:
                    self._start()
                self._cv.notify_all()

    def wrote(self, seconds: float) -> None:
        """The batch's thread: its pool write took `seconds` (the next window is sized by it)."""
        self._write_s = seconds

    def window(self) -> float:
        """Seconds a batch answers arrivals before its write: `defer`, or longer when writes are slow
        (a large pool, a busy server): WINDOW_PER_WRITE times the last write, at most DEFER_MAX. A
        slow write costs the server in proportion to the pool's size, and its cost is paid again by
        every write of another node it overlaps: fewer, larger writes then."""
        return max(self.defer, min(WINDOW_PER_WRITE * self._write_s, DEFER_MAX))

    def lull(self) -> float:
        """Seconds without an arrival that end a window (`idle`, default IDLE)."""
        return IDLE if self.idle is None else self.idle

    def close(self) -> None:
        """The agent is stopping: a window under way ends now and no other opens, so what was answered
        is written at once, within the stop's budget (settle_all)."""
        if self._cv is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def answer(self, ops: Sequence[Op]) -> None:
        """The batch's thread: these ops are decided; their callers may return (deferring only). An op
        answered before (its batch failed and it was taken back: _owed) is answered again, not counted
        again."""
        if self._cv is None:
            return
        fresh = 0
        with self._cv:
            for op in ops:
                if op.state == DECIDED:
                    if not op.told:
                        op.counted = True
                        fresh += 1
                    op.to(ANSWERED)
            self._cv.notify_all()
        _unwritten(fresh)

    def more(self, room: int, timeout: float) -> list[Op]:
        """The batch's thread: ops queued since it began (waiting up to `timeout` s for one), at most
        `room` of them; none when not deferring."""
        if self._cv is None or room <= 0:
            return []
        deadline = time.monotonic() + timeout
        with self._cv:
            if self._closing:
                return []
            while not self._queue and not self._closing and (left := deadline - time.monotonic()) > 0:
                self._cv.wait(left)  # (woken by an arrival; a spurious wake-up waits on)
            taken, self._queue = self._queue[:room], self._queue[room:]
            return taken

    def requeue(self, ops: Sequence[Op]) -> None:
        """The batch's thread: ops it took with `more` but did not decide, back at the queue's head."""
        if ops and self._cv is not None:
            with self._cv:
                self._queue[:0] = ops
                self._cv.notify_all()

    def settle(self, timeout: float = 30.0, drain: bool = False) -> bool:
        """Wait until every op answered so far is written (or failed): the batch under way and the one
        after it (the queued ops') are done; a CHECK or GC reads the pool after this. `drain`: until
        no batch runs and none is queued (the agent stopping). False on timeout."""
        if self._cv is None:
            return True
        deadline = time.monotonic() + timeout
        with self._cv:
            target = self._finished + int(self._running) + int(bool(self._queue))
            while (self._running or self._queue) and (drain or self._finished < target):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._settling += 1
                try:
                    self._cv.wait(left)
                finally:
                    self._settling -= 1
        return True

    def settling(self) -> int:
        """Threads waiting in `settle` now (a CHECK or GC of the pool waiting for its answered calls to
        be written): what a test waits for before it lets a held write go."""
        if self._cv is None:
            return 0
        with self._cv:
            return self._settling


def _owed(batch: Sequence[Op]) -> list[Op]:
    """The ops of a finished batch whose callers were answered but whose write or reservation release
    failed (an answer says the pool will follow): back to the queue for the next batch, at most
    REWRITES times each, then given up and said in the log (the reconciler, GC or the pod's next DEL
    frees what is left)."""
    owed = []
    for op in batch:
        if not op.told or op.state != FAILED:
            continue
        if op.rewrites >= REWRITES:
            log.error("%s %s: %s in %s: given up after %d more batches: %s", op.owner.container_id,
                      op.owner.ifname, op.kind.upper(), op.rng.cidr, op.rewrites, op.error)  # fmt: skip
            continue
        op.rewrites += 1  # (its next batch reads the pool as stored: rewrites > 0)
        op.to(PENDING)
        op.sent += [f for f in op.freed if f not in op.sent]  # the next batch may find them gone
        owed.append(op)
    return owed


def pace_gap(took: float, since: float, pace: float = PACE, longest: float = PACE_MAX) -> float:
    """Seconds to wait before the next write of a pool, the previous one having taken `took` and ended
    `since` seconds ago: `pace` times its duration after its end, at most `longest` (<= 0: none). The
    agent's combiners and plugin processes holding the node lock (ipam.engine) pace alike."""
    return min(took * pace, longest) - since


def enter_home() -> None:
    """This thread into the agent's own network namespace and working directory (`share(home=...)`;
    nothing without one): its own filesystem context first (unshare CLONE_FS), so that fchdir moves this
    thread alone, as cni.agent.server enter_caller does for a call thread."""
    fds = _Registry.home
    if fds is None:
        return
    import os  # (the agent only: deferring)

    net, cwd = fds
    os.unshare(os.CLONE_FS)
    os.fchdir(cwd)
    os.setns(net, os.CLONE_NEWNET)


class _Registry:
    enabled = False
    home: tuple[int, int] | None = None  # the agent's network namespace and cwd, as open descriptors
    pace = 0.0
    defer = 0.0
    idle: float | None = None
    unwritten = 0  # answered ops of every combiner whose write is still to come
    lock = _thread.allocate_lock()
    combiners: dict[Hashable, Combiner] = {}


def share(
    enabled: bool = True, pace: float = PACE, defer: float = 0.0, idle: float | None = None,
    home: tuple[int, int] | None = None,
) -> None:  # fmt: skip
    """The agent turns this on once: concurrent calls of the process on one pool then share writes,
    paced by `pace`, answered early and written together for `defer` seconds where the engine allows,
    a window ending after `idle` seconds without an arrival (default IDLE) (Combiner); `home`: open
    descriptors of the agent's network namespace and working directory, which batch threads enter."""
    _Registry.enabled, _Registry.pace, _Registry.defer, _Registry.idle = enabled, pace, defer, idle
    _Registry.home = home if enabled else None
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
            found = _Registry.combiners[key] = Combiner(_Registry.pace, _Registry.defer, _Registry.idle)
        return found


def settle_all(timeout: float = 30.0, close: bool = False) -> bool:
    """Every combiner of the process settled (Combiner.settle), `close`d first (the agent, before it
    exits: windows end now, so that what was answered is written within the stop's budget). False if
    one did not within `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    with _Registry.lock:
        combiners = list(_Registry.combiners.values())
    for c in combiners if close else ():
        c.close()
    return all(c.settle(max(0.0, deadline - time.monotonic()), drain=True) for c in combiners)


def _uncount(ops: Sequence[Op]) -> None:
    """Answered ops now final (written, or failed for good) out of the gauge of unwritten answers, once
    each; an op taken back for a rewrite (_owed) stays in it."""
    n = 0
    for op in ops:
        if op.counted and op.done:
            op.counted = False
            n += 1
    _unwritten(-n)


def _unwritten(change: int) -> None:
    if change:
        with _Registry.lock:
            _Registry.unwritten += change
            now = _Registry.unwritten
        metrics.sink().unwritten(now)
