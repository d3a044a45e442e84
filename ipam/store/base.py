"""The store protocol: what every IPAM store (local SQLite, Kubernetes CRDs, etcd, memory) implements.

The data model is the whereabouts CRD model, 1:1, so the Kubernetes store is a drop-in:

- one `Pool` per range (CRD `IPPool`): `name` (see ipam.store.names), `range` (canonical CIDR, the
  CRD's `spec.range`) and `allocations`, keyed by the **decimal offset from the range's network
  address as a string** (the CRD's `spec.allocations` keys), each an `Allocation`;
- one `Reservation` per IP (CRD `OverlappingRangeIPReservation`) when enable_overlapping_ranges is on.

`Allocation.container_id/podref/ifname` are the CRD fields `id/podref/ifname`. `pod_uid`, `network` and
`node` have no place in the CRD schema (unknown fields are pruned); the Kubernetes store keeps them in
annotations (ipam.store.crd: the pool's `pycni.io/owners-v2`, the reservation's `pycni.io/*`). Objects
written by upstream whereabouts simply lack them ("" here), and every consumer must cope with that.

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
entries then never conflict. The engine's decisions only ever rest on the entries they touch (and, with
overlapping ranges, on the reservations), so both kinds are correct for it.

A store module `ipam/store/<name>.py` exposes `open_store(conf: ipam.config.StoreConfig) -> Store`
(see ipam.store.select) and joins the contract suite by adding a factory to
tests/contract/factories.py, and the process-level concurrency suite (200 ADDs, the seeded storm)
by adding a target to tests/concurrency/stores.py. ipam.store.crd maps this model to and from the
CRD objects."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence, Set
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from cni.errors import CniError, Code, TryAgainError
from cni.types.valueclass import field, valueclass


class Allocation(NamedTuple):
    """Who holds an address. A NamedTuple (not a dataclass): pools of 100,000 are built from rows."""

    container_id: str  # CRD: id
    podref: str  # CRD: podref, "namespace/name" ("" when the runtime gave no pod)
    ifname: str  # CRD: ifname
    pod_uid: str = ""  # pycni: K8S_POD_UID when the runtime passed it
    network: str = ""  # pycni: the CNI network name (conf "name"); GC only touches its own network
    node: str = ""  # pycni: the node that allocated it; GC of a cluster store only touches its node

    def same_attachment(self, other: Allocation) -> bool:
        """The CNI identity: (container id, ifname)."""
        return self.container_id == other.container_id and self.ifname == other.ifname

    def same_pod_interface(self, other: Allocation) -> bool:
        """Same pod and interface (a kubelet re-ADD with a new sandbox); needs a pod reference."""
        return bool(self.podref) and self.podref == other.podref and self.ifname == other.ifname


@valueclass
class Pool:
    """A snapshot of one pool. `version` None: the pool is not stored yet (commit creates it)."""

    name: str
    range: str
    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    version: str | None = None


@valueclass
class PoolUpdate:
    """A change to a pool, computed from a snapshot: offsets to set (add or replace) and to remove."""

    put: Mapping[str, Allocation] = field(default_factory=dict)
    remove: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.put or self.remove)

    def apply(self, allocations: Mapping[str, Allocation]) -> dict[str, Allocation]:
        """The allocations after this update (for stores that write whole objects)."""
        out = {k: v for k, v in allocations.items() if k not in self.remove}
        out.update(self.put)
        return out


@valueclass
class Reservation:
    """Cluster-wide claim on one IP (overlapping ranges). `version` None: not stored yet."""

    name: str
    owner: Allocation
    version: str | None = None


Segment = tuple[int, int]  # inclusive offsets


class PoolView(Protocol):
    """What allocation asks of one pool; answered from a snapshot or by the store directly."""

    @property
    def name(self) -> str: ...

    @property
    def range(self) -> str: ...

    @property
    def version(self) -> str | None: ...

    def count(self) -> int:
        """How many allocations the pool holds."""
        ...

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        """Allocations of the same attachment (by_pod: of the same pod and ifname, any container)."""
        ...

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        """The lowest offset in `segments` (ascending) that is neither allocated nor in `blocked`."""
        ...


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

    def snapshot(self, name: str, version: str) -> bytes | None:
        """Pool `name` at `version` as this handle last read or wrote it, for restore(); None: unknown."""
        return None

    def restore(self, data: bytes) -> Pool | None:
        """A pool from snapshot() (possibly another process'); None when not offered or unreadable."""
        return None

    def known_reservation(self, name: str) -> Reservation | None:
        """Reservation `name` as this process last wrote or read it (possibly stale); None: unknown."""
        return None
