"""The agent's execution mode: the IPAM operations (ipam.operation) of concurrent calls on one pool decided
and written together. (A plugin process runs its own call: ipam.exec_plain.)

`run`: a call's ops go to their pool's combiner (ipam.combiner: the queue and its threads); a batch takes
every op queued when it starts and runs one Attempt (ipam.attempt) over them with a store handle of its
own lane (ipam.store.handles BATCH: the callers hold theirs) and the agent's read policy over the pool's
memory (ipam.agentreads): N concurrent calls on one pool cost one pool write, not N racing ones. A DEL's
reservations are released in the batch, after its write. Each caller returns once its ops are written
(a DEL: and released) or failed, never before: an answered ADD's pool entry exists. A batch whose write
waits for other nodes (a shared pool's turn) lets the next batch decide meanwhile.

Unless its config opts in (`answer_before_write`, `answer_early`): the caller's thread decides its ops on
the pool as the last batch wrote it plus the ops answered and not yet written (`Memory.unwritten`), one
caller of the pool at a time; an ADD claims its reservation, and the call returns. Its op, pinned to its
address, goes to the queue, and a batch writes it with the others. An op that fails after its answer is
logged as an error; its reservation stays (the address is held, never handed out twice).

`install(home)`: the agent, once at start-up: every engine the IPAM plugin builds from then on runs its
ops here (ipam.plugin), the batch threads enter the agent's network namespace and directory, and waits on
a shared pool's turn share one watch of it (ipam.store.turnwatch)."""

from __future__ import annotations

from collections.abc import Callable

from cni import log, metrics
from cni.errors import CniError
from ipam import combiner, decide
from ipam.agentreads import HOT_SECONDS, Memory, Remembered
from ipam.allocator import SnapshotView
from ipam.attempt import Attempt, undecide
from ipam.combiner import Combiner
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


def install(home: tuple[int, int] | None = None) -> None:
    """The agent's start-up: the IPAM plugin's engines run their ops here (ipam.plugin.EXECUTE), batch
    threads enter `home` (open descriptors of the agent's network namespace and working directory)."""
    from ipam import plugin
    from ipam.store import kubeturn

    combiner.set_home(home)
    kubeturn.share_watches(True, combiner.enter_home)
    plugin.EXECUTE = run


def uninstall() -> None:
    """Back to plugin processes' execution (tests)."""
    from ipam import exec_plain, plugin
    from ipam.store import kubeturn

    combiner.set_home(None)
    combiner.forget()
    kubeturn.share_watches(False)
    plugin.EXECUTE = exec_plain.run


def memory(comb: Combiner) -> Memory:
    """What the agent remembers of the combiner's pool (ipam.agentreads), made on first use."""
    if not isinstance(comb.kept, Memory):
        comb.kept = Memory()
    return comb.kept


def run(engine: Shared, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) through the pool's combiner; each op's error is left on it.
    A call waits for a batch under way and its own, each bounded by the retry limit."""
    name = engine.pool_name(ops[0].rng)
    comb = combiner.combiner((engine.identity, name))
    execute = _executor(engine, name, comb)
    if all(op.early and op.overlapping for op in ops) and answer_early(engine, name, comb, ops, execute):
        return
    comb.run(ops, execute, 2 * engine.retry.limit)


def _executor(engine: Shared, name: str, comb: Combiner) -> Callable[[list[Op]], None]:
    """A batch as the combiner's thread runs it: with a store handle of its own (the callers' may be
    back at work elsewhere), the pool's memory, one batch of the pool deciding at a time."""
    conf, reopen = engine.conf, engine.reopen

    def execute(group: list[Op]) -> None:
        from ipam.store.handles import BATCH, store_for

        try:
            with reopen() if reopen is not None else store_for(conf.store, BATCH) as store:
                e = engine.on(store)
                reads = Remembered(memory(comb), comb.batching, comb.waiting)
                Attempt(e, name, group, reads, releases=True).run()
                _release_freed(e, group)
        finally:  # each op runs in one batch: count its races lost once, when it is over
            metrics.conflict("reservation", sum(op.claims.lost for op in group))
            _failed_after_answer(group)
            with comb.deciding:  # the ops answered early that are done leave `unwritten`
                mem = memory(comb)
                mem.unwritten = [op for op in mem.unwritten if not op.done]

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


def _failed_after_answer(held: list[Op]) -> None:
    """An op answered before its pool write (answer_before_write) that then failed: its caller is gone, so
    the log says it (an ADD: the address its pod uses has no pool entry; its reservation holds it)."""
    for op in held:
        if op.answered and op.state == FAILED:
            what = op.rng.address(op.offsets[0]) if op.kind == "add" and op.offsets else op.rng.cidr
            log.error("%s %s %s: answered before its pool write, which then failed: %s", op.kind.upper(),
                      op.owner.container_id, what, op.error)  # fmt: skip


# ---- answer_before_write ------------------------------------------------------------------------------


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
        mem, lost = memory(comb), sum(op.claims.lost for op in ops)
        last = mem.last
        try:
            fits = last is not None and same_network(last.range, rng)
            view = SnapshotView(last) if last is not None and fits else engine.view(rng)
            changes = Changes(view)
            for op in mem.unwritten:
                _replay(engine, changes, op)
            got = Attempt(engine, name, ops).decide_all(view, ops, mem.hot(), changes=changes)
        except (StoreUnavailable, Conflict):
            undecide(ops, failed=True)
            return False
        finally:
            if sum(op.claims.lost for op in ops) > lost:  # races lost to other nodes: scatter at once
                mem.heat(HOT_SECONDS)
        if any(op.kind == "del" and not op.freed for op in got.decided):
            undecide(ops)
            return False
        if any(op.state == FAILED for op in ops):
            return True
        for op in ops:
            if op.kind == "add":
                op.want = op.offsets[0]  # decided again after a lost write, it gets exactly this or fails
            op.answered = True
        mem.unwritten += ops
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
