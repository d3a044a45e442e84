"""The store protocol: what every IPAM store (local SQLite, Kubernetes CRDs, etcd; tests/memstore.py in
tests) implements.

The data model (`Pool`, `Allocation`, `Reservation`, `PoolUpdate`, `PoolView`) is ipam.model.

Concurrency: compare-and-swap on an opaque per-object `version` (resourceVersion, etcd mod_revision, a
SQLite row version) is the only mechanism. A write names the version it was computed from; a store
raises `Conflict` if the object changed (or, for a create, exists) and changes nothing. There is no
lock and no transaction spanning two objects.

Failures: a store that cannot be reached raises `StoreUnavailable` (CNI code 11) from any method. Any
other backend error is the store's bug to map; never let a client library's exception escape.

Listing: `iter_pools` and `iter_reservations` are generators that page through the backend, so the
CLI and the reconciler hold one page, not everything. A store handle is used by one thread at a time;
open one handle per thread or process.

Optional features are declared in `Store` with defaults that mean "not offered"; a store class
subclasses `Store` and overrides what it offers (the engine asks, never probes with getattr):

Optional: a store that can answer allocation's questions without loading a pool (the local store,
with indexes) overrides `view_pool(name) -> PoolView | None`, valid inside `exclusive()`. The engine
uses it when it answers and a snapshot of `get_pool` otherwise.

Optional: a store that can make a read-modify-write atomic cheaply (the local store: one SQLite file
on one node) sets `serial = True` and overrides `exclusive() -> ContextManager[None]`: the calls made
inside form one atomic unit. The engine then runs each attempt inside it, so writers on one node queue
instead of racing. Correctness never depends on it (the CAS checks run inside as well); cluster stores
do not offer it.

Optional (the Kubernetes store): `snapshot(name, version)` / `restore(data)` serialise a pool as this
handle last read or wrote it, for the next writer on the node (ipam.nodelock); `known_reservation(name)`
answers a reservation as this process last wrote or read it, so a delete can name its version without
a read.

Optional: a store may merge (`merges = True`, the Kubernetes store): `commit_pool` then applies the
update to the pool as it is when the write arrives, guarded entry by entry instead of by the whole
version: each entry it adds must still be absent, each it replaces or removes must still name the
container it named in the snapshot; otherwise Conflict and nothing changes. Writers of different
entries then never conflict. An update marked `whole` is guarded by the whole version there too. The
engine's decisions only ever rest on the entries they touch (and, with overlapping ranges, on the
reservations), so both kinds are correct for it.

A store module `ipam/store/<name>.py` exposes `open_store(conf: ipam.config.StoreConfig) -> Store`
(see ipam.store.select) and joins the contract suite by adding a factory to
tests/contract/factories.py, and the process-level concurrency suite (200 ADDs, the seeded storm)
by adding a target to tests/concurrency/stores.py. ipam.store.crd maps this model to and from the
CRD objects."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager

from cni.errors import CniError, Code, TryAgainError
from ipam.model import Pool, PoolUpdate, PoolView, Reservation

# typing.Protocol only for the type checker (importing typing and building a Protocol class would cost
# every plugin call): the stores subclass Store explicitly, so at run time it is a plain base class.
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
    """One handle onto a store. See the module docstring for the rules; store classes subclass it and
    so inherit the optional features' defaults (not offered)."""

    merges: bool = False  # commit_pool guards entry by entry, not the whole version
    serial: bool = False  # exclusive() makes an attempt atomic: writers through it never race

    def get_pool(self, name: str) -> Pool | None:
        """The pool named `name`, or None if it does not exist."""
        ...

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        """Apply `update` to the stored pool iff its version is still `pool.version` (only
        pool.name, pool.range and pool.version are read, not pool.allocations); a pool with
        version None is created (spec.range = pool.range) with `update` applied to an empty pool.
        Returns the new version; raises Conflict and changes nothing otherwise. Removing every
        allocation leaves an empty pool behind (as upstream does)."""
        ...

    def iter_pools(self) -> Iterator[Pool]:
        """Every pool, one at a time, in no particular order; pages through the backend."""
        ...

    def get_reservation(self, name: str) -> Reservation | None: ...

    def put_reservation(self, res: Reservation) -> str:
        """Create (`res.version` None; Conflict if it exists) or replace iff the stored version is
        `res.version` (Conflict if it changed or is gone). Returns the new version."""
        ...

    def delete_reservation(self, res: Reservation) -> None:
        """Delete iff the stored version is `res.version`; Conflict if it changed; a reservation that
        is already gone is success."""
        ...

    def iter_reservations(self) -> Iterator[Reservation]:
        """Every reservation, one at a time; pages through the backend."""
        ...

    def ping(self) -> None:
        """Return if the store is reachable and usable; raise StoreUnavailable otherwise."""
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
        batch on its last write's: ipam.attempt.Memory); None: unknown."""
        return None

    def known_reservation(self, name: str) -> Reservation | None:
        """Reservation `name` as this process last wrote or read it (possibly stale); None: unknown."""
        return None

    def recent_pool(self, name: str, version: str) -> Pool | None:
        """Pool `name` at `version` or newer, possibly from the server's cache a moment behind the
        store (cheaper to serve than get_pool's read of the store itself). Default: get_pool."""
        return self.get_pool(name)
