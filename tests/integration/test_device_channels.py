"""sriov and host-device given their device the ways the ecosystem gives it, on the fake sysfs tree
(tests/devlab.py): configs exactly as Multus thin with its DRA client writes them (deviceID and pciBusID
in the plugin, runtimeConfig.deviceID and runtimeConfig.CNIDeviceInfoFile through the declared
capabilities, the device plugin's device-info file copied there) and as k8snetworkplumbingwg/
dra-driver-sriov's standalone mode writes them (a lone plugin config, top-level deviceID, its CNI_ARGS),
with what users chain today for a VF done by the plugin alone (MTU, MAC, VLAN, trust, spoofchk, link
state). Disagreeing sources are refused before anything changes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.devlab import DPDK_NIC_PCI, NIC_PCI, POD_UID, SANDBOX, VF_PCIS, Lab, device_info, k8s_args
from tests.nsutil import sh


def multus_dra(lab: Lab, plugin: str, net: str, pci: str, info: str, **fields: Any) -> dict[str, Any]:
    """A plugin config as Multus thin with its DRA client hands it over: the NAD's config with the
    capabilities it declares, deviceID and pciBusID injected (pkg/types/conf.go delegateAddDeviceID),
    runtimeConfig with the declared capabilities only (libcni), deviceID from the claim's
    k8s.cni.cncf.io/deviceID attribute (pkg/draclient)."""
    conf = lab.conf(plugin, "1.1.0", name=net, capabilities={"deviceID": True, "CNIDeviceInfoFile": True},
                    **fields)
    conf.update(deviceID=pci, pciBusID=pci, runtimeConfig={"deviceID": pci, "CNIDeviceInfoFile": info})
    return conf


def no_trace(lab: Lab) -> None:
    assert lab.records() == {"attachments": [], "owners": []}
    assert lab.allocations() == []


# ---- sriov -----------------------------------------------------------------------------------------


def test_sriov_as_multus_with_its_dra_client_writes_it(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[1])
    info = device_info(lab.tmp, "vf-test1", "net1", VF_PCIS[1])
    conf = multus_dra(lab, "sriov", "vf-test1", VF_PCIS[1], info, vlan=0, spoofchk="on", trust="on",
                      vlanQoS=0, logLevel="info", ipam=lab.fake_ipam("198.51.100.70/24"))
    args = k8s_args("vf-test7", "pod-a")
    add = lab.run("sriov", "ADD", conf, netns=pod, container_id=SANDBOX, cni_args=args)
    assert add.ok, (add.out, add.stderr)
    iface = add.out["interfaces"][0]
    assert (iface["name"], iface["sandbox"], iface["pciID"], iface["mtu"]) == ("net1", pod, VF_PCIS[1], 1500)
    assert lab.topo.addrs(pod, "net1") == ["198.51.100.70/24"]
    check = lab.run("sriov", "CHECK", {**conf, "prevResult": add.out}, netns=pod, container_id=SANDBOX,
                    cni_args=args)
    assert check.ok, (check.out, check.stderr)
    assert lab.run("sriov", "DEL", conf, netns=pod, container_id=SANDBOX, cni_args=args).ok
    assert lab.netdev(lab.vfs[1]) == before and lab.vf_table() == lab.initial_vfs
    no_trace(lab)


@pytest.mark.parametrize("where", ["runtimeConfig.deviceID", "pciBusID", "runtimeConfig.CNIDeviceInfoFile"])
def test_sriov_refuses_sources_that_disagree_before_touching_anything(lab: Lab, where: str) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[1])
    info = device_info(lab.tmp, "vf-test1", "net1",
                       VF_PCIS[2] if where == "runtimeConfig.CNIDeviceInfoFile" else VF_PCIS[1])
    conf = multus_dra(lab, "sriov", "vf-test1", VF_PCIS[1], info, vlan=7, ipam=lab.fake_ipam())
    if where == "runtimeConfig.deviceID":
        conf["runtimeConfig"]["deviceID"] = VF_PCIS[2]
    elif where == "pciBusID":
        conf["pciBusID"] = VF_PCIS[2]
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    first = ("runtimeConfig.deviceID", VF_PCIS[2 if where == "runtimeConfig.deviceID" else 1])
    other = "deviceID" if where == "runtimeConfig.deviceID" else where
    other_value = VF_PCIS[1] if where == "runtimeConfig.deviceID" else VF_PCIS[2]
    expected = f'{other}: "{other_value}" disagrees with {first[0]} "{first[1]}"'
    assert add.out["msg"].startswith(expected), add.out
    assert "Traceback" not in add.stderr
    assert lab.calls() == [] and lab.netdev(lab.vfs[1]) == before and lab.netdev(lab.vfs[2]) is not None
    assert lab.topo.link(pod, "net1") is None
    no_trace(lab)
    assert lab.run("sriov", "DEL", conf, netns=pod).ok  # DEL needs no device: it works from the record


def test_sriov_with_only_the_device_info_file_and_a_broken_one(lab: Lab) -> None:
    pod = lab.topo.pod()
    info = device_info(lab.tmp, "net", "net1", VF_PCIS[0])
    conf = lab.conf("sriov", "1.1.0", runtimeConfig={"CNIDeviceInfoFile": info})
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.ok, (add.out, add.stderr)
    assert add.out["interfaces"][0]["pciID"] == VF_PCIS[0]
    assert lab.run("sriov", "DEL", conf, netns=pod).ok
    broken = lab.tmp / "broken"
    broken.write_text('{"type": "pci", "version": "1.1.0", "pci": {')
    conf = lab.conf("sriov", "1.1.0", runtimeConfig={"CNIDeviceInfoFile": str(broken)})
    add = lab.run("sriov", "ADD", conf, netns=pod)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"] == f'runtimeConfig.CNIDeviceInfoFile: "{broken}": not a JSON device-info object'
    absent = lab.tmp / "absent"
    missing = lab.conf("sriov", "1.1.0", runtimeConfig={"CNIDeviceInfoFile": str(absent)})
    add = lab.run("sriov", "ADD", missing, netns=pod)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"].startswith(f'runtimeConfig.CNIDeviceInfoFile: "{absent}": no such file'), add.out
    assert lab.calls() == []
    no_trace(lab)


def dra_standalone(lab: Lab, nad_config: str, pci: str) -> dict[str, Any]:
    """What dra-driver-sriov's standalone mode hands libcni.AddNetwork: the NAD's spec.config with
    the network name filled in when missing (network-attachment-definition-client
    GetCNIConfigFromSpec, called with the driver's name) and top-level deviceID set to the VF's PCI
    address (pkg/devicestate/state.go prepareDevice -> pkg/types/types.go AddDeviceIDToNetConf); a
    single plugin config, no list, so nothing chained (pkg/cni/cni.go AttachNetwork)."""
    conf: dict[str, Any] = json.loads(nad_config)
    if not conf.get("name"):
        conf["name"] = "sriovnetwork.k8snetworkplumbingwg.io"
    conf["deviceID"] = pci
    conf["stateDir"] = str(lab.state_dir)  # the lab's state dir, not the node's
    return conf


# demo/single-vf-claim/single-vf.yaml's NetworkAttachmentDefinition, with fakeipam (which speaks 1.1.0)
# for host-local and this repository's test addresses, plus what users chain tuning for on a VF today
SINGLE_VF_NAD = """{
    "cniVersion": "%(version)s",
    "name": "vf-test1",
    "type": "sriov",
    "vlan": 100,
    "spoofchk": "off",
    "trust": "on",
    "vlanQoS": 0,
    "link_state": "enable",
    "mac": "02:11:22:33:44:66",
    "mtu": 9000,
    "logLevel": "info",
    "ipam": {"type": "fakeipam", "state": "%(state)s", "addresses": ["198.51.100.71/24"]}
}"""


@pytest.mark.parametrize("version", ["1.0.0", "1.1.0"])
def test_sriov_as_dra_driver_sriov_standalone_writes_it(lab: Lab, version: str) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[3])
    conf = dra_standalone(lab, SINGLE_VF_NAD % {"version": version, "state": lab.ipam_state}, VF_PCIS[3])
    args = k8s_args("vf-test1", "pod0")
    add = lab.run("sriov", "ADD", conf, netns=pod, container_id=SANDBOX, cni_args=args, ifname="vfnet0")
    assert add.ok, (add.out, add.stderr)
    # what the driver copies into the claim status (pkg/cni/status.go cniResultToNetworkData: the
    # interface with a sandbox, its MAC, the IPs) and the full result it keeps
    iface = add.out["interfaces"][0]
    assert (iface["name"], iface["mac"], iface["sandbox"]) == ("vfnet0", "02:11:22:33:44:66", pod)
    assert [ip["address"] for ip in add.out["ips"]] == ["198.51.100.71/24"]
    if version == "1.1.0":
        assert (iface["mtu"], iface["pciID"]) == (9000, VF_PCIS[3])
    else:  # 1.0.0 interfaces have name, mac, sandbox only (mtu and pciID are 1.1.0 fields)
        assert set(iface) == {"name", "mac", "sandbox"}
    inside = lab.netdev("vfnet0", pod)
    assert inside is not None
    assert (inside["mtu"], inside["mac"], inside["up"]) == (9000, "02:11:22:33:44:66", True)
    assert lab.vf_table()["3"] == {"mac": "02:11:22:33:44:66", "vlan": 100, "qos": 0, "proto": "802.1q",
                                   "spoofchk": 0, "trust": 1, "link_state": 1, "min_tx_rate": 0,
                                   "max_tx_rate": 0}
    record = json.loads((lab.state_dir / "attachments" / f"{SANDBOX}:vfnet0").read_text())
    assert (record["pod_ref"], record["pod_uid"]) == ("vf-test1/pod0", POD_UID)
    delete = lab.run("sriov", "DEL", conf, netns=pod, container_id=SANDBOX, cni_args=args, ifname="vfnet0")
    assert delete.ok, (delete.out, delete.stderr)
    assert lab.netdev(lab.vfs[3]) == before  # MTU 1500 and the MAC back
    assert lab.vf_table() == lab.initial_vfs
    no_trace(lab)


# ---- host-device -----------------------------------------------------------------------------------


def test_hostdevice_as_multus_with_its_dra_client_writes_it(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.nic)
    info = device_info(lab.tmp, "hostdev", "net1", NIC_PCI)
    conf = multus_dra(lab, "host-device", "hostdev", NIC_PCI, info, ipam=lab.fake_ipam("198.51.100.72/24"))
    args = k8s_args("ml", "worker-0")
    add = lab.run("host-device", "ADD", conf, netns=pod, container_id=SANDBOX, cni_args=args)
    assert add.ok, (add.out, add.stderr)
    iface = add.out["interfaces"][0]
    assert (iface["name"], iface["pciID"], iface["mtu"]) == ("net1", NIC_PCI, before["mtu"])  # type: ignore[index]
    assert lab.run("host-device", "DEL", conf, netns=pod, container_id=SANDBOX, cni_args=args).ok
    assert lab.netdev(lab.nic) == before
    no_trace(lab)
    wrong = device_info(lab.tmp, "hostdev", "net2", VF_PCIS[0])
    conf = multus_dra(lab, "host-device", "hostdev", NIC_PCI, wrong, ipam=lab.fake_ipam())
    add = lab.run("host-device", "ADD", conf, netns=pod, container_id=SANDBOX, cni_args=args, ifname="net2")
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"].startswith(
        f'runtimeConfig.CNIDeviceInfoFile: "{VF_PCIS[0]}" disagrees with runtimeConfig.deviceID "{NIC_PCI}"')
    assert lab.netdev(lab.nic) == before and lab.topo.link(pod, "net2") is None
    no_trace(lab)


def test_hostdevice_named_selectors_win_over_the_device_id_sources(lab: Lab) -> None:
    """`device` (then hwaddr, kernelpath) decides as in upstream host-device; the id sources, Multus'
    injected ones included, are not consulted then."""
    pod = lab.topo.pod()
    info = device_info(lab.tmp, "hostdev", "net1", VF_PCIS[0])
    conf = multus_dra(lab, "host-device", "hostdev", VF_PCIS[1], info, device=lab.nic)
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.ok, (add.out, add.stderr)
    assert add.out["interfaces"][0]["pciID"] == NIC_PCI
    assert lab.run("host-device", "DEL", conf, netns=pod).ok
    no_trace(lab)


def test_hostdevice_mtu_set_in_the_pod_and_restored(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.nic)
    conf = lab.conf("host-device", "1.1.0", pciBusID=NIC_PCI, mtu=4000)
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.ok, (add.out, add.stderr)
    assert add.out["interfaces"][0]["mtu"] == 4000
    assert lab.netdev("net1", pod)["mtu"] == 4000  # type: ignore[index]
    assert lab.run("host-device", "CHECK", {**conf, "prevResult": add.out}, netns=pod).ok
    lab.topo.ip(pod, "link", "set", "dev", "net1", "mtu", "1500")
    check = lab.run("host-device", "CHECK", {**conf, "prevResult": add.out}, netns=pod)
    assert check.rc == 1 and check.out["code"] == 105, check.out
    assert check.out["msg"] == "net1: MTU 1500 does not match mtu 4000"
    assert lab.run("host-device", "DEL", conf, netns=pod).ok
    assert lab.netdev(lab.nic) == before
    no_trace(lab)


def test_an_mtu_the_device_refuses_is_code_7_and_changes_nothing(lab: Lab) -> None:
    """A macvlan refuses an MTU above its lower device's (EINVAL, like a VF above its PF's)."""
    host = lab.topo.host
    sh("ip", "-n", host, "link", "add", "link", lab.pf, "name", "mv9", "type", "macvlan")
    before = lab.netdev("mv9")
    pod = lab.topo.pod()
    conf = lab.conf("host-device", device="mv9", mtu=9000, ipam=lab.fake_ipam())
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"].startswith("mtu: 9000 refused by mv9: Invalid argument"), add.out
    assert lab.netdev("mv9") == before and lab.topo.link(pod, "net1") is None
    no_trace(lab)


def test_mtu_on_a_userspace_driver_device_is_refused(lab: Lab) -> None:
    pod = lab.topo.pod()
    conf = lab.conf("host-device", pciBusID=DPDK_NIC_PCI, mtu=9000, ipam=lab.fake_ipam())
    add = lab.run("host-device", "ADD", conf, netns=pod)
    assert add.rc == 1 and add.out["code"] == 7, add.out
    assert add.out["msg"] == (f'mtu: pciBusID "{DPDK_NIC_PCI}" is bound to vfio-pci: no network interface '
                              "to set it on")
    no_trace(lab)
