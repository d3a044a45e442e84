"""Persistent addresses through IPAMClaim (k8s.cni.cncf.io/v1alpha1, k8snetworkplumbingwg/ipamclaims): the
plugin side. Imported only for a network whose config has top-level `"allowPersistentIPs": true` (what
KubeVirt's ipam-extensions reads to create a claim per VM network); every other call is as before.

Where the claim comes from (Multus hands a delegate no `ipam-claim-reference`: its selection-element type
has no such field, in every Multus of 2026): `args.cni["ipam-claim-reference"]` (a selection element's
`cni-args`, which Multus merges into `args.cni`), else the pod's own `k8s.v1.cni.cncf.io/networks`
annotation, read with one GET of the pod (K8S_POD_NAMESPACE/NAME), as OVN-Kubernetes reads it. The
element is the one Multus made this attachment from: the one whose `interface` is CNI_IFNAME, else the
one without an `interface` whose position gives Multus' default name `net<position>` (Multus counts
the cluster network as 0; `defaultNetworks` in Multus' own config would shift it). The claim lives in
the pod's namespace (an IPAMClaim reference is a name).

What an ADD with a claim does (`resolve`, then ipam.engine, then `settle`):
- GET the claim. Absent: code 11 (ipam-extensions creates it beside the pod; the runtime retries), and
  so is a cluster without the CRD, with a message saying so. `spec.network` must be this config's
  `name` and a set `spec.interface` must be CNI_IFNAME, else code 7: never a silent new address.
- The owner is the claim (ipam.claimref); `status.ips`, when set, are the addresses to take, exactly as
  requested addresses are taken (ipam.requested: the same rules, code 7 naming `status.ips[i]`). Without
  them the claim's first allocation takes a requested address (`ips`) or the lowest free one.
- After the pool write, `status.ips` (and `ownerPod`) are written when they differ from what the claim
  got: a JSON merge patch of the status carrying the resourceVersion read (compare-and-swap: 409 is
  read again and decided again).
- A record of the claim in this node's state directory (`claims/<uid>`, beside the pool locks): what
  the agent's claim watch (ipam.claimwatch) frees when the claim is deleted.

DEL of an attachment whose pod names a claim frees nothing (`holds`): the claim keeps its addresses
until it is deleted. CHECK looks for the claim's entry."""

from __future__ import annotations

import contextlib
import ipaddress
import os

from cni import jsonio, log
from cni.errors import ConfigError, DecodeError, TryAgainError
from cni.types.netconf import Request
from cni.types.valueclass import field, valueclass
from ipam import kubeapi, rbac, requested
from ipam.claimref import ClaimRef, claim_owner
from ipam.config import IpamConfig
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.model import Allocation
from ipam.ranges import IPRange

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

    from ipam.store.base import Store

FIELD = "allowPersistentIPs"  # top level of the network config, as ipam-extensions reads it
ARG = "ipam-claim-reference"
NETWORKS = "k8s.v1.cni.cncf.io/networks"
GROUP, VERSION, RESOURCE, STATUS = "k8s.cni.cncf.io", "v1alpha1", "ipamclaims", "ipamclaims/status"
MERGE_PATCH = "application/merge-patch+json"
TRIES = 5  # status writes lost to another writer before the ADD gives up (code 11)
RECORDS = "claims"  # the node's records, beside pool-locks/ (docs/ipam.md)


def persistent(req: Request) -> bool:
    """Whether the network allows persistent addresses (top-level `allowPersistentIPs`)."""
    value = req.conf.get(FIELD, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{FIELD}: expected true or false, got {jsonio.dumps(value).decode()[:60]}")
    return value


@valueclass
class Claim:
    ref: ClaimRef
    version: str
    network: str
    interface: str
    ips: tuple[str, ...] = ()
    owner_pod: str = ""

    @classmethod
    def parse(cls, doc: dict[str, Any]) -> Claim:
        meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
        status = doc.get("status") or {}
        owner = status.get("ownerPod") or {}
        ref = ClaimRef(str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", "")))
        ips = tuple(str(ip) for ip in status.get("ips") or ())
        name = str(owner.get("name", "")) if isinstance(owner, dict) else ""
        network, interface = str(spec.get("network", "")), str(spec.get("interface", ""))
        return cls(ref, str(meta.get("resourceVersion", "")), network, interface, ips, name)


def claim_path(namespace: str, name: str, status: bool = False) -> str:
    return kubeapi.path_of(GROUP, VERSION, namespace, RESOURCE, name) + ("/status" if status else "")


def get_claim(client: Client, role: str, namespace: str, name: str) -> Claim | None:
    """The claim; None when there is none. TryAgainError when the API cannot tell, or does not serve
    IPAMClaims (the CRD is not installed)."""
    rbac.require(role, GROUP, RESOURCE, "get")
    try:
        return Claim.parse(client.request("GET", claim_path(namespace, name)))
    except ApiError as e:
        if e.status == 404 and e.reason == "NotFound":
            return None
        if e.status == 404:
            raise TryAgainError(
                f"IPAMClaim {namespace}/{name}: the API server does not serve {RESOURCE}.{GROUP}",
                "install the IPAMClaim CRD (k8snetworkplumbingwg/ipamclaims), or drop allowPersistentIPs",
            ) from None
        raise TryAgainError(f"kubernetes: get IPAMClaim {namespace}/{name}: {e}") from None
    except Unreachable as e:
        raise TryAgainError(f"kubernetes: get IPAMClaim {namespace}/{name}: {e}") from None


class Conflict(Exception):
    """The claim changed since it was read (409)."""


def write_status(client: Client, role: str, claim: Claim, ips: list[str], pod: str) -> None:
    """status.ips and status.ownerPod, if the claim is still at the version read (Conflict if not)."""
    rbac.require(role, GROUP, STATUS, "patch")
    status: dict[str, Any] = {"ips": ips}
    if pod:
        status["ownerPod"] = {"name": pod}
    body = {"metadata": {"resourceVersion": claim.version}, "status": status}
    what = f"IPAMClaim {claim.ref} status"
    try:
        client.request("PATCH", claim_path(claim.ref.namespace, claim.ref.name, True), body,
                       content_type=MERGE_PATCH)  # fmt: skip
    except ApiError as e:
        if e.status == 409:
            raise Conflict(what) from None
        if e.status == 404:
            raise TryAgainError(f"{what}: the claim was deleted meanwhile") from None
        raise TryAgainError(f"kubernetes: patch {what}: {e}") from None
    except Unreachable as e:
        raise TryAgainError(f"kubernetes: patch {what}: {e}") from None


# ---- which claim this attachment names -------------------------------------------------------------


def element_for(text: str, ifname: str) -> dict[str, Any] | None:
    """The network selection element of the pod annotation `text` that Multus made the attachment
    `ifname` from (module docstring), None when none is. The comma-separated form names no claim."""
    if not text.strip() or not any(c in text for c in '[{"'):
        return None
    try:
        items = jsonio.loads(text, f"pod annotation {NETWORKS}")
    except DecodeError as bad:  # Multus itself fails such a pod: we are not called for it
        raise ConfigError(bad.msg, bad.details) from None
    if not isinstance(items, list):
        raise ConfigError(f"pod annotation {NETWORKS}: expected a list of network selection elements")
    elements = [e if isinstance(e, dict) else {} for e in items]
    for e in elements:
        if e.get("interface") == ifname:
            return e
    for i, e in enumerate(elements):
        if not e.get("interface") and f"net{i + 1}" == ifname:
            return e
    return None


def pod_annotation(client: Client, role: str, namespace: str, name: str) -> str | None:
    """The pod's k8s.v1.cni.cncf.io/networks ("" without one); None when the pod does not exist. A GET
    with resourceVersion 0: the API server answers from its cache (the annotation is the webhook's,
    written when the pod was created; the kubelet learned of the pod from such a cache). A cache that
    does not have the pod (another API server's, lagging) is asked again from storage."""
    rbac.require(role, "", "pods", "get")
    path = kubeapi.path_of("", "v1", namespace, "pods", name)
    pod = None
    for query in ({"resourceVersion": "0"}, None):
        try:
            pod = client.request("GET", path, query=query)
            break
        except ApiError as e:
            if e.status != 404:
                raise TryAgainError(f"kubernetes: get pod {namespace}/{name}: {e}") from None
        except Unreachable as e:
            raise TryAgainError(f"kubernetes: get pod {namespace}/{name}: {e}") from None
    if pod is None:
        return None
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    text = notes.get(NETWORKS, "") if isinstance(notes, dict) else ""
    return text if isinstance(text, str) else ""


def reference(req: Request, client: Client, role: str) -> tuple[str, str] | None:
    """(claim name, where it was found) for this attachment, None when it names none: args.cni first
    (no request), else the pod's annotation (one GET)."""
    args = req.cni_args()
    if ARG in args:
        value = args[ARG]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"args.cni.{ARG}: expected the name of an IPAMClaim")
        return value, f"args.cni.{ARG}"
    ns, name = req.args.pod_namespace, req.args.pod_name
    if not ns or not name:
        return None
    text = pod_annotation(client, role, ns, name)
    element = element_for(text, req.ifname) if text else None
    if element is None or element.get(ARG) in (None, ""):
        return None
    value = element[ARG]
    if not isinstance(value, str):
        raise ConfigError(f"pod {ns}/{name} annotation {NETWORKS}: {ARG}: expected a name")
    return value, f"pod {ns}/{name} annotation {NETWORKS}"


def kube_client(conf: IpamConfig, store: Store) -> tuple[Client, str]:
    """The Kubernetes store's client and role: an IPAMClaim is a Kubernetes object, so persistent
    addresses need that store (code 7 otherwise), and whole ranges (node slices are per node, a VM
    migrates)."""
    if conf.store.datastore != "kubernetes":
        raise ConfigError(
            f"{FIELD}: needs the kubernetes datastore (this config uses {conf.store.datastore})"
        )
    if conf.node_slice_size:
        raise ConfigError(f"{FIELD}: not with node_slice_size (a node's slice would pin the VM's address "
                          "to that node)")  # fmt: skip
    from ipam.store.kube import KubeStore

    if not isinstance(store, KubeStore):
        raise ConfigError(f"{FIELD}: needs the kubernetes datastore")
    return store.client, store.role


# ---- ADD ----------------------------------------------------------------------------------------------


@valueclass
class Claimed:
    """An attachment whose addresses are its claim's."""

    claim: Claim
    owner: Allocation
    want: dict[int, int] = field(default_factory=dict)  # range index -> offset (ipam.requested.place)
    held: frozenset[int] = frozenset()  # range indexes whose address the claim already holds


def _addresses(claim: Claim) -> tuple[requested.Wanted, ...]:
    out = []
    for i, text in enumerate(claim.ips):
        path = f"IPAMClaim {claim.ref} status.ips[{i}]"
        try:
            ip = ipaddress.ip_interface(text).ip if "/" in text else ipaddress.ip_address(text)
        except ValueError:
            raise ConfigError(f"{path}: {text!r} is not an address") from None
        out.append(requested.Wanted(ip, None, path))
    return tuple(out)


def resolve(req: Request, conf: IpamConfig, store: Store, want: tuple[requested.Wanted, ...]
            ) -> Claimed | None:  # fmt: skip
    """The claim this attachment names and what the ADD takes from it (module docstring); None when it
    names none (an ADD as any other)."""
    client, role = kube_client(conf, store)
    found = reference(req, client, role)
    if found is None:
        return None
    name, where = found
    ns = req.args.pod_namespace
    if not ns:
        raise ConfigError(
            f"{where}: {ARG} {name!r} needs K8S_POD_NAMESPACE in CNI_ARGS (the claim's namespace)"
        )
    claim = get_claim(client, role, ns, name)
    if claim is None:
        raise TryAgainError(f"IPAMClaim {ns}/{name} ({where}) does not exist (yet)",
                            "ipam-extensions creates it for the VM; nothing allocated")  # fmt: skip
    check_spec(claim, req)
    owner = claim_owner(claim.ref, req.args.pod_ref, claim.interface, req.name)
    held = _addresses(claim)
    if held and want and {w.address for w in want} != {w.address for w in held}:
        asked = ", ".join(str(w.address) for w in want)
        raise ConfigError(f"{want[0].path}: {asked}: IPAMClaim {claim.ref} holds "
                          f"{', '.join(claim.ips)} (status.ips)")  # fmt: skip
    placed = requested.place(conf.ranges, conf.gateway, held or want)
    return Claimed(claim, owner, placed, frozenset(placed) if held else frozenset())


def check_spec(claim: Claim, req: Request) -> None:
    """Code 7 for a claim made for another network or interface: never a silent new address."""
    if claim.network != req.name:
        raise ConfigError(f"IPAMClaim {claim.ref}: spec.network {claim.network!r} is not this network "
                          f"({req.name!r}, the config's name)")  # fmt: skip
    if claim.interface and claim.interface != req.ifname:
        raise ConfigError(f"IPAMClaim {claim.ref}: spec.interface {claim.interface!r} is not this "
                          f"attachment's interface {req.ifname!r}")  # fmt: skip


class Diverged(TryAgainError):
    """The claim's status.ips were set to other addresses while this ADD allocated."""


def _parsed(items: tuple[str, ...] | list[str]) -> set[str]:
    return {str(ipaddress.ip_interface(t).ip) for t in items if t}


def _same(ips: tuple[str, ...] | list[str], other: list[str]) -> bool:
    try:
        return _parsed(ips) == _parsed(other)
    except ValueError:
        return False


def _within(ips: tuple[str, ...], other: list[str]) -> bool:
    """Whether the claim's addresses are among `other` (a claim of fewer ranges than the config has now
    gets the new ranges' addresses added)."""
    try:
        return _parsed(ips) <= _parsed(other)
    except ValueError:
        return False


def settle(claimed: Claimed, got: list[tuple[IPRange, int]], req: Request, store: Store,
           conf: IpamConfig) -> None:  # fmt: skip
    """After the pool write: the node's record of the claim, then the claim's status.ips (and ownerPod)
    written if they differ from what it got (compare-and-swap, read again on 409)."""
    client, role = kube_client(conf, store)
    record(records_dir(conf), claimed.claim.ref)  # first: the entry exists whatever becomes of the status
    ips = [str(rng.interface(offset)) for rng, offset in got]
    claim = claimed.claim
    for _ in range(TRIES):
        if _same(claim.ips, ips):
            break
        if not _within(claim.ips, ips):
            raise Diverged(f"IPAMClaim {claim.ref}: status.ips became {', '.join(claim.ips)} while this "
                           f"ADD allocated {', '.join(ips)}")  # fmt: skip
        try:
            write_status(client, role, claim, ips, req.args.pod_name)
            log.info("IPAMClaim %s: status.ips %s", claim.ref, ", ".join(ips))
            break
        except Conflict:
            again = get_claim(client, role, claim.ref.namespace, claim.ref.name)
            if again is None or again.ref.uid != claim.ref.uid:
                raise TryAgainError(
                    f"IPAMClaim {claim.ref} was deleted or recreated during this ADD"
                ) from None
            claim = again
    else:
        raise TryAgainError(f"IPAMClaim {claim.ref}: status not written ({TRIES} conflicts)")


# ---- the node's records (ipam.claimwatch reads them) ----------------------------------------------------


def records_dir(conf: IpamConfig) -> str:
    return os.path.join(os.path.dirname(conf.store.local_db), RECORDS)


def record(directory: str, ref: ClaimRef) -> None:
    """Note that this node allocated for `ref` (file `<uid>` holding "namespace/name"). Without the note
    the claim's deletion is left to the reconciler: logged, never an error."""
    path = os.path.join(directory, ref.uid)
    if os.path.exists(path):
        return
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{ref.namespace}/{ref.name}\n")
        os.replace(tmp, path)
    except OSError as e:
        log.warning("IPAMClaim %s: no record in %s (%s): its deletion is left to the reconciler", ref,
                    directory, e.strerror or e)  # fmt: skip
        with contextlib.suppress(OSError):
            os.unlink(f"{path}.{os.getpid()}.tmp")


# ---- DEL, CHECK -----------------------------------------------------------------------------------------


def holds(req: Request, conf: IpamConfig, store: Store) -> str:
    """DEL: the claim this attachment names ("" when none): its addresses stay the claim's. A DEL on
    another store than Kubernetes names none (DEL never fails on config an ADD refused)."""
    if conf.store.datastore != "kubernetes" or conf.node_slice_size:
        return ""
    client, role = kube_client(conf, store)
    found = reference(req, client, role)
    return found[0] if found else ""
