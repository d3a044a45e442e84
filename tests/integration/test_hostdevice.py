"""host-device in real namespaces: veth ends in the host namespace stand in for NICs, a fake sysfs
tree gives them PCI addresses (and one vfio-pci device without a netdev)."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from tests.devlab import AUX_ID, DPDK_NIC_PCI, NIC_PCI, VF_PCIS, Lab, kill_netns
from tests.nsutil import Call, sh

STEPS = ["snapshot", "move-temp", "alias", "rename", "move-pod", "ipam", "configure", "record"]


def customise(lab: Lab, dev: str) -> dict[str, Any]:
    """Give the device state worth restoring: MTU, alias, altname; return the snapshot."""
    host = lab.topo.host
    sh("ip", "-n", host, "link", "set", "dev", dev, "mtu", "1400", "alias", "uplink to leaf 7")
    sh("ip", "-n", host, "link", "property", "add", "dev", dev, "altname", f"{dev}-alt")
    snap = lab.netdev(dev)
    assert snap is not None
    return snap


def assert_home(lab: Lab, dev: str, before: dict[str, Any], pod: str | None = None) -> None:
    assert lab.netdev(dev) == before
    assert lab.records() == {"attachments": [], "owners": []}
    if pod is not None:
        assert lab.topo.link(pod, "net1") is None


@pytest.mark.parametrize("version", ["0.1.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_add_check_del(lab: Lab, version: str) -> None:
    pod = lab.topo.pod()
    before = customise(lab, lab.nic)
    conf = lab.conf("host-device", version, ipam=lab.ipam_for(version, "198.51.100.50/24"), device=lab.nic)
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.ok, (add.out, add.stderr)
    if version == "0.1.0":
        assert add.out["ip4"]["ip"] == "198.51.100.50/24"
    else:
        iface = add.out["interfaces"][0]
        assert (iface["name"], iface["mac"], iface["sandbox"]) == ("net1", before["mac"], pod)
        assert add.out["ips"][0]["address"] == "198.51.100.50/24"
        if version == "1.1.0":
            assert (iface["mtu"], iface["pciID"]) == (1400, NIC_PCI)
        else:  # mtu and pciID are 1.1.0 fields: older results do not carry them
            assert set(iface) == {"name", "mac", "sandbox"}, iface
    assert lab.netdev(lab.nic) is None
    inside = lab.netdev("net1", pod)
    assert inside is not None and inside["up"] and inside["mtu"] == 1400
    assert lab.topo.addrs(pod, "net1") == ["198.51.100.50/24"]
    if version not in ("0.1.0", "0.3.0", "0.3.1"):
        check = lab.run("host-device", "CHECK", {**conf, "prevResult": add.out}, netns=pod)
        assert check.ok, (check.out, check.stderr)
    delete = lab.run("host-device", "DEL", conf, netns=pod)
    assert delete.ok, (delete.out, delete.stderr)
    assert_home(lab, lab.nic, before, pod)


def selected(lab: Lab, **fields: Any) -> Call:
    """ADD with these selector fields (in a fresh pod); on success DEL again."""
    pod = lab.topo.pod(f"s{len(lab.topo.namespaces)}")
    add = lab.run("host-device", "ADD", lab.conf("host-device", **fields), netns=pod)
    if add.ok:
        assert lab.run("host-device", "DEL", lab.conf("host-device", **fields), netns=pod).ok
    return add


def test_selectors(lab: Lab) -> None:
    nic_mac = lab.topo.link(lab.topo.host, lab.nic)["address"]  # type: ignore[index]
    for fields in (
        {"device": lab.nic},
        {"hwaddr": nic_mac.upper()},
        {"kernelpath": f"/sys/devices/pci0000:00/{NIC_PCI}"},
        {"pciBusID": NIC_PCI},
        {"deviceID": NIC_PCI},
        {"runtimeConfig": {"deviceID": NIC_PCI}},
        {"runtimeConfig": {"deviceID": NIC_PCI}, "pciBusID": NIC_PCI, "deviceID": NIC_PCI},  # they agree
        {"device": lab.nic, "pciBusID": VF_PCIS[0]},  # device wins over pciBusID
    ):
        before = lab.netdev(lab.nic)
        add = selected(lab, **fields)
        assert add.ok, (fields, add.out)
        assert add.out["interfaces"][0]["mac"] == nic_mac, fields
        assert lab.netdev(lab.nic) == before
    aux = selected(lab, runtimeConfig={"deviceID": AUX_ID})
    assert aux.ok, aux.out
    assert aux.out["interfaces"][0]["mac"] == lab.topo.link(lab.topo.host, lab.sf)["address"]  # type: ignore[index]


@pytest.mark.parametrize(("fields", "message"), [
    ({"device": "nosuchdev0"}, 'device "nosuchdev0": interface nosuchdev0 not found in the host network'),
    ({"hwaddr": "02:de:ad:be:ef:01"}, 'hwaddr: "02:de:ad:be:ef:01": no interface with this MAC'),
    ({"hwaddr": "not-a-mac"}, 'hwaddr: not a MAC address: "not-a-mac"'),
    ({"kernelpath": "/sys/devices/pci0000:00/0000:99:00.0"},
     'kernelpath: "/sys/devices/pci0000:00/0000:99:00.0": no such device'),
    ({"kernelpath": "/etc/passwd"}, 'kernelpath: "/etc/passwd" must be an absolute path under /sys/devices/'),
    ({"pciBusID": "0000:99:00.0"}, 'pciBusID: "0000:99:00.0": no such PCI or auxiliary device'),
    ({"deviceID": "0000:99:00.1"}, 'deviceID: "0000:99:00.1": no such PCI or auxiliary device'),
    ({"runtimeConfig": {"deviceID": "mlx5_core.sf.99"}},
     'runtimeConfig.deviceID: "mlx5_core.sf.99": no such PCI or auxiliary device'),
    ({}, "specify one of device, hwaddr, kernelpath, pciBusID or deviceID"),
    ({"runtimeConfig": {"deviceID": NIC_PCI}, "pciBusID": VF_PCIS[0]},
     f'pciBusID: "{VF_PCIS[0]}" disagrees with runtimeConfig.deviceID "{NIC_PCI}"'),
    ({"runtimeConfig": {"deviceID": AUX_ID}, "deviceID": NIC_PCI},
     f'deviceID: "{NIC_PCI}" disagrees with runtimeConfig.deviceID "{AUX_ID}"'),
])
def test_unknown_selector_values(lab: Lab, fields: dict[str, Any], message: str) -> None:
    add = selected(lab, **fields)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"].startswith(message), add.out["msg"]
    assert lab.records() == {"attachments": [], "owners": []}


def test_userspace_driver_device(lab: Lab) -> None:
    pod = lab.topo.pod()
    conf = lab.conf("host-device", ipam=lab.fake_ipam("198.51.100.60/24"), pciBusID=DPDK_NIC_PCI)
    host_before = lab.host_names()
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.ok, add.out
    assert add.out["interfaces"] == [{"name": "net1", "sandbox": pod}]
    assert add.out["ips"] == [{"interface": 0, "address": "198.51.100.60/24"}]
    assert lab.host_names() == host_before and lab.topo.link(pod, "net1") is None
    assert lab.allocations() == ["c1/net1"]
    assert lab.run("host-device", "CHECK", {**conf, "prevResult": add.out}, netns=pod).ok
    (lab.sysfs / "devices/pci0000:00" / DPDK_NIC_PCI / "driver").unlink()  # unbound before DEL
    assert lab.run("host-device", "DEL", conf, netns=pod).ok
    assert lab.allocations() == [] and lab.records() == {"attachments": [], "owners": []}


@pytest.mark.parametrize("where", [f"fault:{s}" for s in STEPS] + ["ipam-add"])
def test_failure_at_each_step_leaves_the_device_as_before(lab: Lab, where: str) -> None:
    pod = lab.topo.pod()
    before = customise(lab, lab.nic)
    kind, _, step = where.partition(":")
    fail = {"fail": "ADD"} if kind == "ipam-add" else {}
    ipam = lab.fake_ipam("198.51.100.61/24", "2001:db8::61/64", **fail)
    add = lab.run("host-device", "ADD", lab.conf("host-device", ipam=ipam, device=lab.nic), netns=pod,
                  faults=step if kind == "fault" else "")
    assert add.rc == 1, add.out
    assert "Traceback" not in add.stderr
    assert_home(lab, lab.nic, before, pod)
    assert lab.allocations() == []


def test_pod_changes_are_undone_and_the_device_is_found_by_its_record(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = customise(lab, lab.nic)
    conf = lab.conf("host-device", device=lab.nic)
    assert lab.run("host-device", "ADD", conf, netns=pod).ok
    lab.topo.ip(pod, "link", "set", "net1", "down")
    lab.topo.ip(pod, "link", "set", "net1", "name", "eth7", "mtu", "1280", "address", "02:66:66:66:66:66")
    delete = lab.run("host-device", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert_home(lab, lab.nic, before)
    assert lab.topo.link(pod, "eth7") is None


def test_original_name_taken_when_it_comes_home(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = customise(lab, lab.nic)
    conf = lab.conf("host-device", device=lab.nic)
    assert lab.run("host-device", "ADD", conf, netns=pod).ok
    sh("ip", "-n", lab.topo.host, "link", "add", "name", lab.nic, "type", "veth", "peer", "name",
       f"{lab.nic}q")
    delete = lab.run("host-device", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert f"device {lab.nic} came home as pycni" in delete.stderr
    home = [n for n in lab.host_names() if n.startswith("pycni")]
    assert len(home) == 1
    got = lab.netdev(home[0])
    assert got == {**before, "name": home[0]}
    assert lab.records() == {"attachments": [], "owners": []}
    assert lab.run("host-device", "DEL", conf, netns=pod).ok


def test_ifname_equal_to_a_host_name_and_device_name_present_in_the_pod(lab: Lab) -> None:
    pod = lab.topo.pod()
    lab.topo.ip(pod, "link", "add", "name", lab.nic, "type", "veth", "peer", "name", "podpeer")
    before = lab.netdev(lab.nic)
    conf = lab.conf("host-device", device=lab.nic)
    add = lab.run("host-device", "ADD", conf, netns=pod, ifname=lab.pf)  # a name the host uses
    assert add.ok, add.out
    assert lab.topo.link(pod, lab.pf) is not None and lab.topo.link(pod, lab.nic) is not None
    assert lab.run("host-device", "DEL", conf, netns=pod, ifname=lab.pf).ok
    assert lab.netdev(lab.nic) == before and lab.topo.link(pod, lab.pf) is None


def test_ifname_taken_in_the_pod(lab: Lab) -> None:
    pod = lab.topo.pod()
    lab.topo.ip(pod, "link", "add", "name", "net1", "type", "veth", "peer", "name", "podpeer")
    before = lab.netdev(lab.nic)
    add = lab.run("host-device", "ADD", lab.conf("host-device", device=lab.nic), netns=pod)
    assert add.rc == 1 and add.out["code"] == 101 and 'CNI_IFNAME "net1" already exists' in add.out["msg"]
    assert lab.netdev(lab.nic) == before


def test_del_twice_netns_gone_and_empty_netns(lab: Lab) -> None:
    conf = lab.conf("host-device", ipam=lab.fake_ipam(), device=lab.nic)
    pod = lab.topo.pod("p1")
    before = lab.netdev(lab.nic)
    assert lab.run("host-device", "ADD", conf, netns=pod).ok
    assert lab.run("host-device", "DEL", conf, netns="").ok  # CNI_NETNS empty: the record knows it
    assert lab.run("host-device", "DEL", conf, netns=pod).ok
    assert_home(lab, lab.nic, before, pod)
    assert lab.allocations() == []
    pod2 = lab.topo.pod("p2")
    assert lab.run("host-device", "ADD", conf, netns=pod2, container_id="c2").ok
    kill_netns(lab.topo, pod2)  # the veth dies with it
    gone = lab.run("host-device", "DEL", conf, netns=pod2, container_id="c2")
    assert gone.ok, gone.out
    assert lab.records() == {"attachments": [], "owners": []} and lab.allocations() == []


def test_two_attachments_race_for_one_device(lab: Lab) -> None:
    pods = [lab.topo.pod("p1"), lab.topo.pod("p2")]
    conf = lab.conf("host-device", pciBusID=NIC_PCI)
    results: list[Call] = []
    lock = threading.Lock()

    def go(i: int) -> None:
        call = lab.run("host-device", "ADD", conf, netns=pods[i], container_id=f"race{i}")
        with lock:
            results.append(call)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.ok for r in results) == [False, True], [r.out for r in results]
    loser = next(r for r in results if not r.ok)
    assert loser.out["code"] == 102
    assert f'pciBusID "{NIC_PCI}" is attached to container race' in loser.out["msg"]
    for i in range(2):
        assert lab.run("host-device", "DEL", conf, netns=pods[i], container_id=f"race{i}").ok
    assert lab.netdev(lab.nic) is not None and lab.records() == {"attachments": [], "owners": []}


def test_a_vf_held_by_sriov_is_busy_for_host_device(lab: Lab) -> None:
    pods = [lab.topo.pod("p1"), lab.topo.pod("p2")]
    sriov = lab.conf("sriov", deviceID=VF_PCIS[0])
    assert lab.run("sriov", "ADD", sriov, netns=pods[0], container_id="s1").ok
    add = lab.run("host-device", "ADD", lab.conf("host-device", pciBusID=VF_PCIS[0]), netns=pods[1])
    assert add.rc == 1 and add.out["code"] == 102 and "attached to container s1" in add.out["msg"]
    assert lab.run("sriov", "DEL", sriov, netns=pods[0], container_id="s1").ok


def test_check_and_gc_and_status(lab: Lab) -> None:
    pods = [lab.topo.pod("p1"), lab.topo.pod("p2")]
    conf = lab.conf("host-device", "1.1.0", ipam=lab.fake_ipam("198.51.100.70/24"))
    first = lab.run("host-device", "ADD", {**conf, "device": lab.nic}, netns=pods[0], container_id="k1")
    assert first.ok, first.out
    assert lab.run("host-device", "ADD", {**conf, "device": lab.sf}, netns=pods[1], container_id="k2").ok
    checked = {**conf, "device": lab.nic, "prevResult": first.out}
    assert lab.run("host-device", "CHECK", checked, netns=pods[0], container_id="k1").ok
    lab.topo.ip(pods[0], "addr", "flush", "dev", "net1")
    lost = lab.run("host-device", "CHECK", checked, netns=pods[0], container_id="k1")
    assert lost.rc == 1 and "address 198.51.100.70/24 from prevResult is missing" in lost.out["msg"]
    gc = lab.run("host-device", "GC", {**conf, "cni.dev/valid-attachments": [
        {"containerID": "k1", "ifname": "net1"}]})
    assert gc.ok, gc.out
    assert lab.netdev(lab.sf) is not None and lab.topo.link(pods[1], "net1") is None
    assert lab.records()["attachments"] == ["k1:net1"]
    assert lab.run("host-device", "STATUS", conf).ok
    broken = lab.run("host-device", "STATUS", {**conf, "stateDir": "/proc/pycni-state"})
    assert broken.rc == 1 and broken.out["code"] == 50
    assert lab.run("host-device", "DEL", {**conf, "device": lab.nic}, netns=pods[0], container_id="k1").ok


def test_multus_style_hostdevicenetwork(lab: Lab) -> None:
    """network-operator's HostDeviceNetwork NAD has no selector: Multus injects top-level deviceID and
    pciBusID, sends IgnoreUnknown and K8S_POD_* in CNI_ARGS and picks ifname net1."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.nic)
    cid = "9d8c7b6a5f4e3d2c1b0a99887766554433221100ffeeddccbbaa998877665544"
    args = (f"IgnoreUnknown=true;K8S_POD_NAMESPACE=ml;K8S_POD_NAME=worker-3;"
            f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9")
    conf = {"cniVersion": "0.3.1", "name": "example-hostdevice-network", "type": "host-device",
            "ipam": lab.static("198.51.100.90/24"), "deviceID": NIC_PCI, "pciBusID": NIC_PCI,
            "stateDir": str(lab.state_dir)}
    add = lab.run("host-device", "ADD", conf, netns=pod, container_id=cid, cni_args=args, ifname="net1")
    assert add.ok, add.out
    assert add.out["interfaces"][0]["name"] == "net1" and lab.topo.addrs(pod, "net1") == ["198.51.100.90/24"]
    owner = json.loads((lab.state_dir / "owners" / f"pci-{NIC_PCI}").read_text())
    assert (owner["podUID"], owner["podRef"]) == ("0b1c2d3e-4f50-4617-8293-a4b5c6d7e8f9", "ml/worker-3")
    assert lab.run("host-device", "DEL", conf, netns=pod, container_id=cid, cni_args=args).ok
    assert_home(lab, lab.nic, before, pod)


def test_del_when_the_device_is_already_home(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = customise(lab, lab.nic)
    conf = lab.conf("host-device", device=lab.nic)
    assert lab.run("host-device", "ADD", conf, netns=pod).ok
    lab.topo.ip(pod, "link", "set", "net1", "netns", lab.topo.host)
    lab.topo.ip(lab.topo.host, "link", "set", "net1", "name", lab.nic)
    delete = lab.run("host-device", "DEL", conf, netns=pod)
    assert delete.ok, delete.out
    assert_home(lab, lab.nic, before, pod)  # alias, MTU, altnames and admin state as before
