"""The agent's execution mode: the node-local agent's threads share one batch per pool.

Concurrent calls of the agent on one pool queue on the pool's combiner (ipam.batch.Combiner), whose
batch thread attempts each batch for all (ipam.attempt) with a store handle of its own and the pool's
memory (ipam.attempt.Memory), so N calls cost one pool write; a DEL's reservations are released in the
batch, after its write: the DEL is written once they are. A call returns once its ops are written."""

from __future__ import annotations

from collections.abc import Callable

from cni.errors import CniError
from ipam import batch, operation
from ipam.attempt import Attempt, Memory
from ipam.operation import Op

TYPE_CHECKING = False
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


def run(engine: Shared, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) through the pool's combiner; each op's error is left on it.
    A call waits for a batch under way and its own, each bounded by the retry limit."""
    name = engine.pool_name(ops[0].rng)
    comb = batch.combiner((engine.identity, name))
    comb.run(ops, _executor(engine, name, comb), 2 * engine.retry.limit)


def _executor(engine: Shared, name: str, comb: batch.Combiner) -> Callable[[list[Op]], None]:
    """A batch as the combiner's thread runs it: with a store handle of its own (the callers' may be
    back at work elsewhere) and the pool's memory."""
    conf, reopen = engine.conf, engine.reopen

    def execute(group: list[Op]) -> None:
        from ipam.store.handles import BATCH, store_for

        if not isinstance(comb.memory, Memory):  # the pool's, kept with its combiner
            comb.memory = Memory(kept=True)
        with reopen() if reopen is not None else store_for(conf.store, BATCH) as store:
            e = engine.on(store)
            Attempt(e, name, group, comb.memory, releases=True).run()
            _release_freed(e, group)

    return execute


def _release_freed(engine: Shared, group: list[Op]) -> None:
    """The batch's DELs release their reservations before the batch ends: its callers then return
    together and their next calls meet in the next batch. An op's failure is its own."""
    for op in group:
        if op.kind == "del" and op.state == operation.DECIDED:
            try:
                engine.release(op)
            except CniError as e:
                op.to(operation.FAILED, e)
                continue
            op.to(operation.WRITTEN)
