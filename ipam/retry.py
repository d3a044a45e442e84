"""Retrying one store operation: compare-and-swap conflicts with jittered exponential backoff under a
deadline (then code 11 saying so), an unreachable store for a short grace (then its own code 11).
A candidate address found taken is no error here: the engine decides again at once (ipam.engine).

A conflict is progress: another writer committed. So conflicts are retried while they keep coming,
up to `limit` (upstream whereabouts' ADD time limit): 200 racers on one pool of a cluster store
commit one after another, and the last must not give up while the queue ahead of it drains. So is an
overloaded server (StoreBusy: its 429 or 504, or no answer within the read timeout): it is busy with
the other writers' requests. Anything else (candidates taken again and again, the store down) is
bounded by `deadline`.

Every conflict and every attempt run again is counted (cni.metrics: a no-op outside the agent and the
reconciler), labelled with the store of the IPAM call in progress."""

from __future__ import annotations

import time
from collections.abc import Callable

from cni import metrics
from cni.errors import TryAgainError
from cni.types.valueclass import field, valueclass
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable


def _random() -> float:
    """random.random(), the module imported on first use: only a retry (after a conflict) or a hot pool
    needs a random number, and importing `random` (math, bisect, _sha2) would cost every plugin call."""
    import random

    return random.random()


@valueclass
class Retry:
    deadline: float = 30.0  # seconds one operation may go on without a conflict (progress elsewhere)
    limit: float = 120.0  # absolute bound on one operation, conflicts or not
    outage: float = 3.0  # how long an unreachable store is retried before code 11
    base: float = 0.004  # first backoff; doubles per conflict, full jitter
    cap: float = 1.0
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    rand: Callable[[], float] = field(default=_random, compare=False)


def retrying[T](policy: Retry, what: str, attempt: Callable[[], T]) -> T:
    clock = policy.clock
    start, conflicts, down_since = clock(), 0, None
    progress = start
    while True:
        try:
            return attempt()
        except Conflict:
            conflicts += 1
            progress = clock()
            metrics.conflict("pool")
            if progress - start > policy.limit:
                raise TryAgainError(
                    f"{what}: gave up after {conflicts} conflicting writes in {policy.limit:g}s"
                ) from None
            metrics.retry("conflict")
        except StoreBusy:  # an overloaded server is serving other writers: bounded like conflicts
            conflicts += 1
            if clock() - start > policy.limit:
                raise
            metrics.retry("busy")
        except StoreUnavailable:
            down_since = clock() if down_since is None else down_since
            if clock() - down_since >= policy.outage or clock() - start > policy.deadline:
                raise
            conflicts += 1
            metrics.retry("unavailable")
        policy.sleep(policy.rand() * min(policy.cap, policy.base * 2 ** min(conflicts, 16)))
