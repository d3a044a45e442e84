"""The whereabouts plugin, the reconciler, the pod source and the operator CLI on the Kubernetes store,
on the session's real kube-apiserver (tests/kubeup.py: a namespace per test, bundler/manifests/rbac.yaml
as shipped, the node's and the reconciler's ServiceAccount tokens; pods are API objects the test
creates, with the UIDs the server gives them). Injected outages and 409 storms stay on the in-process
emulator: a real server cannot be made to fail on demand."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import Code
from ipam import cli, rbac
from ipam.kubeapi import Client, load_kubeconfig
from ipam.kubepods import KubePodSource
from ipam.podsource import PodSourceError
from ipam.reconciler import Reconciler
from tests.concurrency.harness import Att, base_conf, run_inline
from tests.kubeapi.emulator import Emulator
from tests.kubeapi.factory import open_kube, unreachable_kubeconfig
from tests.kubeup import KubeServer, Tenant, stranger_kubeconfig


def conf_for(kubeconfig: Path, tmp: Path, **ipam: Any) -> dict[str, Any]:
    target = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)}}
    return base_conf("blue", target, tmp, **ipam)


def ips(out: Any) -> list[str]:
    return [ip["address"] for ip in out["ips"]]


def call(cmd: str, conf: dict[str, Any], att: Att, uid: str = "", **extra: Any) -> tuple[int, Any]:
    """One plugin call; `uid`: the pod's UID as the kubelet passes it (default: made up from the cid)."""
    env = att.env(cmd)
    if uid:
        env["CNI_ARGS"] = env["CNI_ARGS"].replace(f"K8S_POD_UID=uid-{att.cid}", f"K8S_POD_UID={uid}")
    return run_inline(env, {**conf, **extra})


def forbidden_count(server: KubeServer) -> float:
    """How many requests the server has refused (403) so far, for any identity."""
    return sum(n for (_, _, code), n in server.request_counts().items() if code == "403")


P1, P2, P3 = (
    Att("c1" * 32, "net1", "ns1/pod-1"),
    Att("c2" * 32, "net1", "ns1/pod-2"),
    Att("c3" * 32, "net1", "ns2/pod-3"),
)


def pods_of(tenant: Tenant) -> tuple[Att, Att, Att]:
    """P1, P2, P3 as pods of the tenant's namespace (the pod objects are not created here)."""
    ns = tenant.namespace
    return (Att(P1.cid, P1.ifname, f"{ns}/pod-1"), Att(P2.cid, P2.ifname, f"{ns}/pod-2"),
            Att(P3.cid, P3.ifname, f"{ns}/pod-3"))  # fmt: skip


def test_add_check_del_dual_stack(tenant: Tenant, tmp_path: Path) -> None:
    node_kubeconfig = tenant.node
    conf = conf_for(
        node_kubeconfig, tmp_path, ipRanges=[{"range": "198.51.100.0/29"}, {"range": "2001:db8::/64"}]
    )
    rc, out = call("ADD", conf, P1)
    assert rc == 0, out
    assert ips(out) == ["198.51.100.1/29", "2001:db8::1/64"]
    rc, again = call("ADD", conf, P1)
    assert rc == 0 and ips(again) == ips(out)
    assert call("CHECK", conf, P1)[0] == 0
    rc, out2 = call("ADD", conf, P2)
    assert ips(out2) == ["198.51.100.2/29", "2001:db8::2/64"]
    store = open_kube(node_kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and not pool.allocations["1"].has_extras()  # on the reservation (lean)
        res = store.get_reservation("198.51.100.1")
        assert res is not None and res.owner.pod_uid == f"uid-{P1.cid}"
        assert res.owner.node == "node-1" and res.owner.network == "blue"
        assert {r.name for r in store.iter_reservations()} == {
            "198.51.100.1", "198.51.100.2", "2001-db8--1", "2001-db8--2"}  # fmt: skip
        assert call("DEL", conf, P1)[0] == 0
        assert call("DEL", conf, P1)[0] == 0  # idempotent
        rc, out = call("CHECK", conf, P1)
        assert rc != 0 and out["code"] == Code.CHECK_FAILED
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and set(pool.allocations) == {"2"}
        assert {r.name for r in store.iter_reservations()} == {"198.51.100.2", "2001-db8--2"}
    finally:
        store.close()


def test_kubelet_readd_with_a_new_sandbox_takes_over(tenant: Tenant, tmp_path: Path) -> None:
    conf = conf_for(tenant.node, tmp_path, range="198.51.100.0/29")
    first = call("ADD", conf, P1)[1]
    new = Att("d1" * 32, P1.ifname, P1.pod)
    rc, out = call("ADD", conf, new)
    assert rc == 0 and ips(out) == ips(first)
    assert call("DEL", conf, P1)[0] == 0  # the old sandbox's late DEL releases nothing
    assert call("CHECK", conf, new)[0] == 0


def test_exhausted_pool_is_code_100(tenant: Tenant, tmp_path: Path) -> None:
    node_kubeconfig = tenant.node
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/30")
    assert call("ADD", conf, P1)[0] == 0 and call("ADD", conf, P2)[0] == 0
    rc, out = call("ADD", conf, P3)
    assert rc == 1 and out["code"] == Code.POOL_EXHAUSTED and "198.51.100.0/30" in out["msg"]


def test_gc_releases_what_is_not_valid(tenant: Tenant, tmp_path: Path) -> None:
    node_kubeconfig = tenant.node
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    for att in (P1, P2):
        assert call("ADD", conf, att)[0] == 0
    env = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni", "NODENAME": "node-1"}
    rc, out = run_inline(
        env, {**conf, "cni.dev/valid-attachments": [{"containerID": P2.cid, "ifname": "net1"}]}
    )
    assert rc == 0, out
    store = open_kube(node_kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and [a.container_id for a in pool.allocations.values()] == [P2.cid]
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.2"]
    finally:
        store.close()


def test_pool_entries_leave_their_extras_to_their_reservations(tenant: Tenant, tmp_path: Path) -> None:
    """With overlapping ranges (the default) a pool entry is written without pycni's per-entry owners
    annotation: its reservation carries the pod UID, network and node, and whoever needs them joins
    them back (GC above, the reconciler below, `pycni-ipam show` here). Without overlapping ranges
    there is no reservation: the pool keeps them."""
    for sub in ("lean", "plain"):
        (tmp_path / sub).mkdir()
    lean = conf_for(tenant.node, tmp_path / "lean", range="198.51.100.0/29")
    plain = conf_for(tenant.node, tmp_path / "plain", range="198.51.100.8/29",
                     enable_overlapping_ranges=False)
    assert call("ADD", lean, P1, uid="uid-one")[0] == 0
    assert call("ADD", plain, P2, uid="uid-two")[0] == 0
    notes = {o["metadata"]["name"]: o["metadata"].get("annotations") or {} for o in tenant.objects("ippools")}
    assert not [k for k in notes["198.51.100.0-29"] if k.startswith("pycni.io/o-")]
    assert [k for k in notes["198.51.100.8-29"] if k.startswith("pycni.io/o-")] == ["pycni.io/o-1"]
    [res] = tenant.objects("overlappingrangeipreservations")
    assert res["metadata"]["annotations"] == {"pycni.io/pod-uid": "uid-one", "pycni.io/network": "blue",
                                              "pycni.io/node": "node-1"}  # fmt: skip
    store = open_kube(tenant.reconciler, role=rbac.RECONCILER)
    try:
        for pool, uid in (("198.51.100.0-29", "uid-one"), ("198.51.100.8-29", "uid-two")):
            out = io.StringIO()
            assert cli.cmd_show(store, pool, out) == 0
            assert uid in out.getvalue() and "node-1" in out.getvalue(), out.getvalue()
    finally:
        store.close()


def test_status_and_add_when_the_api_is_down(tmp_path: Path) -> None:
    conf = conf_for(unreachable_kubeconfig(tmp_path), tmp_path, range="198.51.100.0/29")
    rc, out = run_inline({"CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni"}, conf)
    assert rc == 1 and out["code"] == Code.NOT_AVAILABLE
    t = time.monotonic()
    for cmd in ("ADD", "DEL"):
        rc, out = call(cmd, conf, P1)
        assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER, out
    assert time.monotonic() - t < 30


def test_status_ok_and_recovery_after_injected_errors(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    assert run_inline({"CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni"}, conf)[0] == 0
    emu.fail("500", 3)  # the engine retries an outage briefly
    rc, out = call("ADD", conf, P1)
    assert rc == 0, out
    emu.fail("409", 4)  # a storm of conflicts: retried
    rc, out = call("ADD", conf, P2)
    assert rc == 0 and ips(out) == ["198.51.100.2/29"]


def test_a_long_409_storm_on_the_pool_is_ridden_out(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    emu.fail("409", 40, resource="ippools", method="POST")  # the pool's creation conflicts, 40 times
    rc, out = call("ADD", conf, P1)
    assert rc == 0 and ips(out) == ["198.51.100.1/29"], out
    store = open_kube(node_kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and set(pool.allocations) == {"1"}
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.1"]
    finally:
        store.close()


def test_pool_outage_after_the_reservation_leaves_nothing_half_written(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    """The reservation is created, then every pool request fails: code 11, the reservation this call
    made is taken back, and the next call after recovery succeeds with the same address."""
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    emu.fail("500", 1000, resource="ippools", method="POST")  # the pool's creation, after the claim
    t = time.monotonic()
    rc, out = call("ADD", conf, P1)
    assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER, out
    assert time.monotonic() - t < 60
    verbs = {verb for _, verb, _, resource in emu.calls if resource == "overlappingrangeipreservations"}
    assert {"create", "delete"} <= verbs  # it did claim the address, and took the claim back
    emu.clear_faults()
    store = open_kube(node_kubeconfig)
    try:
        assert list(store.iter_reservations()) == []
        pool = store.get_pool("198.51.100.0-29")
        assert pool is None or not pool.allocations
        rc, out = call("ADD", conf, P1)
        assert rc == 0 and ips(out) == ["198.51.100.1/29"], out
    finally:
        store.close()


# ---- reconciler, pod source, CLI ------------------------------------------------------------------


def test_pod_source_answers_per_pod(tenant: Tenant, tmp_path: Path) -> None:
    uid = tenant.create_pod("pod-1")["metadata"]["uid"]
    src = KubePodSource(Client(load_kubeconfig(str(tenant.reconciler))), rbac.RECONCILER)
    try:
        pod = src.lookup(tenant.namespace, "pod-1")
        assert pod is not None and (pod.namespace, pod.name, pod.uid) == (tenant.namespace, "pod-1", uid)
        assert src.lookup(tenant.namespace, "gone") is None
        assert src.lookup(f"{tenant.namespace}-none", "pod-1") is None  # no such namespace: gone too
    finally:
        src.close()
    # an account that may not read pods: forbidden is "cannot tell", never "gone"
    stranger = stranger_kubeconfig(tenant, tmp_path / "stranger.kubeconfig")
    other = KubePodSource(Client(load_kubeconfig(str(stranger))), rbac.RECONCILER)
    try:
        with pytest.raises(PodSourceError, match="403"):
            other.lookup(tenant.namespace, "pod-1")
    finally:
        other.close()


def test_pod_source_server_errors_are_cannot_tell(emu: Emulator, tmp_path: Path) -> None:
    """A 5xx from the API (injected: the emulator) is PodSourceError, never "gone"."""
    emu.set_pod("ns1", "pod-1", "u1")
    kc = emu.kubeconfig(tmp_path / "reconciler.kubeconfig", token="reconciler-token")
    src = KubePodSource(Client(load_kubeconfig(str(kc))), rbac.RECONCILER)
    try:
        pod = src.lookup("ns1", "pod-1")
        assert pod is not None and pod.uid == "u1"
        emu.fail("503")
        with pytest.raises(PodSourceError, match="503"):
            src.lookup("ns1", "pod-1")
        assert src.lookup("ns1", "gone") is None
    finally:
        src.close()


def test_reconciler_frees_only_what_belongs_to_gone_pods(tenant: Tenant, tmp_path: Path) -> None:
    p1, p2, p3 = pods_of(tenant)
    conf = conf_for(tenant.node, tmp_path, range="198.51.100.0/29")
    uid1 = tenant.create_pod("pod-1")["metadata"]["uid"]
    uid2 = tenant.create_pod("pod-2")["metadata"]["uid"]
    for att, uid in ((p1, uid1), (p2, uid2), (p3, "uid-of-a-pod-never-created")):
        assert call("ADD", conf, att, uid=uid)[0] == 0
    tenant.delete_pod("pod-2")  # recreated under the same name: a new UID
    assert tenant.create_pod("pod-2")["metadata"]["uid"] != uid2
    # pod-3 is gone (never created)
    store = open_kube(tenant.reconciler, role=rbac.RECONCILER)
    pods = KubePodSource(Client(load_kubeconfig(str(tenant.reconciler))), rbac.RECONCILER)
    # an account that may not read pods: every lookup is 403, "cannot tell"
    stranger = stranger_kubeconfig(tenant, tmp_path / "stranger.kubeconfig")
    blind = KubePodSource(Client(load_kubeconfig(str(stranger))), rbac.RECONCILER)
    try:
        dry = Reconciler(store, pods, dry_run=True).run()
        assert dry.found == 4 and dry.freed == 0  # two allocations and their reservations
        report = Reconciler(store, pods).run()
        assert (report.found, report.freed, report.errors) == (4, 4, [])
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and [a.podref for a in pool.allocations.values()] == [p1.pod]
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.1"]
        tenant.delete_pod("pod-1")
        report = Reconciler(store, blind).run()  # the API cannot tell whether the pod exists
        assert (report.found, report.freed, report.skipped) == (0, 0, 2)
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.1"]
        report = Reconciler(store, pods).run()  # it can tell: the pod is gone
        assert (report.found, report.freed) == (2, 2)
        assert list(store.iter_reservations()) == []
    finally:
        store.close()
        pods.close()
        blind.close()


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out), out.getvalue()


def test_cli_pools_show_release_and_reconcile_on_the_kube_store(tenant: Tenant, tmp_path: Path) -> None:
    refused = forbidden_count(tenant.server)
    p1, p2, _ = pods_of(tenant)
    conf = conf_for(tenant.node, tmp_path, range="198.51.100.0/29")
    uid1 = tenant.create_pod("pod-1")["metadata"]["uid"]
    assert call("ADD", conf, p1, uid=uid1)[0] == 0
    assert call("ADD", conf, p2)[0] == 0
    ipam_file = tmp_path / "ipam.json"
    section = {
        "datastore": "kubernetes",
        "kubernetes": {"kubeconfig": str(tenant.reconciler)},
        "configuration_path": str(tmp_path / "whereabouts.conf"),
    }
    ipam_file.write_bytes(jsonio.dumps(section))
    rc, out = run_cli("--config", str(ipam_file), "pools")
    assert rc == 0 and "198.51.100.0-29" in out and "2/6" in out
    rc, out = run_cli("--config", str(ipam_file), "show", "198.51.100.0-29")
    assert rc == 0 and p1.pod in out and "198.51.100.2" in out
    rc, out = run_cli("--config", str(ipam_file), "release", "198.51.100.0-29", "198.51.100.2", "--yes")
    assert rc == 0 and "released 198.51.100.2" in out
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes")
    assert rc == 0 and "freed 0 of 0" in out
    tenant.delete_pod("pod-1")
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes", "--dry-run")
    assert rc == 0 and "would free 2" in out
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes")
    assert rc == 0 and "freed 2 of 2" in out
    store = open_kube(tenant.node)
    try:
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and dict(pool.allocations) == {}
        assert list(store.iter_reservations()) == []
    finally:
        store.close()
    # node and reconciler did all of it with what rbac.yaml grants them: the server refused nothing
    assert forbidden_count(tenant.server) == refused
