"""The agent's execution mode: the IPAM operations (ipam.operation) of concurrent calls on one pool decided
and written together. (A plugin process runs its own call: ipam.exec_plain.)

`run`: a call's ops go to their pool's combiner (ipam.combiner: the queue and its threads); a batch takes
every op queued when it starts and runs one Attempt (ipam.attempt) over them with a store handle of its
own lane (ipam.store.handles BATCH: the callers hold theirs) and the agent's read policy over the pool's
memory (ipam.agentreads): N concurrent calls on one pool cost one pool write, not N racing ones. A DEL's
reservations are released in the batch, after its write. Each caller returns once its ops are written
(a DEL: and released) or failed, never before: an answered ADD's pool entry exists. A batch whose write
waits for other nodes (a shared pool's turn) lets the next batch decide meanwhile.

`install(home)`: the agent, once at start-up: every engine the IPAM plugin builds from then on runs its
ops here (ipam.plugin), the batch threads enter the agent's network namespace and directory, and waits on
a shared pool's turn share one watch of it (ipam.store.turnwatch)."""

from __future__ import annotations

from collections.abc import Callable

from cni import metrics
from cni.errors import CniError
from ipam import combiner
from ipam.agentreads import Memory, Remembered
from ipam.attempt import Attempt
from ipam.combiner import Combiner
from ipam.operation import DECIDED, FAILED, WRITTEN, Op

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
