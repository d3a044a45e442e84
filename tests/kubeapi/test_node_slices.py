"""Node slices (`node_slice_size`) on a real kube-apiserver, side by side with upstream whereabouts
v0.9.4's node-slice-controller and IPAM binary (../shared/upstream):

- upstream's controller assigns the slices, ours allocates in each node's slice, in pools named as
  upstream names them;
- upstream's plugin and ours on one node-slice network never hand out one address twice, and each
  releases what the other allocated;
- with no controller ours assigns (NodeSlicePool valid against the CRD schema), and upstream's
  controller started afterwards keeps every assignment and continues in the same order;
- exclude and range_start/range_end hold inside a slice (upstream drops them there: whereabouts#666);
- a full slice is code 107 naming the node and the slice, a node without a free slice code 108, and
  nothing is left behind; a full /24 slice of a 65,536-address network is one IPPool far below 256 KiB.

The module runs its own kube-apiserver (~5 s): upstream's controller watches every Node and every
NetworkAttachmentDefinition of the cluster, and one NAD it cannot parse anywhere stops it from serving
the others, so it must not see other tests' objects. Skipped only when ../shared/upstream is absent."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cni.errors import Code
from ipam import rbac
from ipam.kubeapi import Client, load_kubeconfig
from ipam.kubepods import KubePodSource
from ipam.reconciler import Reconciler
from tests import kubeup
from tests.concurrency.harness import spawn_all
from tests.kubeapi import wbupstream
from tests.kubeapi.factory import open_kube
from tests.kubeapi.wbupstream import Implementation, cni_env
from tests.unit.ipam.test_crd_schema import schemas

NSP = "nodeslicepools"
WAIT = 60.0  # seconds the controller gets to act (it usually takes well under one)


@pytest.fixture(scope="module")
def cluster(kube: kubeup.KubeServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[kubeup.KubeServer]:
    """This module's own server (see the module docstring); `kube` only for its skip and the RBAC
    recorder's selection."""
    server = kubeup.KubeServer.start(tmp_path_factory.mktemp("kube-slices"))
    try:
        yield server
    finally:
        server.stop()


class Controller:
    """upstream's node-slice-controller for one namespace (WHEREABOUTS_NAMESPACE), as admin."""

    def __init__(self, server: kubeup.KubeServer, namespace: str, where: Path) -> None:
        self.kubeconfig = wbupstream.admin_kubeconfig(server, where / "controller.kubeconfig", namespace)
        self.namespace, self.log = namespace, where / "node-slice-controller.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = kubeup.unpack("whereabouts-node-slice-controller") / "whereabouts-node-slice-controller"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "WHEREABOUTS_NAMESPACE": self.namespace}
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(binary), "-kubeconfig", str(self.kubeconfig)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:]) if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Site:
    """One namespace of `cluster`, both plugins installed (flat files in tmp), nodes named per test."""

    def __init__(self, server: kubeup.KubeServer, tmp: Path) -> None:
        self.server = server
        self.tenant = kubeup.Tenant(server, tmp / "kube")
        self.ns = self.tenant.namespace
        admin = wbupstream.admin_kubeconfig(server, tmp / "upstream" / "admin.kubeconfig", self.ns)
        binary = kubeup.unpack("whereabouts") / "whereabouts"
        self.upstream = Implementation("upstream", tmp / "upstream" / "whereabouts.conf", admin, binary)
        self.ours = Implementation("ours", tmp / "ours" / "whereabouts.conf", self.tenant.node)
        self.controller = Controller(server, self.ns, tmp)

    def node(self, name: str, create: bool = True) -> str:
        full = f"{name}-{self.ns}"  # Nodes are cluster-scoped
        if create:
            wbupstream.create_node(self.server, full)
        return full

    def nad(self, conf: dict[str, Any]) -> None:
        """The NAD the controller reads, with `configuration_path` naming a flat file in tmp: upstream's
        parser refuses a config without one (it is read, never written)."""
        wbupstream.create_nad(self.tenant, self.ours.conf(conf))

    def call(self, side: Implementation, cmd: str, conf: dict[str, Any], node: str, pod: str,
             cid: str) -> tuple[int, Any]:  # fmt: skip
        env = cni_env(cmd, cid, "net1", f"{self.ns}/{pod}", str(uuid.uuid5(uuid.NAMESPACE_OID, pod)), node)
        return side.call(env, conf)

    def add(self, side: Implementation, conf: dict[str, Any], node: str, pod: str, cid: str) -> str:
        rc, out = self.call(side, "ADD", conf, node, pod, cid)
        assert rc == 0, f"{side.name} ADD {pod} on {node}: {out}"
        (ip,) = out["ips"]
        return str(ip["address"])

    def delete(self, side: Implementation, conf: dict[str, Any], node: str, pod: str, cid: str) -> None:
        rc, out = self.call(side, "DEL", conf, node, pod, cid)
        assert rc == 0, f"{side.name} DEL {pod} on {node}: {out}"

    def slice_pool(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = self.server.request("GET", self.tenant.path(NSP, name))
        except kubeup.ApiFailure as e:
            if e.status == 404:
                return None
            raise
        return obj

    def assignments(self, name: str) -> dict[str, str]:
        obj = self.slice_pool(name) or {}
        return {a["nodeName"]: a["sliceRange"] for a in obj.get("status", {}).get("allocations", [])
                if a.get("nodeName")}  # fmt: skip

    def assigned(self, name: str, *nodes: str) -> dict[str, str] | None:
        """The assignments once every one of `nodes` has a slice, else None."""
        got = self.assignments(name)
        return got if set(nodes) <= got.keys() else None

    def await_(self, what: str, ready: Any) -> Any:
        end = time.monotonic() + WAIT
        while True:
            got = ready()
            if got:
                return got
            assert time.monotonic() < end, f"{what}: not within {WAIT:g}s\n{self.controller.tail()}"
            time.sleep(0.1)


@pytest.fixture
def site(cluster: kubeup.KubeServer, tmp_path: Path) -> Iterator[Site]:
    s = Site(cluster, tmp_path)
    try:
        yield s
    finally:
        s.controller.stop()


def net(name: str, **ipam: Any) -> dict[str, Any]:
    return {"cniVersion": "0.3.1", "name": name, "type": "macvlan", "ipam": {"type": "whereabouts", **ipam}}


def cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def normalized(cidr: str) -> str:
    return cidr.replace(":", "-").replace("/", "-")


def test_upstreams_controller_assigns_and_ours_allocates_in_each_nodes_slice(site: Site) -> None:
    conf = net("slices-a", range="198.18.0.0/16", node_slice_size="/24")
    one, two = site.node("one"), site.node("two")
    site.nad(conf)
    site.controller.start()
    got = site.await_("the controller assigns both nodes", lambda: site.assigned("slices-a", one, two))
    assert got[one] != got[two]
    ips = {}
    for node in (one, two):
        ips[node] = site.add(site.ours, conf, node, f"pod-{node}", cid())
        address = ipaddress.ip_interface(ips[node])
        assert address.network.prefixlen == 16  # the whole range's prefix, as upstream
        assert address.ip == ipaddress.ip_network(got[node])[1]  # the first address of its own slice
    pools = site.tenant.pools()
    want = {f"{node}-{normalized(got[node])}" for node in (one, two)}  # upstream's IPPoolName
    assert set(pools) == want
    for node in (one, two):
        assert pools[f"{node}-{normalized(got[node])}"]["1"]["podref"] == f"{site.ns}/pod-{node}"
    assert site.assignments("slices-a") == got  # ours read, never rewrote


def test_upstreams_plugin_and_ours_share_a_slice_without_handing_out_an_address_twice(site: Site) -> None:
    conf = net("slices-b", range="198.51.100.0/24", node_slice_size="/27", network_name="shared")
    node = site.node("one")
    held: dict[str, tuple[Implementation, str, str]] = {}
    for i in range(10):  # ours first: it makes the NodeSlicePool upstream's plugin then reads
        side = site.ours if i % 2 == 0 else site.upstream
        pod, c = f"p{i}", cid()
        ip = site.add(side, conf, node, pod, c)
        assert ip not in held, f"{ip} handed out twice: {held[ip]} and {(side.name, pod)}"
        held[ip] = (side, pod, c)
    assert site.assignments("shared") == {node: "198.51.100.0/27"}
    first_ten = set(list(ipaddress.ip_network("198.51.100.0/27"))[1:11])
    assert {ipaddress.ip_interface(ip).ip for ip in held} == first_ten
    pool = f"shared-{node}-198.51.100.0-27"
    assert set(site.tenant.pools()) == {pool} and len(site.tenant.pools()[pool]) == 10
    assert len(site.tenant.reservations()) == 10
    for side, pod, c in held.values():  # each releases what the other allocated
        site.delete(site.upstream if side is site.ours else site.ours, conf, node, pod, c)
    assert site.tenant.pools() == {pool: {}} and site.tenant.reservations() == {}


def test_ours_assigns_without_a_controller_and_upstreams_keeps_it_when_it_starts(site: Site) -> None:
    conf = net("slices-c", range="198.18.0.0/16", node_slice_size="/24", network_name="late")
    one, two, three = site.node("one"), site.node("two"), site.node("three")
    assert site.add(site.ours, conf, one, "a", cid()) == "198.18.0.1/16"  # creates the NodeSlicePool
    assert site.add(site.ours, conf, two, "b", cid()) == "198.18.1.1/16"  # takes the next free slice
    obj = site.slice_pool("late")
    assert obj is not None and obj["spec"] == {"range": "198.18.0.0/16", "sliceSize": "/24"}
    assert len(obj["status"]["allocations"]) == 256
    for directory in {Path(kubeup.UPSTREAM / "whereabouts-crds"), kubeup.REPO / "bundler/manifests/crds"}:
        jsonschema.validate(obj, schemas(directory)["NodeSlicePool"])
    before = site.assignments("late")
    assert before == {one: "198.18.0.0/24", two: "198.18.1.0/24"}
    site.nad(conf)
    site.controller.start()
    owned = site.await_(
        "the controller takes the NodeSlicePool over",
        lambda: (site.slice_pool("late") or {}).get("metadata", {}).get("ownerReferences"),
    )
    assert [o["name"] for o in owned] == ["slices-c"]
    after = site.await_("the controller assigns node three", lambda: site.assigned("late", three))
    # kept; every other Node of the cluster (earlier tests' too) got the next free slices, in order
    assert {n: after[n] for n in before} == before
    assert sorted(after.values(), key=ipaddress.ip_network) == [
        f"198.18.{i}.0/24" for i in range(len(after))
    ]
    third = ipaddress.ip_network(after[three])
    assert site.add(site.ours, conf, three, "c", cid()) == f"{third[1]}/16"
    pools = {f"late-{n}-{normalized(after[n])}" for n in (one, two, three)}
    assert set(site.tenant.pools()) == pools


def test_nodes_taking_their_first_slice_at_once_never_share_one(site: Site) -> None:
    """Eight nodes' first ADDs, each its own plugin process, all started at once on a network without
    a NodeSlicePool: one creates it, the others' writes conflict and take the next free slice."""
    conf = site.ours.conf(net("slices-g", range="198.18.0.0/16", node_slice_size="/24"))
    nodes = [site.node(f"r{i}", create=False) for i in range(8)]
    calls = [
        (cni_env("ADD", cid(), "net1", f"{site.ns}/pod-{i}", f"uid-{i}", node), conf)
        for i, node in enumerate(nodes)
    ]
    results = spawn_all(calls)
    assert [rc for rc, _, _ in results] == [0] * 8, results
    got = site.assignments("slices-g")
    assert sorted(got) == sorted(nodes)
    assert sorted(got.values(), key=ipaddress.ip_network) == [f"198.18.{i}.0/24" for i in range(8)]
    for node, (_, out, _) in zip(nodes, results, strict=True):
        (ip,) = out["ips"]
        assert ip["address"] == f"{ipaddress.ip_network(got[node])[1]}/16"
    assert set(site.tenant.pools()) == {f"{n}-{normalized(got[n])}" for n in nodes}


def test_exclude_and_range_start_end_hold_inside_a_slice(site: Site) -> None:
    conf = net("slices-d", range="198.51.100.0/24", node_slice_size="/26", range_start="198.51.100.5",
               range_end="198.51.100.100", exclude=["198.51.100.6/31", "198.51.100.9", "198.51.100.64/28"])
    one, two = site.node("one", create=False), site.node("two", create=False)
    got = [site.add(site.ours, conf, one, f"a{i}", cid()) for i in range(4)]
    assert got == ["198.51.100.5/24", "198.51.100.8/24", "198.51.100.10/24", "198.51.100.11/24"]
    got = [site.add(site.ours, conf, two, f"b{i}", cid()) for i in range(2)]
    assert got == ["198.51.100.80/24", "198.51.100.81/24"]  # .64/28 excluded in two's slice .64/26
    assert site.assignments("slices-d") == {one: "198.51.100.0/26", two: "198.51.100.64/26"}
    three = site.node("three", create=False)  # its slice .128/26 ends at range_end .100: nothing in it
    rc, out = site.call(site.ours, "ADD", conf, three, "c", cid())
    assert rc == 1 and out["code"] == Code.SLICE_FULL, out
    assert three in out["msg"] and "198.51.100.128/26" in out["msg"], out


def test_a_full_slice_and_a_node_without_one_have_their_own_codes_and_leak_nothing(site: Site) -> None:
    conf = net("slices-e", range="198.51.100.0/28", node_slice_size="/30")  # 4 slices of 2 addresses
    nodes = [site.node(f"n{i}", create=False) for i in range(5)]
    first = [site.add(site.ours, conf, nodes[0], f"a{i}", cid()) for i in range(2)]
    assert first == ["198.51.100.1/28", "198.51.100.2/28"]
    rc, out = site.call(site.ours, "ADD", conf, nodes[0], "a2", cid())
    assert rc == 1 and out["code"] == Code.SLICE_FULL == 107, out
    assert nodes[0] in out["msg"] and "198.51.100.0/30" in out["msg"], out
    for i, node in enumerate(nodes[1:4], 1):
        site.add(site.ours, conf, node, f"n{i}", cid())
    rc, out = site.call(site.ours, "ADD", conf, nodes[4], "late", cid())
    assert rc == 1 and out["code"] == Code.NO_SLICE == 108 and nodes[4] in out["msg"], out
    assert nodes[4] not in site.assignments("slices-e") and len(site.assignments("slices-e")) == 4
    pools = site.tenant.pools()
    assert sorted(len(p) for p in pools.values()) == [1, 1, 1, 2]  # the failed ADDs left no entry
    assert len(site.tenant.reservations()) == 5  # and no reservation
    rc, out = site.call(site.ours, "DEL", conf, nodes[4], "late", cid())  # no slice: nothing to release
    assert rc == 0, out


def test_a_full_slice_of_a_65536_address_network_is_one_small_ippool(site: Site) -> None:
    """198.18.0.0/15 in /24 slices: 512 slices x 254 = 130,048 addresses (>= 65,536 live allocations);
    one slice is filled here for real and its IPPool and the NodeSlicePool are measured. Every other
    slice's pool is the same shape (tests/unit/ipam/test_slices.py bounds the worst case: 63-character
    names everywhere, ~150 KB)."""
    conf = net("slices-f", range="198.18.0.0/15", node_slice_size="/24", network_name="big",
               enable_overlapping_ranges=False)  # reservations are ~1 KB each and halve the calls' cost
    node = site.node("filled", create=False)
    for i in range(254):
        site.add(site.ours, conf, node, f"pod-with-a-realistic-name-{i:03d}-{'x' * 20}", cid())
    rc, out = site.call(site.ours, "ADD", conf, node, "one-too-many", cid())
    assert rc == 1 and out["code"] == Code.SLICE_FULL, out
    (pool,) = site.tenant.objects("ippools")
    assert len(pool["spec"]["allocations"]) == 254
    nsp = site.slice_pool("big")
    assert nsp is not None and len(nsp["status"]["allocations"]) == 512
    sizes = {"IPPool": len(json.dumps(pool)), "NodeSlicePool": len(json.dumps(nsp))}
    print(f"object sizes of a full /24 slice: {sizes}")
    assert all(size < 256 * 1024 // 2 for size in sizes.values()), sizes


def test_reconciler_judges_a_lean_slice_pools_entries_by_their_reservations(site: Site) -> None:
    """Slice pools are lean (entries without pycni's per-entry annotation; the reservation carries pod
    UID, network and node): the reconciler frees a recreated pod's entry with its reservation, a gone
    pod's, and keeps a gone pod's reservation whose address another attachment holds (upstream's
    takeover, written here by hand) and everything of live pods."""
    conf = net("slices-h", range="198.18.0.0/16", node_slice_size="/24", network_name="h")
    node = site.node("one-h")  # a dash in the node's name: the pool is h-one-h-<ns>-<slice>
    tenant = site.tenant
    uids = {p: tenant.create_pod(p, node=node)["metadata"]["uid"] for p in ("p1", "p2", "p4", "p5")}
    cids = {p: cid() for p in ("p1", "p2", "p3", "p4")}
    for p, c in cids.items():  # p3's pod never existed
        env = cni_env("ADD", c, "net1", f"{site.ns}/{p}", uids.get(p, "uid-p3"), node)
        rc, out = site.ours.call(env, conf)
        assert rc == 0, out
    (name,) = tenant.pools()
    pool = site.server.request("GET", tenant.path("ippools", name))
    assert not any(k.startswith("pycni.io/o-") for k in pool["metadata"].get("annotations", {}))  # lean
    assert {v["id"] for v in pool["spec"]["allocations"].values()} == set(cids.values())
    for res in tenant.objects("overlappingrangeipreservations"):
        assert res["metadata"]["annotations"]["pycni.io/node"] == node, res
    held = {v["id"]: k for k, v in pool["spec"]["allocations"].items()}
    takeover = {"id": cid(), "podref": f"{site.ns}/p5", "ifname": "net1"}  # upstream's re-ADD of p4's address
    patch = [{"op": "replace", "path": f"/spec/allocations/{held[cids['p4']]}", "value": takeover}]
    site.server.request(
        "PATCH", tenant.path("ippools", name), patch, content_type="application/json-patch+json"
    )
    tenant.delete_pod("p2")
    assert tenant.create_pod("p2", node=node)["metadata"]["uid"] != uids["p2"]  # recreated: a new UID
    tenant.delete_pod("p4")
    store = open_kube(tenant.reconciler, role=rbac.RECONCILER)
    pods = KubePodSource(Client(load_kubeconfig(str(tenant.reconciler))), rbac.RECONCILER)
    try:
        report = Reconciler(store, pods).run()
    finally:
        store.close()
        pods.close()
    assert (report.found, report.freed, report.errors) == (4, 4, [])  # p2's and p3's entries and reservations
    left = tenant.pools()[name]
    assert {v["id"] for v in left.values()} == {cids["p1"], takeover["id"]}
    assert {r["containerid"] for r in tenant.reservations().values()} == {cids["p1"], cids["p4"]}


def test_a_requested_address_must_lie_in_this_nodes_slice(site: Site) -> None:
    """Requested addresses (ipam.requested) with node slices: taken in this node's slice, code 109 for
    the next pod there asking for it, code 7 naming the slice and its node (or none) for an address of
    another slice, and the slice's own network address refused; no failed ADD leaves anything."""
    conf = net("slices-req", range="198.51.100.0/24", node_slice_size="/26")
    one, two = site.node("one", create=False), site.node("two", create=False)

    def ask(ip: str) -> dict[str, Any]:
        return {**conf, "runtimeConfig": {"ips": [ip]}}

    assert site.add(site.ours, ask("198.51.100.20/24"), one, "a", cid()) == "198.51.100.20/24"
    assert site.add(site.ours, conf, two, "b", cid()) == "198.51.100.65/24"
    before = (site.tenant.pools(), site.tenant.reservations())
    rc, out = site.call(site.ours, "ADD", ask("198.51.100.20"), one, "c", cid())
    assert rc == 1 and out["code"] == Code.ADDRESS_TAKEN == 109, out
    assert out["msg"].startswith(f"requested address 198.51.100.20 is held by pod {site.ns}/a (container ")
    rc, out = site.call(site.ours, "ADD", ask("198.51.100.70"), one, "c", cid())
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG, out
    assert out["msg"] == (
        f"runtimeConfig.ips[0]: 198.51.100.70 is in node slice 198.51.100.64/26 of node {two}, "
        f"not in this node's ({one}: 198.51.100.0/26)"
    )
    rc, out = site.call(site.ours, "ADD", ask("198.51.100.130"), one, "c", cid())
    assert rc == 1 and "node slice 198.51.100.128/26, assigned to no node" in out["msg"], out
    rc, out = site.call(site.ours, "ADD", ask("198.51.100.64"), two, "d", cid())
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG, out
    assert "198.51.100.64 is the network address of node slice 198.51.100.64/26" in out["msg"], out
    assert (site.tenant.pools(), site.tenant.reservations()) == before
