"""The plain execution mode: a plugin process without the agent, its call's ops one batch.

node lock -> read the pool as stored -> decide (ipam.decide) -> write (compare-and-swap, or through a
shared pool's turn) -> retry (ipam.attempt, with its default read policy `Stored`: nothing remembered
between calls); then a DEL's reservations released. Why no cross-process machinery (a node queue,
snapshots, pacing): docs/benchmarks.md "The plain path"."""

from __future__ import annotations

from cni import metrics
from ipam.attempt import Attempt
from ipam.operation import FAILED, WRITTEN, Op

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from ipam.attempt import Access
    from ipam.ranges import IPRange

    class Plain(Access, Protocol):
        def pool_name(self, rng: IPRange) -> str: ...
        def release(self, op: Op) -> None: ...


def run(engine: Plain, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) to completion; each op's error is left on it. The reservations
    of the entries a DEL freed are released after its write (a failure to release is the call's error,
    raised: the runtime's retried DEL releases them)."""
    try:
        Attempt(engine, engine.pool_name(ops[0].rng), ops).run()
    except Exception as e:  # the batch's error is every op's that is not done
        for op in ops:
            if not op.done:
                op.to(FAILED, e)
    finally:
        metrics.conflict("reservation", sum(op.claims.lost for op in ops))
    for op in ops:
        if op.kind == "del" and op.state == WRITTEN:
            engine.release(op)
