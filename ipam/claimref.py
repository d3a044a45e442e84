"""An address owned by an IPAMClaim (k8s.cni.cncf.io/v1alpha1, ipam.claims) as pool entries and
reservations record it, pure: no request, no store.

Upstream's CRDs keep three fields of an owner (IPPool entry: `id`, `podref`, `ifname`; reservation:
`containerid`, `podref`, `ifname`) and prune anything else, so the claim is written where the container
id goes: `ipamclaim/<namespace>/<name>/<uid>`. No container id has that form, so

- the CNI identity (container id, interface) of a claim's entry is the claim's: every pod that holds
  the claim (a VM's launcher pod restarted under a new name, the two pods of a live migration) finds it
  as its own ("existing", ipam.decide) and none of their DELs matches it;
- its `ifname` is the claim's `spec.interface` (ipam-extensions leaves it empty), not the pod's
  interface, so the identity does not change with the interface a pod gives it;
- its `podref` is the pod that allocated it first (what `kubectl get ippools` shows; not rewritten);
- it records no pod UID and no node (a claim outlives pods and moves between nodes): CNI GC, which
  judges an attachment of its own node, and the pod watch, which judges pod UIDs and node-recorded
  entries, never pick it; the network is recorded (the CNI network name, as for any entry).

The reconciler (ipam.reconciler) judges such an owner by its claim, never by its pod: kept while an
IPAMClaim of that namespace, name and UID exists, freed once it is gone (deleted, or recreated under the
same name: a new UID)."""

from __future__ import annotations

from cni.types.valueclass import valueclass
from ipam.model import Allocation

PREFIX = "ipamclaim/"


@valueclass
class ClaimRef:
    namespace: str
    name: str
    uid: str

    @property
    def marker(self) -> str:
        """What a claim-owned entry holds in place of a container id."""
        return f"{PREFIX}{self.namespace}/{self.name}/{self.uid}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def claim_of(owner: Allocation) -> ClaimRef | None:
    """The claim that owns an entry or reservation, None for an attachment's."""
    cid = owner.container_id
    if not cid.startswith(PREFIX):
        return None
    parts = cid[len(PREFIX) :].split("/")
    if len(parts) != 3 or not all(parts):
        return None
    return ClaimRef(*parts)


def claim_owner(ref: ClaimRef, podref: str, interface: str, network: str) -> Allocation:
    """The owner a claim's ADD allocates as (see the module docstring)."""
    return Allocation(ref.marker, podref, interface, "", network, "")
