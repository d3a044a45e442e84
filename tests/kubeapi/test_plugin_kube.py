"""The whereabouts plugin, the reconciler, the pod source and the operator CLI on the Kubernetes store,
through the API emulator (node and reconciler service-account tokens, RBAC of the manifests enforced)."""

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


def conf_for(kubeconfig: Path, tmp: Path, **ipam: Any) -> dict[str, Any]:
    target = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)}}
    return base_conf("blue", target, tmp, **ipam)


def ips(out: Any) -> list[str]:
    return [ip["address"] for ip in out["ips"]]


def call(cmd: str, conf: dict[str, Any], att: Att, **extra: Any) -> tuple[int, Any]:
    return run_inline(att.env(cmd), {**conf, **extra})


P1, P2, P3 = (
    Att("c1" * 32, "net1", "ns1/pod-1"),
    Att("c2" * 32, "net1", "ns1/pod-2"),
    Att("c3" * 32, "net1", "ns2/pod-3"),
)


def test_add_check_del_dual_stack(emu: Emulator, node_kubeconfig: Path, tmp_path: Path) -> None:
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
        assert pool is not None and pool.allocations["1"].pod_uid == f"uid-{P1.cid}"
        assert pool.allocations["1"].node == "node-1" and pool.allocations["1"].network == "blue"
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


def test_kubelet_readd_with_a_new_sandbox_takes_over(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    first = call("ADD", conf, P1)[1]
    new = Att("d1" * 32, P1.ifname, P1.pod)
    rc, out = call("ADD", conf, new)
    assert rc == 0 and ips(out) == ips(first)
    assert call("DEL", conf, P1)[0] == 0  # the old sandbox's late DEL releases nothing
    assert call("CHECK", conf, new)[0] == 0


def test_exhausted_pool_is_code_100(emu: Emulator, node_kubeconfig: Path, tmp_path: Path) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/30")
    assert call("ADD", conf, P1)[0] == 0 and call("ADD", conf, P2)[0] == 0
    rc, out = call("ADD", conf, P3)
    assert rc == 1 and out["code"] == Code.POOL_EXHAUSTED and "198.51.100.0/30" in out["msg"]


def test_gc_releases_what_is_not_valid(emu: Emulator, node_kubeconfig: Path, tmp_path: Path) -> None:
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


def reconciler_kubeconfig(emu: Emulator, tmp: Path) -> Path:
    return emu.kubeconfig(tmp / "reconciler.kubeconfig", token="reconciler-token")


def test_pod_source_answers_per_pod(emu: Emulator, tmp_path: Path) -> None:
    emu.set_pod("ns1", "pod-1", "u1")
    src = KubePodSource(Client(load_kubeconfig(str(reconciler_kubeconfig(emu, tmp_path)))), rbac.RECONCILER)
    try:
        pod = src.lookup("ns1", "pod-1")
        assert pod is not None and pod.uid == "u1"
        assert src.lookup("ns1", "gone") is None
        emu.fail("503")
        with pytest.raises(PodSourceError):
            src.lookup("ns1", "pod-1")
    finally:
        src.close()
    # an account that may not read pods: forbidden is "cannot tell", never "gone"
    node = KubePodSource(
        Client(load_kubeconfig(str(emu.kubeconfig(tmp_path / "n", token="nobody-token")))), rbac.RECONCILER
    )
    try:
        with pytest.raises(PodSourceError, match="403"):
            node.lookup("ns1", "pod-1")
    finally:
        node.close()


def test_reconciler_frees_only_what_belongs_to_gone_pods(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    for att in (P1, P2, P3):
        assert call("ADD", conf, att)[0] == 0
    emu.set_pod("ns1", "pod-1", f"uid-{P1.cid}")  # alive, same UID
    emu.set_pod("ns1", "pod-2", "someone-else")  # recreated under the same name
    # ns2/pod-3 is gone
    kc = reconciler_kubeconfig(emu, tmp_path)
    store = open_kube(kc, role=rbac.RECONCILER)
    pods = KubePodSource(Client(load_kubeconfig(str(kc))), rbac.RECONCILER)
    try:
        dry = Reconciler(store, pods, dry_run=True).run()
        assert dry.found == 4 and dry.freed == 0  # two allocations and their reservations
        report = Reconciler(store, pods).run()
        assert (report.found, report.freed, report.errors) == (4, 4, [])
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and [a.podref for a in pool.allocations.values()] == ["ns1/pod-1"]
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.1"]
        emu.delete_pod("ns1", "pod-1")
        emu.fail("503", 10, resource="pods")  # the API cannot tell whether the pod exists
        report = Reconciler(store, pods).run()
        assert (report.found, report.freed, report.skipped) == (0, 0, 2)
        assert [r.name for r in store.iter_reservations()] == ["198.51.100.1"]
        emu.clear_faults()
        report = Reconciler(store, pods).run()  # it can tell again: the pod is gone
        assert (report.found, report.freed) == (2, 2)
    finally:
        store.close()
        pods.close()


def run_cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return cli.main(list(argv), out), out.getvalue()


def test_cli_pools_show_release_and_reconcile_on_the_kube_store(
    emu: Emulator, node_kubeconfig: Path, tmp_path: Path
) -> None:
    conf = conf_for(node_kubeconfig, tmp_path, range="198.51.100.0/29")
    for att in (P1, P2):
        assert call("ADD", conf, att)[0] == 0
    ipam_file = tmp_path / "ipam.json"
    kube = {"kubeconfig": str(reconciler_kubeconfig(emu, tmp_path))}
    section = {
        "datastore": "kubernetes",
        "kubernetes": kube,
        "configuration_path": str(tmp_path / "whereabouts.conf"),
    }
    ipam_file.write_bytes(jsonio.dumps(section))
    rc, out = run_cli("--config", str(ipam_file), "pools")
    assert rc == 0 and "198.51.100.0-29" in out and "2/6" in out
    rc, out = run_cli("--config", str(ipam_file), "show", "198.51.100.0-29")
    assert rc == 0 and "ns1/pod-1" in out and "198.51.100.2" in out
    rc, out = run_cli("--config", str(ipam_file), "release", "198.51.100.0-29", "198.51.100.2", "--yes")
    assert rc == 0 and "released 198.51.100.2" in out
    emu.set_pod("ns1", "pod-1", f"uid-{P1.cid}")
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes")
    assert rc == 0 and "freed 0 of 0" in out
    emu.delete_pod("ns1", "pod-1")
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes", "--dry-run")
    assert rc == 0 and "would free 2" in out
    rc, out = run_cli("--config", str(ipam_file), "reconcile", "--pods", "kubernetes")
    assert rc == 0 and "freed 2 of 2" in out
    store = open_kube(node_kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-29")
        assert pool is not None and dict(pool.allocations) == {}
        assert list(store.iter_reservations()) == []
    finally:
        store.close()
    assert {c[0] for c in emu.calls} == {"pycni-node", "pycni-reconciler"} and not emu.forbidden
