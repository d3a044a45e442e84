"""Removing judged entries from one pool, for everything that frees addresses outside an ADD or DEL: CNI GC
(ipam.engine), the reconciler (ipam.reconciler) and `pycni-ipam release` (ipam.cli). The pool is read,
whoever judges picks the entries (`pick`), the decision core removes those still exactly as picked
(ipam.decide Remove: an entry taken over meanwhile stays), and the update is written with
compare-and-swap; a Conflict reads the pool again and judges again, retried as the engine's writes are
(ipam.retry)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from ipam import decide
from ipam.decide import Freed, SnapshotView
from ipam.model import Allocation, Pool
from ipam.retry import Retry, retrying
from ipam.store.base import Store

type Pick = Callable[[Pool], Iterable[tuple[str, Allocation]]]


def remove_once(store: Store, pool: Pool, pick: Pick) -> list[tuple[str, Allocation]]:
    """One attempt on `pool` as read: the entries removed (Conflict when the pool changed meanwhile)."""
    decided = decide.decide(SnapshotView(pool), [decide.Remove(tuple(pick(pool)))], ())
    (freed,) = decided.outcomes
    assert isinstance(freed, Freed)
    update = decided.update()
    if update:
        store.commit_pool(pool, update)
    return list(freed.entries)


def remove(
    store: Store, name: str, pick: Pick, retry: Retry, what: str, first: Pool | None = None,
    atomic: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> list[tuple[str, Allocation]]:  # fmt: skip
    """Remove from pool `name` the entries `pick` chooses, retried on conflicts (`what` names the work in
    a give-up error). `first`: the pool as the caller already read it (the first attempt's view);
    `atomic`: one attempt's unit (the local store's transaction). Nothing when the pool does not exist."""
    given = [first]

    def attempt() -> list[tuple[str, Allocation]]:
        with atomic():
            pool = given.pop() if given and given[0] is not None else store.get_pool(name)
            given.clear()
            return [] if pool is None else remove_once(store, pool, pick)

    return retrying(retry, what, attempt)
