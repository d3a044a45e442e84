"""The plain execution mode: a plugin process without the agent, its call's ops one batch.

node lock -> read the pool -> decide (ipam.decide) -> compare-and-swap -> retry (ipam.attempt), with
nothing remembered between calls (an empty ipam.attempt.Memory). The DEL's reservations are released by
the caller after the write (Engine.delete). Why no cross-process machinery (a node queue, snapshots,
pacing): docs/benchmarks.md "The plain path"."""

from __future__ import annotations

from cni import metrics
from ipam.attempt import Attempt, Memory
from ipam.operation import FAILED, Op

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from ipam.attempt import Access
    from ipam.ranges import IPRange

    class Plain(Access, Protocol):
        def pool_name(self, rng: IPRange) -> str: ...


def run(engine: Plain, ops: list[Op]) -> None:
    """Run the ops of one range (one pool) to completion; each op's error is left on it."""
    try:
        Attempt(engine, engine.pool_name(ops[0].rng), ops, Memory()).run()
    except Exception as e:  # the batch's error is every op's that is not done
        for op in ops:
            if not op.done:
                op.to(FAILED, e)
    finally:
        metrics.conflict("reservation", sum(op.claims.lost for op in ops))
