"""Persistent addresses through IPAMClaim (issue 46) on the session's real kube-apiserver with the upstream
IPAMClaim CRD (../shared/upstream/ipamclaims, installed here: kube-up does not), bundler/manifests/rbac.yaml
as shipped and the node's and the reconciler's ServiceAccount tokens. Claims and launcher pods are written
exactly as KubeVirt's ipam-extensions writes them (its `vmi_controller.go` and `podmutator.go`): the
claim `<vm>.<network>` owned by the VM, with the finalizer `kubevirt.io/persistent-ipam`, the label
`kubevirt.io/vm`, `spec.network` = the NAD config's name and `spec.interface` empty; the pod's
`k8s.v1.cni.cncf.io/networks` entry re-marshalled by the webhook with `ipam-claim-reference`, naming
KubeVirt's interface `pod<sha256(network)[:11]>`. The IPAM runs in this process through skel (the code
of `python -m cni whereabouts`).

No kubelet here: pods are API objects that stay as written; a launcher pod "restarted" is another pod
object. The claim watch's sweeps are awaited through its report callback, never by time."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni.errors import Code
from cni.skel import parse_request
from ipam import batch, claims, cli, combiner, config
from ipam.claimref import ClaimRef, claim_owner
from ipam.claimwatch import ClaimWatch, Records, open_claim_watch
from ipam.kubeapi import Client, load_kubeconfig
from ipam.kubepods import KubePodSource
from ipam.podwatch import ScopedReconciler
from ipam.reconciler import Report
from tests.concurrency.harness import Att, run_inline
from tests.kubeapi import wbupstream
from tests.kubeapi.factory import open_kube
from tests.kubeup import IPAMCLAIM_CRD, KubeServer, Tenant, unpack

NET = "blue"  # the NAD's name and its config's `name`: what ipam-extensions writes as spec.network
VM_NETWORK = "tenantred"  # the VM's network (spec.networks[].name), part of the claim's name
RANGE = "198.51.100.0/24"
POOL = "198.51.100.0-24"
GROUP = "/apis/k8s.cni.cncf.io/v1alpha1"
RESOURCES = ("pods", "ipamclaims", "ippools", "overlappingrangeipreservations")
WAIT = 60.0  # seconds at most for a sweep the test awaits (it normally takes well under one)


def kubevirt_interface(network: str) -> str:
    """The pod interface KubeVirt names for a VM network (`pod` + 11 hex digits of its SHA-256)."""
    return "pod" + hashlib.sha256(network.encode()).hexdigest()[:11]


IFACE = kubevirt_interface(VM_NETWORK)


@pytest.fixture
def crd(kube: KubeServer) -> KubeServer:
    kube.install_crd(IPAMCLAIM_CRD)
    return kube


class Node:
    """One test node: a flat file naming the Kubernetes store with the node's kubeconfig, node-local
    state (pool locks, claim records) in tmp, and the NAD's config."""

    def __init__(self, tenant: Tenant, tmp: Path, node_kubeconfig: Path | None = None) -> None:
        self.tenant, self.ns = tenant, tenant.namespace
        self.uids: dict[str, str] = {}  # sandbox id -> the UID of its pod
        self.flat = tmp / "whereabouts.d" / "whereabouts.conf"
        self.flat.parent.mkdir(parents=True, exist_ok=True)
        self.state = tmp / "state"
        self.flat.write_text(json.dumps({
            "datastore": "kubernetes", "kubernetes": {"kubeconfig": str(node_kubeconfig or tenant.node)},
            "local_db": str(self.state / "whereabouts.db")}))  # fmt: skip

    def conf(self, persistent: bool = True, **ipam: Any) -> dict[str, Any]:
        ipam = ipam or {"range": RANGE}
        out: dict[str, Any] = {"cniVersion": "1.0.0", "name": NET, "type": "macvlan",
                               "ipam": {"type": "whereabouts", "configuration_path": str(self.flat), **ipam}}
        if persistent:
            out["allowPersistentIPs"] = True
        return out

    @property
    def records(self) -> Path:
        return self.state / "claims"

    # ---- objects as KubeVirt and ipam-extensions write them ----------------------------------------

    def claim(self, vm: str, network: str = NET, name: str = "") -> dict[str, Any]:
        """The IPAMClaim ipam-extensions' VMI controller creates for `vm`'s network VM_NETWORK."""
        obj = {
            "apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
            "metadata": {
                "name": name or f"{vm}.{VM_NETWORK}", "namespace": self.ns,
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "name": vm,
                                     "uid": str(uuid.uuid4()), "controller": True,
                                     "blockOwnerDeletion": True}],
                "finalizers": ["kubevirt.io/persistent-ipam"],
                "labels": {"kubevirt.io/vm": vm},
            },
            "spec": {"network": network, "interface": ""},
        }  # fmt: skip
        made: dict[str, Any] = self.tenant.server.create(f"{GROUP}/namespaces/{self.ns}/ipamclaims", obj)
        return made

    def get_claim(self, name: str) -> dict[str, Any]:
        path = f"{GROUP}/namespaces/{self.ns}/ipamclaims/{name}"
        got: dict[str, Any] = self.tenant.server.request("GET", path)
        return got

    def delete_claim(self, name: str) -> None:
        """The VM deleted: the garbage collector deletes the claim (its finalizer keeps it), then
        ipam-extensions removes the finalizer once the VMI is gone."""
        path = f"{GROUP}/namespaces/{self.ns}/ipamclaims/{name}"
        self.tenant.server.request("DELETE", path)
        self.tenant.server.request("PATCH", path, {"metadata": {"finalizers": None}},
                                   content_type="application/merge-patch+json")  # fmt: skip

    def launcher(self, name: str, vm: str, claim: str | None = None, ips: list[str] | None = None,
                 iface: str = IFACE) -> Att:  # fmt: skip
        """A virt-launcher pod of `vm` as the webhook leaves it: its networks annotation re-marshalled
        (Go's encoding/json of []*NetworkSelectionElement: compact, the struct's field order) with
        ipam-claim-reference; the attachment the kubelet then ADDs (a fresh sandbox id)."""
        element: dict[str, Any] = {"name": NET, "namespace": self.ns}
        if ips:
            element["ips"] = ips
        element["interface"] = iface
        if claim is not None:
            element["ipam-claim-reference"] = claim
        notes = {"kubevirt.io/domain": vm,
                 "k8s.v1.cni.cncf.io/networks": json.dumps([element], separators=(",", ":"))}  # fmt: skip
        pod = self.tenant.create_pod(name, annotations=notes)
        att = Att(uuid.uuid4().hex * 2, iface, f"{self.ns}/{name}")
        self.uids[att.cid] = pod["metadata"]["uid"]
        return att

    def call(self, cmd: str, att: Att, conf: dict[str, Any] | None = None, **extra: Any) -> tuple[int, Any]:
        env = att.env(cmd)
        uid = self.uids.get(att.cid, f"uid-{att.cid}")
        env["CNI_ARGS"] = env["CNI_ARGS"].replace(f"K8S_POD_UID=uid-{att.cid}", f"K8S_POD_UID={uid}")
        return run_inline(env, {**(conf or self.conf()), **extra})

    def add(self, att: Att, conf: dict[str, Any] | None = None, **extra: Any) -> str:
        rc, out = self.call("ADD", att, conf, **extra)
        assert rc == 0, out
        return str(out["ips"][0]["address"])

    # ---- what the store holds ----------------------------------------------------------------------

    def entries(self) -> dict[str, dict[str, Any]]:
        return self.entries_of(POOL)

    def entries_of(self, pool: str) -> dict[str, dict[str, Any]]:
        return self.tenant.pools().get(pool, {})

    def reserved(self) -> dict[str, dict[str, Any]]:
        return self.tenant.reservations()


@pytest.fixture
def node(tenant: Tenant, tmp_path: Path) -> Node:
    return Node(tenant, tmp_path)


def marker(claim: dict[str, Any]) -> str:
    m = claim["metadata"]
    return f"ipamclaim/{m['namespace']}/{m['name']}/{m['uid']}"


def spent(server: KubeServer, fn: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """What `fn` returned and the requests it made on pods, claims, pools and reservations, as the API
    server counts them ("VERB resource": n; a claim's status is the resource `ipamclaims`)."""
    before = server.request_counts()
    out = fn()
    counts: dict[str, int] = {}
    for (verb, resource, code), n in server.request_counts().items():
        if resource in RESOURCES and n > before.get((verb, resource, code), 0):
            key = f"{verb} {resource}"
            counts[key] = counts.get(key, 0) + int(n - before.get((verb, resource, code), 0))
    return out, counts


# ---- no CRD ----------------------------------------------------------------------------------------------


def test_without_the_crd_only_a_pod_naming_a_claim_fails_and_clearly(kube: KubeServer, tenant: Tenant,
                                                                      tmp_path: Path) -> None:  # fmt: skip
    """A cluster without the IPAMClaim CRD keeps working as before (also with allowPersistentIPs for a
    pod that names no claim); a pod that names a claim on a NAD that allows persistent IPs gets code 11
    saying what is missing, and nothing is allocated."""
    kube.remove_crd(IPAMCLAIM_CRD)  # installed by another test of the session: this one needs it absent
    node = Node(tenant, tmp_path)
    plain = node.launcher("virt-launcher-vm-a-1", "vm-a")  # no claim reference
    named = node.launcher("virt-launcher-vm-b-1", "vm-b", claim=f"vm-b.{VM_NETWORK}")
    assert node.add(plain) == "198.51.100.1/24"
    assert node.add(plain, node.conf(persistent=False)) == "198.51.100.1/24"
    rc, out = node.call("ADD", named)
    assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER, out
    assert "does not serve ipamclaims.k8s.cni.cncf.io" in out["msg"] and "CRD" in out["details"], out
    assert node.add(named, node.conf(persistent=False)) == "198.51.100.2/24"  # the NAD does not ask
    assert node.call("DEL", named, node.conf(persistent=False))[0] == 0
    assert node.call("DEL", plain)[0] == 0
    assert node.entries() == {}
    assert node.call("DEL", named)[0] == 0  # a DEL never fails for want of the CRD


# ---- ADD, DEL, CHECK -------------------------------------------------------------------------------------


@pytest.fixture(params=["plugin", "agent"])
def mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """The calls as a plugin process makes them, or through the agent's pool batches (ipam.batch)."""
    if request.param == "agent":
        batch.install()
    try:
        yield str(request.param)
    finally:
        if request.param == "agent":
            assert combiner.settle_all(30)
            batch.uninstall()


def test_a_vm_keeps_its_address_across_restarts_and_a_live_migration(crd: KubeServer, node: Node,
                                                                     mode: str) -> None:  # fmt: skip
    other = node.launcher("web-1", "none")  # an ordinary pod of the same network, before and after
    claim = node.claim("vm-a")
    first = node.launcher("virt-launcher-vm-a-x1", "vm-a", claim=claim["metadata"]["name"])
    assert node.add(first) == "198.51.100.1/24"
    assert node.add(other) == "198.51.100.2/24"
    got = node.get_claim(claim["metadata"]["name"])
    assert got["status"] == {"ips": ["198.51.100.1/24"], "ownerPod": {"name": "virt-launcher-vm-a-x1"}}
    # the pool entry and its reservation name the claim (fields upstream's CRDs keep), no container
    assert node.entries()["1"] == {"id": marker(claim), "podref": first.pod, "ifname": ""}
    assert node.reserved()["198.51.100.1"] == {
        "containerid": marker(claim), "podref": first.pod, "ifname": ""}
    assert node.add(first) == "198.51.100.1/24"  # repeated ADD
    assert node.call("CHECK", first)[0] == 0

    # the VM restarted: the launcher pod's DEL frees nothing, the pod goes, a new one (new name, UID)
    assert node.call("DEL", first)[0] == 0
    assert node.entries()["1"]["id"] == marker(claim) and "198.51.100.1" in node.reserved()
    node.tenant.delete_pod("virt-launcher-vm-a-x1")
    second = node.launcher("virt-launcher-vm-a-x2", "vm-a", claim=claim["metadata"]["name"])
    assert node.add(second) == "198.51.100.1/24"

    # a live migration: the target pod holds the claim too, the source's DEL frees nothing
    target = node.launcher("virt-launcher-vm-a-x3", "vm-a", claim=claim["metadata"]["name"])
    assert node.add(target) == "198.51.100.1/24"
    assert node.call("DEL", second)[0] == 0
    node.tenant.delete_pod("virt-launcher-vm-a-x2")
    assert node.call("CHECK", target)[0] == 0
    assert node.entries()["1"]["id"] == marker(claim)
    assert node.reserved()["198.51.100.1"]["containerid"] == marker(claim)

    # no other pod is ever handed it
    assert node.add(node.launcher("web-2", "none")) == "198.51.100.3/24"
    assert node.get_claim(claim["metadata"]["name"])["status"]["ips"] == ["198.51.100.1/24"]


def test_a_dual_stack_claim_keeps_both_and_a_failed_range_never_frees_the_other(
    crd: KubeServer, node: Node
) -> None:
    dual = node.conf(ipRanges=[{"range": RANGE}, {"range": "2001:db8::/64"}])
    claim = node.claim("vm-d")
    name = claim["metadata"]["name"]
    first = node.launcher("virt-launcher-vm-d-1", "vm-d", claim=name)
    rc, out = node.call("ADD", first, dual)
    assert rc == 0 and [i["address"] for i in out["ips"]] == ["198.51.100.1/24", "2001:db8::1/64"], out
    assert node.get_claim(name)["status"]["ips"] == ["198.51.100.1/24", "2001:db8::1/64"]
    # the claim's IPv6 address taken by someone else behind the IPAM's back (the entry and its
    # reservation removed by hand, another pod allocated there): the next ADD of the claim fails on it
    # (code 109 naming the holder), and its IPv4 address, which the claim holds, stays the claim's
    v6pool = "2001-db8---64"
    path = node.tenant.path("ippools", v6pool)
    node.tenant.server.request("PATCH", path, [{"op": "remove", "path": "/spec/allocations/1"}],
                               content_type="application/json-patch+json")  # fmt: skip
    node.tenant.server.request("DELETE", node.tenant.path("overlappingrangeipreservations", "2001-db8--1"))
    intruder = node.launcher("web-6", "none")
    rc, out = node.call("ADD", intruder, node.conf(persistent=False, ipRanges=[{"range": "2001:db8::/64"}]))
    assert rc == 0 and out["ips"][0]["address"] == "2001:db8::1/64", out
    again = node.launcher("virt-launcher-vm-d-2", "vm-d", claim=name)
    rc, out = node.call("ADD", again, dual)
    assert rc == 1 and out["code"] == Code.ADDRESS_TAKEN and "web-6" in out["msg"], out
    assert node.entries()["1"]["id"] == marker(claim) and "198.51.100.1" in node.reserved()


def test_the_status_is_written_with_compare_and_swap(crd: KubeServer, node: Node) -> None:
    """A claim changed since the ADD read it (a 409): read again and written; one whose status.ips
    someone else set meanwhile to other addresses: Diverged (code 11; the plugin frees what it took)."""
    made = node.claim("vm-q")
    name = made["metadata"]["name"]
    att = node.launcher("virt-launcher-vm-q-1", "vm-q", claim=name)
    conf = node.conf()
    req = parse_request("ADD", att.env("ADD"), json.dumps(conf).encode())
    ipam = config.load(conf["ipam"])
    store = open_kube(node.tenant.node)
    try:
        stale = claims.get_claim(store.client, store.role, node.ns, name)
        assert stale is not None and stale.ips == ()
        node.tenant.server.request("PATCH", f"{GROUP}/namespaces/{node.ns}/ipamclaims/{name}",
                                   {"metadata": {"labels": {"touched": "1"}}},
                                   content_type="application/merge-patch+json")  # fmt: skip
        owner = claim_owner(stale.ref, att.pod, "", NET)
        rng = ipam.ranges[0]
        _, counts = spent(node.tenant.server,
                          lambda: claims.settle(claims.Claimed(stale, owner), [(rng, 5)], req, store, ipam))
        assert counts == {"PATCH ipamclaims": 2, "GET ipamclaims": 1}, counts  # 409, read, written
        assert node.get_claim(name)["status"]["ips"] == ["198.51.100.5/24"]
        with pytest.raises(claims.Diverged) as err:
            claims.settle(claims.Claimed(stale, owner), [(rng, 6)], req, store, ipam)
        assert err.value.code == Code.TRY_AGAIN_LATER and "198.51.100.5/24" in err.value.msg
    finally:
        store.close()
    assert node.get_claim(name)["status"]["ips"] == ["198.51.100.5/24"]
    assert (node.records / stale.ref.uid).read_text() == f"{node.ns}/{name}\n"


def test_a_claim_of_another_network_or_interface_is_code_7(crd: KubeServer, node: Node) -> None:
    wrong_net = node.claim("vm-n", network="red")
    att = node.launcher("virt-launcher-vm-n-1", "vm-n", claim=wrong_net["metadata"]["name"])
    rc, out = node.call("ADD", att)
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG, out
    assert "spec.network 'red'" in out["msg"] and "'blue'" in out["msg"], out
    wrong_if = node.claim("vm-i")
    name = wrong_if["metadata"]["name"]
    path = f"{GROUP}/namespaces/{node.ns}/ipamclaims/{name}"
    node.tenant.server.request("PATCH", path, {"spec": {"interface": "net9"}},
                               content_type="application/merge-patch+json")  # fmt: skip
    att = node.launcher("virt-launcher-vm-i-1", "vm-i", claim=name)
    rc, out = node.call("ADD", att)
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG and "spec.interface 'net9'" in out["msg"], out
    node.tenant.server.request("PATCH", path, {"spec": {"interface": IFACE}},
                               content_type="application/merge-patch+json")  # fmt: skip
    assert node.add(att) == "198.51.100.1/24"  # the interface it names: fine
    missing = node.launcher("virt-launcher-vm-m-1", "vm-m", claim=f"vm-m.{VM_NETWORK}")
    rc, out = node.call("ADD", missing)
    assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER and "does not exist" in out["msg"], out
    assert set(node.entries()) == {"1"}
    assert "status" not in node.get_claim(wrong_net["metadata"]["name"])


def test_a_nad_without_persistent_ips_ignores_the_claim_and_never_writes_it(crd: KubeServer,
                                                                            node: Node) -> None:  # fmt: skip
    claim = node.claim("vm-p")
    att = node.launcher("virt-launcher-vm-p-1", "vm-p", claim=claim["metadata"]["name"])
    conf = node.conf(persistent=False)
    _, counts = spent(node.tenant.server, lambda: node.add(att, conf))
    assert node.entries()["1"]["id"] == att.cid
    assert "status" not in node.get_claim(claim["metadata"]["name"])
    assert not any(k.endswith((" pods", " ipamclaims")) for k in counts), counts
    assert node.call("DEL", att, conf)[0] == 0
    assert node.entries() == {}


def test_a_requested_address_is_the_claims_first_and_then_its_own(crd: KubeServer, node: Node) -> None:
    """A claim's first allocation may take a requested address (Multus sends a selection element's `ips`
    as runtimeConfig.ips and as CNI_ARGS IP), unique cluster-wide as any request; later the claim's
    addresses win, and a pod asking for another one is code 7."""
    taken = node.launcher("web-9", "none")
    plain = node.conf(persistent=False)
    assert node.add(taken, plain, runtimeConfig={"ips": ["198.51.100.9/24"]}) == "198.51.100.9/24"
    claim = node.claim("vm-r")
    name = claim["metadata"]["name"]
    att = node.launcher("virt-launcher-vm-r-1", "vm-r", claim=name, ips=["198.51.100.9/24"])
    rc, out = node.call("ADD", att, runtimeConfig={"ips": ["198.51.100.9/24"]})
    assert rc == 1 and out["code"] == Code.ADDRESS_TAKEN and "web-9" in out["msg"], out
    assert "status" not in node.get_claim(name)
    att = node.launcher("virt-launcher-vm-r-2", "vm-r", claim=name, ips=["198.51.100.7/24"])
    assert node.add(att, runtimeConfig={"ips": ["198.51.100.7/24"]}) == "198.51.100.7/24"
    assert node.get_claim(name)["status"]["ips"] == ["198.51.100.7/24"]
    restarted = node.launcher("virt-launcher-vm-r-3", "vm-r", claim=name)
    assert node.add(restarted) == "198.51.100.7/24"
    changed = node.launcher("virt-launcher-vm-r-4", "vm-r", claim=name, ips=["198.51.100.8/24"])
    rc, out = node.call("ADD", changed, runtimeConfig={"ips": ["198.51.100.8/24"]})
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG and "198.51.100.7/24" in out["msg"], out


def test_the_claim_from_cni_args_needs_no_pod(crd: KubeServer, node: Node) -> None:
    """`cni-args: {"ipam-claim-reference": ...}` reaches the IPAM as args.cni: no pod GET."""
    claim = node.claim("vm-c")
    att = Att(uuid.uuid4().hex * 2, "net1", f"{node.ns}/no-such-pod")
    args = {"args": {"cni": {"ipam-claim-reference": claim["metadata"]["name"]}}}
    addr, counts = spent(node.tenant.server, lambda: node.add(att, **args))
    assert addr == "198.51.100.1/24"
    assert "GET pods" not in counts, counts
    assert node.call("DEL", att, **args)[0] == 0
    assert node.entries()["1"]["id"] == marker(claim)


def test_what_a_claim_costs_an_add_and_a_del(crd: KubeServer, node: Node) -> None:
    """The requests a claim adds to ADD and DEL (the figures of docs/ipam.md): none without
    allowPersistentIPs; with it, one pod GET (from the API server's cache) for a pod naming no claim; for
    one naming a claim, a claim GET too, and a status PATCH on the claim's first allocation."""
    server = node.tenant.server
    plain = node.conf(persistent=False)
    warm = node.launcher("web-0", "none")
    node.add(warm, plain)  # the pool exists: every count below is of a steady pool
    rows: dict[str, dict[str, int]] = {}
    a = node.launcher("web-a", "none")
    rows["ADD, no allowPersistentIPs"] = spent(server, lambda: node.add(a, plain))[1]
    rows["DEL, no allowPersistentIPs"] = spent(server, lambda: node.call("DEL", a, plain))[1]
    b = node.launcher("web-b", "none")
    rows["ADD, allowPersistentIPs, no claim"] = spent(server, lambda: node.add(b))[1]
    rows["DEL, allowPersistentIPs, no claim"] = spent(server, lambda: node.call("DEL", b))[1]
    claim = node.claim("vm-k")
    name = claim["metadata"]["name"]
    c = node.launcher("virt-launcher-vm-k-1", "vm-k", claim=name)
    rows["ADD, claim, first allocation"] = spent(server, lambda: node.add(c))[1]
    rows["DEL, claim"] = spent(server, lambda: node.call("DEL", c))[1]
    d = node.launcher("virt-launcher-vm-k-2", "vm-k", claim=name)
    rows["ADD, claim, restart"] = spent(server, lambda: node.add(d))[1]
    print("\nrequests per call:\n" + "\n".join(f"  {k}: {v}" for k, v in rows.items()))
    for row in ("ADD, no allowPersistentIPs", "DEL, no allowPersistentIPs"):
        assert not any(k.endswith((" pods", " ipamclaims")) for k in rows[row]), rows
    assert rows["ADD, allowPersistentIPs, no claim"] == {**rows["ADD, no allowPersistentIPs"], "GET pods": 1}
    assert rows["DEL, allowPersistentIPs, no claim"] == {**rows["DEL, no allowPersistentIPs"], "GET pods": 1}
    first = rows["ADD, claim, first allocation"]
    assert (first["GET pods"], first["GET ipamclaims"], first["PATCH ipamclaims"]) == (1, 1, 1), rows
    assert rows["DEL, claim"] == {"GET pods": 1}, rows
    restart = rows["ADD, claim, restart"]
    assert (restart["GET pods"], restart["GET ipamclaims"]) == (1, 1) and "PATCH ipamclaims" not in restart
    assert "PATCH ippools" not in restart, rows  # the entry is the claim's already: nothing written


def test_gc_and_the_pod_watch_never_free_a_live_claims_address(crd: KubeServer, node: Node) -> None:
    """CNI GC with no valid attachment, and the pod watch's sweep of the launcher pod deleted (its UID
    known, and at the agent's start-up): the claim's entry and reservation stay; an ordinary pod's go."""
    claim = node.claim("vm-v")
    vm = node.launcher("virt-launcher-vm-v-1", "vm-v", claim=claim["metadata"]["name"])
    web = node.launcher("web-v", "none")
    node.add(vm)
    node.add(web, node.conf(persistent=False))
    gc = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni", "NODENAME": "node-1"}
    rc, out = run_inline(gc, {**node.conf(), "cniVersion": "1.1.0", "cni.dev/valid-attachments": []})
    assert rc == 0, out
    assert {a["id"] for a in node.entries().values()} == {marker(claim)}
    assert set(node.reserved()) == {"198.51.100.1"}
    web = node.launcher("web-w", "none")
    node.add(web, node.conf(persistent=False))
    for pod in ("virt-launcher-vm-v-1", "web-w"):
        node.tenant.delete_pod(pod)
    gone = {tuple(a.pod.split("/")): frozenset({node.uids[a.cid]}) for a in (vm, web)}
    store = open_kube(node.tenant.node)
    pods = KubePodSource(Client(load_kubeconfig(str(node.tenant.node))))
    try:
        report = ScopedReconciler(store, pods, gone, "node-1", {}).run()  # deleted, and not listed at start
    finally:
        store.close()
        pods.close()
    assert report.freed == 2 and not report.errors  # web-w's entry and reservation
    assert {a["id"] for a in node.entries().values()} == {marker(claim)}
    assert set(node.reserved()) == {"198.51.100.1"}


# ---- the claim deleted -----------------------------------------------------------------------------------


class Swept:
    """The claim watch's sweep reports, for a test to await the one covering a claim."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done: list[tuple[dict[str, ClaimRef], Report, float]] = []

    def __call__(self, gone: dict[str, ClaimRef], report: Report) -> None:
        with self.cond:
            self.done.append((dict(gone), report, time.monotonic()))
            self.cond.notify_all()

    def covering(self, uid: str) -> tuple[dict[str, ClaimRef], Report, float]:
        def found() -> tuple[dict[str, ClaimRef], Report, float] | None:
            return next((d for d in self.done if uid in d[0]), None)

        with self.cond:
            assert self.cond.wait_for(lambda: found() is not None, WAIT), f"no sweep of claim {uid}"
            got = found()
            assert got is not None
            return got


@pytest.fixture
def watching(node: Node) -> Iterator[tuple[ClaimWatch, Swept]]:
    swept = Swept()
    watch = open_claim_watch(str(node.flat), say=lambda line: None, idle=0.1, on_report=swept)
    watch.start()
    try:
        yield watch, swept
    finally:
        watch.close()


def test_the_claim_deleted_frees_its_address_within_seconds(
    crd: KubeServer, node: Node, watching: tuple[ClaimWatch, Swept]
) -> None:
    """ipam-extensions' deletion: the claim marked deleted (its finalizer keeps it: nothing freed), then
    its finalizer removed (the claim gone: its address and reservation freed by the node's claim watch)."""
    watch, swept = watching
    keep, doomed, sync = node.claim("vm-k"), node.claim("vm-g"), node.claim("vm-s")
    for claim, pod in ((keep, "virt-launcher-vm-k-1"), (doomed, "virt-launcher-vm-g-1"),
                       (sync, "virt-launcher-vm-s-1")):  # fmt: skip
        vm = claim["metadata"]["labels"]["kubevirt.io/vm"]
        node.add(node.launcher(pod, vm, claim=claim["metadata"]["name"]))
    assert sorted(p.name for p in node.records.iterdir()) == sorted(
        c["metadata"]["uid"] for c in (keep, doomed, sync))
    path = f"{GROUP}/namespaces/{node.ns}/ipamclaims/{doomed['metadata']['name']}"
    node.tenant.server.request("DELETE", path)  # marked deleted: a MODIFIED event, nothing freed
    # a claim deleted at once after it: its DELETED event comes after the other's MODIFIED one, so when its
    # sweep is done the watch has seen the first claim marked deleted, and freed nothing of it
    node.delete_claim(sync["metadata"]["name"])
    swept.covering(sync["metadata"]["uid"])
    assert {a["id"] for a in node.entries().values()} == {marker(keep), marker(doomed)}
    node.tenant.server.request("PATCH", path, {"metadata": {"finalizers": None}},
                               content_type="application/merge-patch+json")  # fmt: skip
    started = time.monotonic()
    _, report, at = swept.covering(doomed["metadata"]["uid"])
    print(f"\nthe claim's finalizer removed -> its address freed: {at - started:.2f} s")
    assert report.freed == 2 and not report.errors  # the pool entry and the reservation
    assert {a["id"] for a in node.entries().values()} == {marker(keep)}
    assert set(node.reserved()) == {"198.51.100.1"}
    assert sorted(p.name for p in node.records.iterdir()) == [keep["metadata"]["uid"]]
    assert watch.lists == 1


def test_claims_deleted_while_no_watch_ran_are_freed_at_its_start(crd: KubeServer, node: Node) -> None:
    claim = node.claim("vm-w")
    node.add(node.launcher("virt-launcher-vm-w-1", "vm-w", claim=claim["metadata"]["name"]))
    node.delete_claim(claim["metadata"]["name"])
    swept = Swept()
    watch = open_claim_watch(str(node.flat), say=lambda line: None, idle=0.1, on_report=swept)
    watch.start()
    try:
        _, report, _ = swept.covering(claim["metadata"]["uid"])
    finally:
        watch.close()
    assert report.freed == 2 and node.entries() == {} and node.reserved() == {}
    assert list(node.records.iterdir()) == []


class Looked(Records):
    """The node's records, telling when they were looked at (an injected collaborator of ClaimWatch)."""

    def __init__(self, directory: str, looks: int) -> None:
        super().__init__(directory)
        self.left, self.event = looks, threading.Event()

    def all(self) -> dict[str, ClaimRef]:
        self.left -= 1
        if self.left <= 0:
            self.event.set()
        return super().all()


def test_without_records_the_watch_makes_no_request(crd: KubeServer, node: Node) -> None:
    """A node that never allocated for a claim: its claim watch sends nothing (checked once it has looked
    at the records three times)."""
    kube = load_kubeconfig(str(node.tenant.node))
    records = Looked(str(node.records), 3)
    watch = ClaimWatch(Client(kube), open_kube(node.tenant.node), records, idle=0.01)
    def run() -> bool:
        watch.start()
        return records.event.wait(WAIT)

    _, counts = spent(node.tenant.server, run)
    watch.close()
    assert records.event.is_set() and watch.lists == 0 and "LIST ipamclaims" not in counts, counts


def test_the_reconciler_frees_the_entries_of_deleted_claims_only(crd: KubeServer, node: Node,
                                                                 tmp_path: Path) -> None:  # fmt: skip
    live, gone, recreated = node.claim("vm-l"), node.claim("vm-x"), node.claim("vm-y")
    for claim in (live, gone, recreated):
        vm = claim["metadata"]["labels"]["kubevirt.io/vm"]
        node.add(node.launcher(f"virt-launcher-{vm}-1", vm, claim=claim["metadata"]["name"]))
    node.delete_claim(gone["metadata"]["name"])
    node.delete_claim(recreated["metadata"]["name"])
    again = node.claim("vm-y")  # the VM recreated under its name: a new claim, a new UID
    flat = tmp_path / "reconciler" / "whereabouts.conf"
    flat.parent.mkdir(parents=True)
    flat.write_text(json.dumps(
        {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(node.tenant.reconciler)}}))
    conf = tmp_path / "reconciler" / "conf.json"
    conf.write_text(json.dumps({"ipam": {"configuration_path": str(flat)}}))
    out = io.StringIO()
    assert cli.main(["--config", str(conf), "reconcile", "--pods", "kubernetes"], out) == 0, out.getvalue()
    said = out.getvalue()
    assert f"IPAMClaim {node.ns}/{gone['metadata']['name']} deleted" in said, said
    assert f"IPAMClaim {node.ns}/vm-y.{VM_NETWORK} recreated" in said, said
    assert {a["id"] for a in node.entries().values()} == {marker(live)}
    assert set(node.reserved()) == {"198.51.100.1"}
    # the new claim's first ADD allocates anew (lowest free), and the claim's status says so
    assert node.add(node.launcher("virt-launcher-vm-y-2", "vm-y", claim=again["metadata"]["name"])) == (
        "198.51.100.2/24")


# ---- mixed pools -----------------------------------------------------------------------------------------


def test_an_upstream_whereabouts_node_never_takes_a_claims_address(crd: KubeServer, node: Node,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    """Upstream whereabouts v0.9.4 (the real binary) on another node of the same pool: it allocates around
    the claim's address while the VM runs and while it is stopped (its launcher pod's DEL done), until the
    pool is full."""
    kube = node.tenant.server
    admin = wbupstream.admin_kubeconfig(kube, tmp_path / "upstream" / "admin.kubeconfig", node.ns)
    upstream = wbupstream.Implementation("upstream", tmp_path / "upstream" / "whereabouts.conf", admin,
                                         unpack("whereabouts") / "whereabouts")  # fmt: skip
    small: dict[str, Any] = {"range": "198.51.100.0/29"}  # .1 - .6
    claim = node.claim("vm-u")
    vm = node.launcher("virt-launcher-vm-u-1", "vm-u", claim=claim["metadata"]["name"])
    assert node.add(vm, node.conf(**small)) == "198.51.100.1/29"
    nad = node.conf(persistent=False, **small)
    got = []
    for i in range(6):
        if i == 2:  # the VM stopped: its launcher pod's DEL, the claim keeps the address
            assert node.call("DEL", vm, node.conf(**small))[0] == 0
        env = wbupstream.cni_env("ADD", uuid.uuid4().hex * 2, "net1", f"{node.ns}/up-{i}", f"uid-up-{i}",
                                 "node-up")  # fmt: skip
        rc, out = upstream.call(env, nad)
        got.append(out["ips"][0]["address"] if rc == 0 else f"rc {rc}")
    assert got[:5] == [f"198.51.100.{i}/29" for i in range(2, 7)], got
    assert got[5] != "198.51.100.1/29" and got[5].startswith("rc"), got  # full: never the claim's
    assert node.entries_of("198.51.100.0-29")["1"]["id"] == marker(claim)
