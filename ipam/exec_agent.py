"""The agent's execution mode: the node-local agent's threads share one batch per pool.

Concurrent calls of the agent on one pool queue on the pool's combiner (ipam.batch.Combiner): whoever
runs the batch attempts it for all (ipam.attempt), so N calls cost one pool write. With deferred writes
(the combiner defers: ipam.batch.share) the batch runs in the combiner's own thread with a store handle
of its own; on the Kubernetes store (Engine.defers: the reservations are authoritative) the ops decided
are answered before the write, and for the combiner's window the calls that arrive are decided on the
same view and answered too (appended to the batch's list, so that a retry of the write keeps them); then
one write for all. An ADD is answered as soon as it is decided (its address reserved), not when its
pass ends (Agent.each). A retry decides an answered ADD on its address again (Attempt._decide_add). A DEL's
reservations are released in the batch, after its write: the DEL is written once they are."""

from __future__ import annotations

import time
from collections.abc import Callable

from cni.errors import CniError
from ipam import batch
from ipam.attempt import Attempt, Memory, Mode, Pass, undecide
from ipam.batch import Op
from ipam.model import PoolView
from ipam.ranges import IPRange

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ipam.engine import Engine


def run(engine: Engine, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) through the pool's combiner; each op's error is left on it."""
    name = engine.pool_name(ops[0].rng)
    comb = batch.combiner((engine.identity, name))

    def here(group: list[Op]) -> None:  # `group` grows by the ops a deferred batch takes
        _batch(engine, name, group, comb)

    # a deferred call waits for a batch under way and its own, each bounded by the retry limit
    wait = 2 * engine.retry.limit + batch.DEFER_MAX
    comb.run(ops, _deferred(engine, name, comb) if comb.defer else here, wait)


def settle(engine: Engine, rng: IPRange) -> None:
    """The pool's answered calls written before it is read (CHECK, GC)."""
    if engine.defers:
        batch.combiner((engine.identity, engine.pool_name(rng))).settle()


def _deferred(engine: Engine, name: str, comb: batch.Combiner) -> Callable[[list[Op]], None]:
    """A batch as the combiner's own thread runs it when writes are deferred: with a store handle and
    an engine of its own (the callers' may be back at work elsewhere)."""
    conf, retry, reopen, make = engine.conf, engine.retry, engine.reopen, type(engine)

    def execute(group: list[Op]) -> None:
        from ipam.store.handles import BATCH, store_for

        with reopen() if reopen is not None else store_for(conf.store, BATCH) as store:
            _batch(make(store, conf, retry, reopen), name, group, comb)

    return execute


def _batch(engine: Engine, name: str, group: list[Op], comb: batch.Combiner) -> None:
    if not isinstance(comb.memory, Memory):  # the pool's, kept with its combiner (one batch at a time)
        comb.memory = Memory(kept=True)
    Attempt(engine, name, group, Agent(engine, comb), comb.memory).run()
    _release_freed(engine, group)


class Agent(Mode):
    """The agent's part in an attempt (ipam.attempt.Mode): early answers and arrivals when it defers."""

    releases = True

    def __init__(self, engine: Engine, comb: batch.Combiner) -> None:
        self.e, self.comb = engine, comb
        self.deferring = engine.defers and bool(comb.defer)

    def decided(self, attempt: Attempt, view: PoolView, got: Pass, hot: bool | None, cached: bool,
                pending: list[Op]) -> list[Op]:  # fmt: skip
        if not self.deferring:
            return []
        self.comb.answer([op for op in got.decided if op.overlapping])  # the others wait for the write
        return _decide_arrivals(attempt, self.comb, view, got, hot, cached, pending)

    def each(self, op: Op) -> None:
        """An ADD is answered as soon as its address is reserved, not once the whole pass is: a pass
        claims its ADDs' reservations one after another, so its first call would otherwise wait for the
        requests of all the others. Should the pass end on a stale view, or the batch fail, the op is
        decided again on the address it was told (Attempt._decide_answered, as after a failed write).
        A DEL waits for its pass (one that finds nothing on this view looks at the pool as stored)."""
        if self.deferring and op.kind == "add" and op.overlapping:
            self.comb.answer([op])

    def wrote(self, seconds: float) -> None:
        if self.deferring:
            self.comb.wrote(seconds)


def _decide_arrivals(
    attempt: Attempt, comb: batch.Combiner, view: PoolView, got: Pass, hot: bool | None, cached: bool,
    pending: list[Op],
) -> list[Op]:  # fmt: skip
    """Deferred writes: for the combiner's window (Combiner.window), or until no op has arrived for
    Combiner.lull() seconds (or the agent stops: Combiner.close), decide and answer the ops that arrive,
    on the batch's view after its decisions; the ops so decided. An arrival that fails here (a pool
    full on this view, a snapshot found stale, the store out of reach) or a DEL that finds nothing on it
    goes back to the queue: the next batch decides it on the pool as its rules read it."""
    decided: list[Op] = []
    changes = got.changes
    deadline = time.monotonic() + comb.window()
    while (left := deadline - time.monotonic()) > 0 and len(pending) < batch.MAX_BATCH:
        arrived = comb.more(batch.MAX_BATCH - len(pending), min(left, comb.lull()))
        if not arrived:
            break  # a lull (or the window's end): write now rather than hold what was answered
        for op in arrived:
            op.started = op.begun = attempt.e.retry.clock()
        lost = [op.claims.lost for op in arrived]
        more: list[Op] = []
        mark = changes.mark()
        try:
            tried = attempt.decide_all(view, arrived, hot, snapshot=cached, changes=changes)
            if tried.stale:
                changes.restore(mark)  # none of them is written with this batch
            else:
                more = tried.decided
        finally:  # raised or not: what was not decided goes back, as it came; so does a DEL that found
            # nothing on this view (the next batch looks at the pool as stored first)
            more = [op for op in more if op.kind == "add" or op.freed]
            failed = [op for op in arrived if op not in more]
            for op, n in zip(arrived, lost, strict=True):
                if op in failed:
                    op.claims.lost = n
                    undecide([op], failed=True)
            comb.requeue(failed)
        attempt.ops.extend(more)
        pending += more
        decided += more
        comb.answer([op for op in more if op.overlapping])
        if failed:
            break
    return decided


def _release_freed(engine: Engine, group: list[Op]) -> None:
    """The batch's DELs release their reservations before the batch ends: its callers then return
    together and their next calls meet in the next batch (a DEL's write is only the PATCH; releases in
    each caller's own thread after it staggered the arrivals), and the batch's duration, which paces
    the next write, includes them: each DEL is written once they are. An op's failure is its own."""
    for op in group:
        if op.kind == "del" and op.state in (batch.DECIDED, batch.ANSWERED):
            try:
                engine.release(op)
            except CniError as e:
                op.to(batch.FAILED, e)
                continue
            op.to(batch.WRITTEN)
