"""The store protocol: what every IPAM store (local SQLite, Kubernetes CRDs, etcd; tests/memstore.py in
tests) implements, over the data model of ipam.model (`Pool`, `Allocation`, `Reservation`, `PoolUpdate`,
`PoolView`); ipam.store.crd maps it to and from the CRD objects.

Concurrency: compare-and-swap on an opaque per-object `version` (resourceVersion, etcd mod_revision, a
SQLite row version) is the only mechanism. A write names the version it was computed from; a store
raises `Conflict` if the object changed (or, for a create, exists) and changes nothing. There is no
lock and no transaction spanning two objects. A store that merges (`merges`, the Kubernetes store)
guards `commit_pool` entry by entry instead: each entry it adds must still be absent, each it replaces
or removes must still name the container it named in the snapshot (an update marked `whole` is guarded
by the whole version there too); writers of different entries then never conflict. The engine's
decisions rest only on the entries they touch (and the reservations), so both kinds are correct for it.

Failures: a store that cannot be reached raises `StoreUnavailable` (CNI code 11) from any method; any
other backend error is the store's bug to map (never let a client library's exception escape).
`iter_pools` and `iter_reservations` page through the backend. A handle is used by one thread at a
time.

Optional features have defaults in `Store` that mean "not offered"; a store overrides what it offers
(the engine asks, never probes with getattr): `serial` with `exclusive()` (the local store: the calls
inside form one atomic unit, so writers on a node queue instead of racing; the CAS checks still run),
`view_pool` (answers inside exclusive() without loading the pool), `written`, `known_reservation` and
`recent_pool` (what this handle last read or wrote, a cheaper read), `admit` (a pool grown past what the
store can hold refuses new entries).

A store module `ipam/store/<name>.py` exposes `open_store(conf: ipam.config.StoreConfig) -> Store`
(ipam.store.select) and joins the contract suite (a factory in tests/contract/factories.py) and the
process-level concurrency suite (a target in tests/concurrency/stores.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from cni.errors import CniError, Code, TryAgainError
from ipam.model import Allocation, Pool, PoolUpdate, PoolView, Reservation

# typing.Protocol only for the type checker: the stores subclass Store, at run time a plain base class
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object


class StoreUnavailable(TryAgainError):
    """The store cannot be reached (network, permissions, disk): CNI code 11, try again later."""


class StoreBusy(StoreUnavailable):
    """The store answered but is overloaded (an API server's 429, or its 504 for a request it could not
    finish in time): retried for the retry deadline, not only the short outage grace."""


class Conflict(CniError):
    """Compare-and-swap failed: the object changed since it was read, or exists on create. The engine
    retries; if it escapes it still means "try again" (code 11)."""

    code = Code.TRY_AGAIN_LATER


class Store(Protocol):
    """One handle onto a store (the rules: the module's doc)."""

    merges: bool = False  # commit_pool guards entry by entry, not the whole version
    serial: bool = False  # exclusive() makes an attempt atomic: writers through it never race

    def get_pool(self, name: str) -> Pool | None: ...

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        """Apply `update` to the stored pool iff its version is still `pool.version` (only
        pool.name, pool.range and pool.version are read, not pool.allocations); a pool with
        version None is created (spec.range = pool.range) with `update` applied to an empty pool.
        Returns the new version; raises Conflict and changes nothing otherwise. Removing every
        allocation leaves an empty pool behind (as upstream does)."""
        ...

    def iter_pools(self) -> Iterator[Pool]: ...

    def get_reservation(self, name: str) -> Reservation | None: ...

    def put_reservation(self, res: Reservation) -> str:
        """Create (`res.version` None; Conflict if it exists) or replace iff the stored version is
        `res.version` (Conflict if it changed or is gone). Returns the new version."""
        ...

    def delete_reservation(self, res: Reservation) -> None:
        """Delete iff the stored version is `res.version`; Conflict if it changed; a reservation that
        is already gone is success."""
        ...

    def iter_reservations(self) -> Iterator[Reservation]: ...

    def ping(self) -> None:
        """StoreUnavailable unless the store is reachable and usable."""
        ...

    def close(self) -> None: ...

    # ---- optional features: the defaults say "not offered" ----------------------------------------

    def exclusive(self) -> AbstractContextManager[None] | None:
        """One atomic unit for the calls made inside (with `serial`); None: not offered."""
        return None

    def view_pool(self, name: str) -> PoolView | None:
        """Pool `name` answered by the store itself inside exclusive(); None: read it with get_pool."""
        return None

    def written(self, name: str, version: str) -> Pool | None:
        """Pool `name` at `version` as this handle last read or wrote it (the agent decides its next
        batch on its last write's: ipam.agentreads.Memory); None: unknown."""
        return None

    def known_reservation(self, name: str) -> Reservation | None:
        """Reservation `name` as this process last wrote or read it (possibly stale); None: unknown."""
        return None

    def post_pool(self, pool: Pool, update: PoolUpdate) -> Callable[[], str] | None:
        """A pool write that may have to wait for other writers (the Kubernetes store: a pool several
        nodes write, ipam.turn): begun now, under the caller's lock; the function returned waits for it
        (call it outside any lock) and returns the version, or raises as commit_pool. None: write it with
        commit_pool (not offered, or not needed for this pool)."""
        return None

    def admit(self, view: PoolView, entry: Allocation, earlier: int) -> None:
        """Before an ADD adds `entry` to pool `view` (after the `earlier` new entries of the same write):
        raise a CniError when the pool would then be larger than the store can hold (the Kubernetes store:
        code 100, docs/ipam.md "Pool size limit"). Default: no limit."""
        return None

    def recent_pool(self, name: str, version: str) -> Pool | None:
        """Pool `name` at `version` or newer, possibly from the server's cache a moment behind the
        store (cheaper to serve than get_pool's read of the store itself). Default: get_pool."""
        return self.get_pool(name)
