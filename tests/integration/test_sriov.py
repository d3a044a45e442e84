"""sriov in real namespaces: veth ends stand in for the PF and its VF netdevs, a fake sysfs tree names
them, and the recording VF seam (tests/fakevf.py, installed by tests/launch.py) holds the PF's VF table
and every request. Calls with that seam or with injected faults run from source (tests/launch.py), so
the frozen passes skip them and keep the calls on the real netlink seam."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any

import pytest

from tests.devlab import DPDK_PCI, VF_PCIS, Lab, kill_netns
from tests.nsutil import Call, plugin_command, sh

FULL = {"vlan": 100, "vlanQoS": 2, "mac": "02:11:22:33:44:55", "spoofchk": "off", "trust": "on",
        "link_state": "enable", "min_tx_rate": 10, "max_tx_rate": 1000}
APPLIED = {"mac": "02:11:22:33:44:55", "vlan": 100, "qos": 2, "proto": "802.1q", "spoofchk": 0,
           "trust": 1, "link_state": 1, "min_tx_rate": 10, "max_tx_rate": 1000}


def add_altname(lab: Lab, dev: str, alt: str) -> None:
    sh("ip", "-n", lab.topo.host, "link", "property", "add", "dev", dev, "altname", alt)


def assert_home(lab: Lab, vf: int, before: dict[str, Any] | None, pod: str | None = None) -> None:
    """The VF's netdev and PF-side settings are exactly as before ADD; no state is left."""
    assert lab.netdev(lab.vfs[vf]) == before
    assert lab.vf_table() == lab.initial_vfs
    assert lab.records() == {"attachments": [], "owners": []}
    if pod is not None:
        assert lab.topo.link(pod, "net1") is None


@pytest.mark.parametrize("version", ["0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_add_check_del(lab: Lab, version: str) -> None:
    pod = lab.topo.pod()
    add_altname(lab, lab.vfs[1], f"{lab.vfs[1]}-alt")
    before = lab.netdev(lab.vfs[1])
    conf = lab.conf("sriov", version, ipam=lab.ipam_for(version, "198.51.100.9/24"), deviceID=VF_PCIS[1],
                    **FULL)
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.ok, (add.out, add.stderr)
    if version == "0.2.0":
        assert add.out["ip4"]["ip"] == "198.51.100.9/24"
    else:
        iface = add.out["interfaces"][0]
        assert (iface["name"], iface["mac"], iface["sandbox"]) == ("net1", FULL["mac"], pod)
        if version == "1.1.0":
            assert (iface["mtu"], iface["pciID"]) == (1500, VF_PCIS[1])
        else:  # mtu and pciID are 1.1.0 fields: older results do not carry them
            assert set(iface) == {"name", "mac", "sandbox"}, iface
    inside = lab.netdev("net1", pod)
    assert inside is not None and inside["mac"] == FULL["mac"] and inside["up"]
    assert inside["altnames"] == []  # dropped for the move, restored at home
    assert lab.topo.addrs(pod, "net1") == ["198.51.100.9/24"]
    assert lab.netdev(lab.vfs[1]) is None
    assert lab.vf_table()["1"] == APPLIED
    assert {k: v for k, v in lab.vf_table().items() if k != "1"} == {
        k: v for k, v in lab.initial_vfs.items() if k != "1"}
    if version not in ("0.2.0", "0.3.0", "0.3.1"):
        check = lab.run("sriov", "CHECK", {**conf, "prevResult": add.out}, netns=pod)
        assert check.ok, (check.out, check.stderr)
    delete = lab.run("sriov", "DEL", conf, netns=pod)
    assert delete.ok, (delete.out, delete.stderr)
    assert_home(lab, 1, before, pod)


def test_exact_pf_requests_and_order(lab: Lab) -> None:
    pod = lab.topo.pod()
    conf = lab.conf("sriov", deviceID=VF_PCIS[2], **FULL)
    assert lab.run("sriov", "ADD", conf, netns=pod).ok
    pf, read = lab.pf, {"op": "read", "pf": lab.pf, "vf": 2}

    def put(kind: str, **values: Any) -> dict[str, Any]:
        return {"op": "set", "pf": pf, "vf": 2, "kind": kind, **values}

    assert lab.calls() == [
        read,
        put("vlan", vlan=100, qos=2, proto="802.1q"),
        put("mac", mac="02:11:22:33:44:55"), read,
        put("rate", min_tx_rate=10, max_tx_rate=1000),
        put("spoofchk", spoofchk=0),
        put("trust", trust=1),
        put("link_state", link_state=1),
    ]
    lab.reset_calls()
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert lab.calls() == [
        put("vlan", vlan=0, qos=0, proto="802.1q"),
        put("spoofchk", spoofchk=1),
        put("mac", mac="02:00:00:00:0a:02"), read,
        put("trust", trust=0),
        put("rate", min_tx_rate=0, max_tx_rate=0),
        put("link_state", link_state=0),
    ]
    lab.reset_calls()
    assert lab.run("sriov", "DEL", conf, netns=pod).ok  # the second DEL touches nothing
    assert lab.calls() == []


@pytest.mark.parametrize("fake", [True, False], ids=["recording-seam", "netlink-seam"])
def test_device_id_and_ipam_only_needs_no_pf_request(lab: Lab, fake: bool) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[0])
    conf = lab.conf("sriov", ipam=lab.static(), deviceID=VF_PCIS[0])
    add = lab.run("sriov", "ADD", conf, netns=pod, fake=fake)
    assert add.ok, (add.out, add.stderr)
    assert lab.topo.addrs(pod, "net1") == ["198.51.100.7/24"]
    assert lab.run("sriov", "DEL", conf, netns=pod, fake=fake).ok
    assert lab.calls() == []
    assert_home(lab, 0, before, pod)


def test_vlan_on_a_pf_that_cannot_do_it(lab: Lab) -> None:
    """The real netlink seam against a veth 'PF': ADD fails naming the PF, nothing changed."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[0])
    conf = lab.conf("sriov", ipam=lab.fake_ipam(), deviceID=VF_PCIS[0], vlan=100)
    add = lab.run("sriov", "ADD", conf, netns=pod, fake=False)
    assert add.rc == 1 and lab.pf in add.out["msg"], add.out
    assert "Traceback" not in add.stderr
    assert_home(lab, 0, before, pod)
    assert lab.allocations() == []


def test_pf_refusing_a_setting_leaves_everything(lab: Lab) -> None:
    pod = lab.topo.pod()
    state = lab.pf_state()
    state["pfs"][lab.pf]["unsupported"] = ["trust"]
    lab.fake_pf.write_text(json.dumps(state))
    before = lab.netdev(lab.vfs[0])
    add = lab.run("sriov", "ADD", lab.conf("sriov", deviceID=VF_PCIS[0], **FULL), netns=pod)
    assert add.rc == 1 and f"PF {lab.pf}: set VF 0 trust" in add.out["msg"]
    assert "Operation not supported" in add.out["msg"]
    assert_home(lab, 0, before, pod)


STEPS = ["snapshot", "vf-vlan", "vf-mac", "vf-link_state", "move-temp", "alias", "rename", "mac",
         "move-pod", "ipam", "configure", "record"]
PF_FAILURES = ["vlan", "mac", "rate", "spoofchk", "trust", "link_state"]


@pytest.mark.parametrize("where", [f"fault:{s}" for s in STEPS] + [f"pf:{k}" for k in PF_FAILURES]
                         + ["ipam-add"])
def test_failure_at_each_step_leaves_the_vf_as_before(lab: Lab, where: str) -> None:
    pod = lab.topo.pod()
    add_altname(lab, lab.vfs[3], f"{lab.vfs[3]}-alt")
    before = lab.netdev(lab.vfs[3])
    kind, _, step = where.partition(":")
    lab.reset_calls({step: "Invalid argument"} if kind == "pf" else None)
    ipam = lab.fake_ipam("198.51.100.20/24", "2001:db8::20/64",
                         **({"fail": "ADD"} if kind == "ipam-add" else {}))
    add = lab.run("sriov", "ADD", lab.conf("sriov", ipam=ipam, deviceID=VF_PCIS[3], **FULL),
                  netns=pod, faults=step if kind == "fault" else "")
    assert add.rc == 1, add.out
    assert "Traceback" not in add.stderr
    assert_home(lab, 3, before, pod)
    assert lab.allocations() == []


def test_ifname_taken_in_the_pod(lab: Lab) -> None:
    pod = lab.topo.pod()
    lab.topo.ip(pod, "link", "add", "name", "net1", "type", "veth", "peer", "name", "net1peer")
    before = lab.netdev(lab.vfs[0])
    add = lab.run("sriov", "ADD", lab.conf("sriov", deviceID=VF_PCIS[0], vlan=5), netns=pod)
    assert add.rc == 1 and add.out["code"] == 101
    assert lab.netdev(lab.vfs[0]) == before and lab.vf_table() == lab.initial_vfs


def test_del_twice_and_del_without_any_record(lab: Lab) -> None:
    pod = lab.topo.pod()
    conf = lab.conf("sriov", ipam=lab.fake_ipam(), deviceID=VF_PCIS[0], vlan=7)
    assert lab.run("sriov", "DEL", conf, netns=pod).ok  # DEL before any ADD
    assert lab.run("sriov", "ADD", conf, netns=pod).ok
    first, second = (lab.run("sriov", "DEL", conf, netns=pod) for _ in range(2))
    assert first.ok and second.ok, (first.out, second.out)
    assert lab.vf_table() == lab.initial_vfs and lab.allocations() == []


def test_del_with_the_netns_gone(lab: Lab) -> None:
    """The stand-in VF netdev (a veth) dies with the namespace; the PF side is still restored."""
    pod = lab.topo.pod()
    conf = lab.conf("sriov", ipam=lab.fake_ipam(), deviceID=VF_PCIS[1], **FULL)
    assert lab.run("sriov", "ADD", conf, netns=pod).ok
    kill_netns(lab.topo, pod)
    delete = lab.run("sriov", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert "found neither in the pod nor at home" in delete.stderr
    assert lab.vf_table() == lab.initial_vfs and lab.allocations() == []
    assert lab.records() == {"attachments": [], "owners": []}
    assert lab.run("sriov", "DEL", {**conf}, netns="").ok


def test_device_back_home_under_another_name(lab: Lab) -> None:
    """A physical VF returns to the host namespace when its pod's namespace dies, possibly renamed:
    DEL recognises it by its marker and restores its name, MAC and state."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[1])
    conf = lab.conf("sriov", deviceID=VF_PCIS[1], mac="02:11:22:33:44:66")
    assert lab.run("sriov", "ADD", conf, netns=pod).ok
    stray = f"{lab.topo.tag}zz"
    lab.topo.ip(pod, "link", "set", "net1", "netns", lab.topo.host)
    lab.topo.ip(lab.topo.host, "link", "set", "net1", "name", stray)
    kill_netns(lab.topo, pod)
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert lab.netdev(stray) is None
    assert_home(lab, 1, before)


def racers(lab: Lab, conf: dict[str, Any], pods: list[str]) -> list[Call]:
    plugin_command("sriov", lab.seams("sriov"))  # a frozen pass skips here, not in a racer's thread
    results: list[Call | None] = [None] * len(pods)

    def go(i: int) -> None:
        results[i] = lab.run("sriov", "ADD", conf, netns=pods[i], container_id=f"race{i}")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(pods))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]


def test_two_attachments_race_for_one_vf(lab: Lab) -> None:
    pods = [lab.topo.pod("p1"), lab.topo.pod("p2")]
    conf = lab.conf("sriov", ipam=lab.fake_ipam(), deviceID=VF_PCIS[2], vlan=42)
    results = racers(lab, conf, pods)
    winners = [i for i, r in enumerate(results) if r.ok]
    assert len(winners) == 1, [r.out for r in results]
    loser = results[1 - winners[0]]
    assert loser.out["code"] == 102
    assert f"VF {VF_PCIS[2]} is attached to container race{winners[0]}" in loser.out["msg"]
    # the runtime DELs the failed ADD: that must not touch the winner's VF
    assert lab.run("sriov", "DEL", conf, netns=pods[1 - winners[0]], container_id=f"race{1 - winners[0]}").ok
    assert lab.topo.link(pods[winners[0]], "net1") is not None
    assert lab.vf_table()["2"]["vlan"] == 42
    assert lab.run("sriov", "DEL", conf, netns=pods[winners[0]], container_id=f"race{winners[0]}").ok
    assert lab.vf_table() == lab.initial_vfs and lab.allocations() == []


def test_stale_owner_is_recovered_and_its_late_del_touches_nothing(lab: Lab) -> None:
    old, new = lab.topo.pod("p1"), lab.topo.pod("p2")
    before = lab.netdev(lab.vfs[1])
    conf = lab.conf("sriov", deviceID=VF_PCIS[1], vlan=11)
    assert lab.run("sriov", "ADD", conf, netns=old, container_id="old").ok
    lab.topo.ip(old, "link", "set", "net1", "netns", lab.topo.host)  # as the kernel does at netns death
    lab.sysfs_rename(VF_PCIS[1], lab.vfs[1], "net1")  # and sysfs names it net1 now
    kill_netns(lab.topo, old)
    add = lab.run("sriov", "ADD", {**conf, "vlan": 12}, netns=new, container_id="new")
    assert add.ok, add.out
    assert "owner old/net1 is gone" in add.stderr
    assert lab.vf_table()["1"]["vlan"] == 12
    assert lab.run("sriov", "DEL", conf, netns=old, container_id="old").ok  # late DEL of the dead pod
    assert lab.topo.link(new, "net1") is not None and lab.vf_table()["1"]["vlan"] == 12
    assert lab.run("sriov", "DEL", conf, netns=new, container_id="new").ok
    assert lab.netdev("net1") is None
    assert_home(lab, 1, before)


def test_multus_style_arguments(lab: Lab) -> None:
    pod = lab.topo.pod()
    cid = "4f1b2c3d4e5f60718293a4b5c6d7e8f90123456789abcdef0123456789abcdef"
    args = (f"IgnoreUnknown=true;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0;"
            f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=6a1c3e42-0d2b-4f7e-9a55-3c1d2e4f5a6b")
    conf = {"cniVersion": "0.3.1", "name": "sriov-rdma", "type": "sriov", "vlan": 0, "vlanQoS": 0,
            "deviceID": VF_PCIS[0], "pciBusID": VF_PCIS[0], "stateDir": str(lab.state_dir),
            "ipam": lab.static("198.51.100.30/24"), "logLevel": "debug"}
    add = lab.run("sriov", "ADD", conf, netns=pod, container_id=cid, cni_args=args, ifname="net1")
    assert add.ok, add.out
    assert add.out["interfaces"][0]["name"] == "net1"
    record = json.loads((lab.state_dir / "attachments" / f"{cid}:net1").read_text())
    assert record["pod_uid"] == "6a1c3e42-0d2b-4f7e-9a55-3c1d2e4f5a6b"
    assert record["pod_ref"] == "team-a/trainer-0"
    assert record["state"] == "attached" and record["extra"]["vf"] == 0
    assert lab.run("sriov", "DEL", conf, netns=pod, container_id=cid, cni_args=args).ok
    assert lab.vf_table() == lab.initial_vfs


def test_userspace_driver_vf(lab: Lab) -> None:
    """A vfio-pci VF: nothing is moved, PF-side settings are applied and restored, DEL works even
    after the driver link changed."""
    pod = lab.topo.pod()
    conf = lab.conf("sriov", "1.1.0", ipam=lab.fake_ipam("198.51.100.40/24"), deviceID=DPDK_PCI, vlan=200,
                    mac="02:11:22:33:44:77")
    host_before = lab.host_names()
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.ok, add.out
    assert add.out["interfaces"] == [{"name": "net1", "mac": "02:11:22:33:44:77", "sandbox": pod,
                                      "pciID": DPDK_PCI}]
    assert add.out["ips"] == [{"interface": 0, "address": "198.51.100.40/24"}]
    assert lab.topo.link(pod, "net1") is None and lab.host_names() == host_before
    assert lab.vf_table()["4"]["vlan"] == 200
    assert lab.run("sriov", "CHECK", {**conf, "prevResult": add.out}, netns=pod).ok
    (lab.sysfs / "devices/pci0000:00" / DPDK_PCI / "driver").unlink()  # unbound meanwhile
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert lab.vf_table() == lab.initial_vfs
    assert lab.records() == {"attachments": [], "owners": []}


def test_check_detects_drift(lab: Lab) -> None:
    pod = lab.topo.pod()
    conf = lab.conf("sriov", "1.0.0", ipam=lab.static(), deviceID=VF_PCIS[0], vlan=9)
    add = lab.run("sriov", "ADD", conf, netns=pod)
    checked = {**conf, "prevResult": add.out}
    assert lab.run("sriov", "CHECK", checked, netns=pod).ok
    state = lab.pf_state()
    state["pfs"][lab.pf]["vfs"]["0"]["vlan"] = 10
    lab.fake_pf.write_text(json.dumps(state))
    drift = lab.run("sriov", "CHECK", checked, netns=pod)
    assert drift.rc == 1 and drift.out["code"] == 105 and "vlan" in drift.out["msg"]
    state["pfs"][lab.pf]["vfs"]["0"]["vlan"] = 9
    lab.fake_pf.write_text(json.dumps(state))
    lab.topo.ip(pod, "link", "set", "net1", "down")
    lab.topo.ip(pod, "link", "set", "net1", "name", "renamed")
    renamed = lab.run("sriov", "CHECK", checked, netns=pod)
    assert renamed.rc == 1 and "is named renamed" in renamed.out["msg"]
    assert lab.run("sriov", "DEL", conf, netns=pod).ok  # found by its record, not by the name
    assert lab.netdev(lab.vfs[0]) is not None and lab.vf_table() == lab.initial_vfs


def test_gc_releases_only_stale_attachments_of_its_network(lab: Lab) -> None:
    pods = [lab.topo.pod(f"p{i}") for i in range(3)]
    conf = lab.conf("sriov", "1.1.0", ipam=lab.fake_ipam(), vlan=3)
    other = {**conf, "name": "other-net"}
    for i, c in ((0, conf), (1, conf), (2, other)):
        add = lab.run("sriov", "ADD", {**c, "deviceID": VF_PCIS[i]}, netns=pods[i], container_id=f"g{i}")
        assert add.ok, add.out
    gc = lab.run("sriov", "GC", {**conf, "cni.dev/valid-attachments": [
        {"containerID": "g0", "ifname": "net1"}]})
    assert gc.ok, gc.out
    assert lab.topo.link(pods[0], "net1") is not None and lab.topo.link(pods[2], "net1") is not None
    assert lab.topo.link(pods[1], "net1") is None and lab.netdev(lab.vfs[1]) is not None
    assert lab.vf_table()["1"] == lab.initial_vfs["1"] and lab.vf_table()["0"]["vlan"] == 3
    assert lab.records()["attachments"] == ["g0:net1", "g2:net1"]
    assert "GC" in (lab.ipam_state.parent / "ipam.log").read_text()
    for i, c in ((0, conf), (2, other)):
        delete = lab.run("sriov", "DEL", {**c, "deviceID": VF_PCIS[i]}, netns=pods[i], container_id=f"g{i}")
        assert delete.ok, delete.out


def test_status(lab: Lab) -> None:
    conf = lab.conf("sriov", "1.1.0")
    assert lab.run("sriov", "STATUS", conf).ok
    bad = lab.run("sriov", "STATUS", conf, env={"PYCNI_SYSFS_ROOT": str(lab.tmp / "nothing")})
    assert bad.rc == 1 and bad.out["code"] == 50


def test_incomplete_rollback_keeps_the_record_for_del(lab: Lab) -> None:
    """ADD fails at the last VF step and putting the VLAN back fails too: the record stays, and the
    DEL the runtime sends after a failed ADD finishes the restore."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[2])
    conf = lab.conf("sriov", ipam=lab.fake_ipam(), deviceID=VF_PCIS[2], **FULL)
    lab.reset_calls({"link_state": "Input/output error", "vlan@2": "Device or resource busy"})
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.rc == 1 and "rollback incomplete" in add.out["details"], add.out
    assert lab.vf_table()["2"]["vlan"] == 100  # the one step that could not be undone
    assert lab.records() == {"attachments": ["c1:net1"], "owners": [f"pci-{VF_PCIS[2]}"]}
    assert lab.netdev(lab.vfs[2]) == before  # the netdev did come home
    delete = lab.run("sriov", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert_home(lab, 2, before, pod)


def test_del_after_the_vfs_were_disabled(lab: Lab) -> None:
    """sriov_numvfs went to 0 (the VF and its settings are gone): DEL succeeds without PF requests."""
    pod = lab.topo.pod()
    conf = lab.conf("sriov", deviceID=VF_PCIS[3], vlan=30)
    assert lab.run("sriov", "ADD", conf, netns=pod).ok
    (lab.sysfs / "bus/pci/devices" / lab.pf_pci / "sriov_numvfs").write_text("0\n")
    lab.reset_calls()
    delete = lab.run("sriov", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert "no longer exists; no VF settings to restore" in delete.stderr
    assert lab.calls() == [] and lab.records() == {"attachments": [], "owners": []}


@pytest.mark.parametrize("crash", ["move-pod", "configure"])
def test_crash_during_add_then_del_or_add_again(lab: Lab, crash: str) -> None:
    """The plugin is killed half-way through ADD (no rollback runs). The DEL that follows restores
    the VF and its netdev from the snapshot; an ADD of the same attachment first does the same."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[1])
    conf = lab.conf("sriov", ipam=lab.fake_ipam("198.51.100.31/24"), deviceID=VF_PCIS[1], **FULL)
    add = lab.run("sriov", "ADD", conf, netns=pod, faults=f"{crash}!")
    assert add.rc == -signal.SIGKILL, add  # no rollback ran
    assert lab.topo.link(pod, "net1") is not None and lab.vf_table()["1"] == APPLIED
    assert lab.records()["attachments"] == ["c1:net1"]
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert_home(lab, 1, before, pod)
    assert lab.allocations() == []
    crashed = lab.run("sriov", "ADD", conf, netns=pod, faults=f"{crash}!")
    assert crashed.rc == -signal.SIGKILL, crashed
    lab.topo.ip(pod, "link", "set", "net1", "name", "eth9")  # so that ifname is free for the retry
    again = lab.run("sriov", "ADD", conf, netns=pod)
    assert again.ok, again.out
    assert "a record of this attachment exists" in again.stderr
    assert lab.topo.link(pod, "eth9") is None and lab.vf_table()["1"] == APPLIED
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    assert_home(lab, 1, before, pod)
