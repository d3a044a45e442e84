"""The IPAM's data model: the whereabouts CRD model, 1:1, so the Kubernetes store is a drop-in. Stores
(ipam.store.base) keep it; the engine (ipam.engine) and allocation (ipam.allocator) work on it.

- one `Pool` per range (CRD `IPPool`): `name` (see ipam.store.names), `range` (canonical CIDR, the
  CRD's `spec.range`) and `allocations`, keyed by the **decimal offset from the range's network
  address as a string** (the CRD's `spec.allocations` keys), each an `Allocation`;
- one `Reservation` per IP (CRD `OverlappingRangeIPReservation`) when enable_overlapping_ranges is on.

`Allocation.container_id/podref/ifname` are the CRD fields `id/podref/ifname`. `pod_uid`, `network` and
`node` have no place in the CRD schema (unknown fields are pruned); the Kubernetes store keeps them in
annotations (ipam.store.crd: the pool's `pycni.io/o-<offset>`, the reservation's `pycni.io/*`). Objects
written by upstream whereabouts simply lack them ("" here), and every consumer must cope with that. With
overlapping ranges on the Kubernetes store (node slices too), pool entries are written without them
(`Allocation.bare`): the entry's reservation carries them, and GC, the reconciler and `pycni-ipam show`
join them back (`joined`)."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterable, Mapping, Sequence, Set

from cni.types.valueclass import field, valueclass

# typing (NamedTuple, Protocol) only for the type checker: importing it and building a Protocol class
# would cost every plugin call (docs/benchmarks.md). At run time the fields are a collections.namedtuple
# (the same tuple: fields, defaults, equality, pickling) and PoolView is a plain class.
TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import NamedTuple, Protocol

    class _Fields(NamedTuple):
        container_id: str  # CRD: id
        podref: str  # CRD: podref, "namespace/name" ("" when the runtime gave no pod)
        ifname: str  # CRD: ifname
        pod_uid: str = ""  # pycni: K8S_POD_UID when the runtime passed it
        network: str = ""  # pycni: the CNI network name (conf "name"); GC only touches its own network
        node: str = ""  # pycni: the node that allocated it; GC of a cluster store only touches its node
else:
    Protocol = object
    _Fields = namedtuple(
        "_Fields", ("container_id", "podref", "ifname", "pod_uid", "network", "node"),
        defaults=("", "", ""), module=__name__,
    )  # fmt: skip


class Allocation(_Fields):
    """Who holds an address (the fields: _Fields above). A tuple (not a dataclass): pools of 100,000 are
    built from rows."""

    __slots__ = ()

    def same_attachment(self, other: Allocation) -> bool:
        """The CNI identity: (container id, ifname)."""
        return self.container_id == other.container_id and self.ifname == other.ifname

    def same_pod_interface(self, other: Allocation) -> bool:
        """Same pod and interface (a kubelet re-ADD with a new sandbox); needs a pod reference."""
        return bool(self.podref) and self.podref == other.podref and self.ifname == other.ifname

    def bare(self) -> Allocation:
        """Without pycni's extras: what a pool entry holds where its reservation carries them (lean pools,
        ipam.engine)."""
        return Allocation(self.container_id, self.podref, self.ifname)

    def has_extras(self) -> bool:
        """Whether it carries any of pycni's extras (pod UID, network, node)."""
        return bool(self.pod_uid or self.network or self.node)

    @property
    def attachment(self) -> Attachment:
        return self.container_id, self.ifname


Attachment = tuple[str, str]  # (container id, ifname): Allocation.same_attachment's key


def by_attachment(owners: Iterable[Allocation]) -> dict[Attachment, Allocation]:
    """Reservation owners by attachment, those with extras only: what `joined` looks entries up in."""
    return {o.attachment: o for o in owners if o.container_id and o.has_extras()}


def joined(entry: Allocation, extras: Mapping[Attachment, Allocation]) -> Allocation:
    """A pool entry with the extras its attachment's reservation carries, when the entry has none (a lean
    pool's, or upstream's: whose reservations name no container, so nothing matches)."""
    if entry.has_extras():
        return entry
    owner = extras.get(entry.attachment)
    if owner is None:
        return entry
    return entry._replace(pod_uid=owner.pod_uid, network=owner.network, node=owner.node)


@valueclass
class Pool:
    """A snapshot of one pool. `version` None: the pool is not stored yet (commit creates it)."""

    name: str
    range: str
    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    version: str | None = None
    shared: bool = False  # several nodes write it: its writes take turns (ipam.turn)


@valueclass
class PoolUpdate:
    """A change to a pool, computed from a snapshot: offsets to set (add or replace) and to remove."""

    put: Mapping[str, Allocation] = field(default_factory=dict)
    remove: frozenset[str] = frozenset()
    # the write must find the whole pool still at the version it was computed from, also on a store that
    # merges entry by entry (ipam.store.base): for a decision taken on a snapshot that may miss others' writes
    whole: bool = False
    # the node whose ADDs and DELs this writes ("": another writer: GC, the reconciler, the pod watch). A
    # node's writes of a pool other nodes write too go through the pool's turn (ipam.turn)
    writer: str = ""

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

    def holder(self, offset: int) -> Allocation | None:
        """Who holds `offset` in the pool (None: nobody, or no entry to name)."""
        ...
