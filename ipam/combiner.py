"""Where the agent's concurrent calls on one pool meet: a queue of IPAM operations (ipam.operation) and the
threads that run them in batches. How a batch runs is the caller's (ipam.batch hands over an `execute`);
this module only queues, starts threads and answers the callers.

One combiner per pool (and store) in the agent (`combiner`). A call queues its ops and waits until they
are done (`Combiner.run`), at most its budget (then Unanswered, code 11). A batch takes everything queued
when it starts (at most MAX_BATCH): the calls that arrived while the previous batch decided and wrote. At
most one batch decides at a time; a batch whose write waits for other nodes' writes (a shared pool's
turn, ipam.turn) says so (`Combiner.waiting`) and the next batch starts beside it, so a node's calls keep
joining the pool's next write while earlier ones wait. No timer: a batch starts when there is work and no
batch deciding.

Every batch thread runs in the context (contextvars) of the call that handed over its latest `execute`
(the metrics' store label, cni.metrics.STORE), and enters the agent's own network namespace and
working directory first (`enter_home`; the call threads are in their callers'). Whatever goes wrong in
a batch thread, the ops it held fail with that error (code 11 unless a CNI error of its own) and it
ends; a caller never waits for a thread that is gone. A combiner with nothing queued, no batch and no
use for IDLE_SECONDS is dropped (`combiner` looks now and then), with what its executor kept in it."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading would cost every call
import time
from collections.abc import Callable, Hashable, Sequence

from cni import faults, log
from cni.errors import CniError, TryAgainError
from ipam.operation import FAILED, Op, Unanswered

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    import contextvars

MAX_BATCH = 128  # operations in one pool write (bounds a write's size and its retry cost)
IDLE_SECONDS = 300.0  # a combiner unused this long is dropped, with what it kept of its pool
LOOK_EVERY = 256  # lookups of combiners between two looks for idle ones

type Execute = Callable[[list[Op]], None]


class Combiner:
    """One per pool (and store) in the agent; see the module docstring. `kept`: what the executor keeps
    of the pool between batches (ipam.agentreads.Memory), made by it on first use."""

    def __init__(self) -> None:
        import threading  # the agent only: plugin processes have no combiner

        self._cv = threading.Condition(threading.Lock())
        self._queue: list[Op] = []
        self._decider = 0  # the thread (ident) whose batch is deciding; 0: none
        self._threads = 0  # batch threads alive: the one deciding and those waiting for their write
        self._execute: tuple[Execute, contextvars.Context] | None = None
        self.kept: object | None = None
        self.used = time.monotonic()
        self.batching = threading.Lock()  # the executor's: one batch of the pool decides and writes at a time

    def run(self, ops: Sequence[Op], execute: Execute, wait: float = 300.0) -> None:
        """Queue `ops` and wait until they are done (written or failed), at most `wait` seconds (then
        Unanswered). `execute` must leave every op of its batch done or raise; a raised error becomes the
        error of every op of the batch not yet done. Batches run with the `execute` of the latest caller."""
        cv = self._cv
        deadline = time.monotonic() + wait
        with cv:
            self._hand(ops, execute)
            while not all(op.done for op in ops):
                left = deadline - time.monotonic()
                if left <= 0:
                    self._give_up(ops, wait)
                cv.wait(left)

    def _hand(self, ops: Sequence[Op], execute: Execute) -> None:
        import contextvars

        self._queue.extend(ops)
        faults.point("combiner-queued")  # tests: a call's ops queued (under the combiner's lock)
        self._execute = (execute, contextvars.copy_context())
        self.used = time.monotonic()
        if not self._decider:
            self._start()

    def waiting(self) -> None:
        """Called by a batch whose write now waits for other writers: the next batch may decide."""
        import threading

        with self._cv:
            if self._decider == threading.get_ident():
                self._decider = 0
                if self._queue:
                    self._start()

    def idle(self, now: float) -> bool:
        with self._cv:
            return not self._queue and not self._threads and now - self.used > IDLE_SECONDS

    def settle(self, timeout: float) -> bool:
        """Wait until no batch runs and none is queued (the agent stopping); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._threads or self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    # ---- the batch threads (under the condition's lock where said) ----------------------------------

    def _start(self) -> None:
        """A batch thread, deciding (under the condition's lock, no batch deciding)."""
        import threading

        self._threads += 1
        self._decider = -1  # until the thread knows its ident
        threading.Thread(target=self._batch, name="pool-batch", daemon=True).start()

    def _give_up(self, ops: Sequence[Op], wait: float) -> None:
        """A caller waited `wait` seconds (under the condition's lock): its ops still queued are withdrawn
        and it gets code 11; an op a batch holds stays that batch's (Unanswered says so)."""
        queued = [op for op in self._queue if any(op is o for o in ops)]
        self._queue = [op for op in self._queue if not any(op is o for o in ops)]
        taken = len([op for op in ops if not op.done]) - len(queued)
        raise Unanswered(f"the pool's batch did not answer within {wait:g}s", held=taken > 0)

    def _batch(self) -> None:
        """One batch thread: one batch (everything queued, at most MAX_BATCH), at home, in its caller's
        context; then it ends, starting the next batch if work is queued and none decides."""
        import threading

        cv, me = self._cv, threading.get_ident()
        held: list[Op] = []
        error: BaseException | None = None
        try:
            with cv:
                self._decider = me
                held, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                execute = self._execute
            enter_home()
            faults.point("batch-take")
            if held and execute is not None:
                execute[1].copy().run(self._run, held, execute[0])  # (a context is entered by one thread)
            faults.point("batch-done")
        except OSError as e:  # entering home failed: nothing ran (said once, with the reason)
            log.error("pool batch: cannot enter the agent's namespace and directory: %s", e.strerror)
            error = e
        except BaseException as e:  # a bug in the bookkeeping: logged once, with its traceback
            log.error("pool batch failed: %r\n%s", e, log.traceback_text())
            error = e
        finally:
            self._end(held, error, me)

    @staticmethod
    def _run(held: list[Op], execute: Execute) -> None:
        try:
            execute(held)
        except Exception as e:
            for op in held:
                if not op.done:
                    op.to(FAILED, e)

    def _end(self, held: list[Op], error: BaseException | None, me: int) -> None:
        """The batch thread ends: the ops it held and did not finish fail with `error` (code 11 unless a
        CNI error); the next batch starts if work is queued and none decides; the callers are woken."""
        cause = None
        if error is not None:
            cause = error if isinstance(error, CniError) else TryAgainError(f"pool batch failed: {error!r}")
        with self._cv:
            for op in held:
                if not op.done:
                    op.to(FAILED, cause or TryAgainError("pool batch ended without an answer"))
            self._threads -= 1
            if self._decider == me:
                self._decider = 0
            if self._queue and not self._decider:
                self._start()
            self.used = time.monotonic()
            self._cv.notify_all()


def enter_home() -> None:
    """This thread into the agent's own network namespace and working directory (`set_home`, given by
    `ipam.batch.install(home)`; nothing without one): its own filesystem context first (unshare
    CLONE_FS), so that fchdir moves this thread alone, as cni.agent.server enter_caller does for a call
    thread."""
    fds = _Registry.home
    if fds is None:
        return
    import os  # (the agent only)

    net, cwd = fds
    os.unshare(os.CLONE_FS)
    os.fchdir(cwd)
    os.setns(net, os.CLONE_NEWNET)


class _Registry:
    home: tuple[int, int] | None = None  # the agent's network namespace and cwd, as open descriptors
    lock = _thread.allocate_lock()
    combiners: dict[Hashable, Combiner] = {}
    lookups = 0


def set_home(home: tuple[int, int] | None) -> None:
    """Open descriptors of the agent's network namespace and working directory, which batch threads
    enter (None: they stay where they start; tests)."""
    _Registry.home = home


def combiner(key: Hashable) -> Combiner:
    """The process' combiner for `key`; every LOOK_EVERY lookups, the idle ones are dropped."""
    with _Registry.lock:
        _Registry.lookups += 1
        if _Registry.lookups % LOOK_EVERY == 0:
            now = time.monotonic()
            for k in [k for k, c in _Registry.combiners.items() if c.idle(now)]:
                del _Registry.combiners[k]
        found = _Registry.combiners.get(key)
        if found is None:
            found = _Registry.combiners[key] = Combiner()
        found.used = time.monotonic()
        return found


def count() -> int:
    """How many combiners the process keeps."""
    with _Registry.lock:
        return len(_Registry.combiners)


def forget() -> None:
    """Every combiner dropped (the agent's sharing turned off; tests)."""
    with _Registry.lock:
        _Registry.combiners.clear()


def settle_all(timeout: float = 30.0) -> bool:
    """Every combiner of the process settled (Combiner.settle: the agent, before it exits, lets the
    batches under way and queued end). False if one did not within `timeout` seconds in all."""
    deadline = time.monotonic() + timeout
    with _Registry.lock:
        combiners = list(_Registry.combiners.values())
    return all(c.settle(max(0.0, deadline - time.monotonic())) for c in combiners)
