"""A lab for device-plugin tests: a Topology whose host namespace holds veth ends standing in for a PF,
its VF netdevs and plain NICs, a fake sysfs tree naming them, the recording VF seam's state file
(tests/fakevf.py, installed by tests/launch.py), a state dir, and a CNI_PATH with Debian's plugins plus
`fakeipam`."""

from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import fakesysfs, launch
from tests.nsutil import REPO, Call, Topology, sh

PF_PCI = "0000:af:00.1"
VF_PCIS = ["0000:af:06.0", "0000:af:06.1", "0000:af:06.2", "0000:af:06.3"]
DPDK_PCI = "0000:af:06.4"
NIC_PCI = "0000:3b:00.0"
DPDK_NIC_PCI = "0000:3b:00.1"
AUX_ID = "mlx5_core.sf.4"


def initial_vf(n: int) -> dict[str, Any]:
    return {"mac": f"02:00:00:00:0a:{n:02x}", "vlan": 0, "qos": 0, "proto": "802.1q", "spoofchk": 1,
            "trust": 0, "link_state": 0, "min_tx_rate": 0, "max_tx_rate": 0}


@dataclass
class Lab:
    topo: Topology
    tmp: Path
    vfs: list[str] = field(default_factory=list)  # VF netdev names, index = VF index

    def __post_init__(self) -> None:
        t = self.topo
        self.pf = t.add_uplink("pf")
        self.pf_pci = PF_PCI
        self.vfs = [t.add_uplink(f"v{n}") for n in range(len(VF_PCIS))]
        self.nic = t.add_uplink("nic")
        self.sf = t.add_uplink("sf")
        self.sysfs = self.tmp / "sys"
        vfs = [fakesysfs.VF(pci, name) for pci, name in zip(VF_PCIS, self.vfs, strict=True)]
        vfs.append(fakesysfs.VF(DPDK_PCI, "", "vfio-pci"))
        tree = fakesysfs.build(self.sysfs, [fakesysfs.PF(PF_PCI, self.pf, vfs)],
                               ((NIC_PCI, self.nic, "mlx5_core"), (DPDK_NIC_PCI, "", "vfio-pci")))
        tree.auxiliary(NIC_PCI, AUX_ID, self.sf)
        self.state_dir = self.tmp / "state"
        self.fake_pf = self.tmp / "pf.json"
        self.initial_vfs = {str(n): initial_vf(n) for n in range(len(VF_PCIS) + 1)}
        self.fake_pf.write_text(json.dumps({"pfs": {self.pf: {"vfs": copy.deepcopy(self.initial_vfs)}},
                                            "calls": []}))
        self.ipam_state = self.tmp / "ipam"
        self.bin = self.tmp / "bin"
        self.bin.mkdir()
        wrapper = self.bin / "fakeipam"
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {REPO / 'tests' / 'fakeipam.py'}\n")
        wrapper.chmod(0o755)

    # ---- running plugins -----------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        return {"PYCNI_SYSFS_ROOT": str(self.sysfs), **extra}

    def seams(self, plugin: str, fake: bool = True, faults: str = "") -> list[str]:
        """tests/launch.py options for a call: sriov gets the recording VF seam unless `fake` is off
        (host-device never asks a PF); `faults` as the launcher's --faults."""
        return launch.options(faults, self.fake_pf if fake and plugin == "sriov" else None)

    def conf(self, plugin: str, version: str = "1.0.0", ipam: dict[str, Any] | None = None,
             **fields: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {"cniVersion": version, "name": f"{plugin}-net", "type": plugin,
                                "stateDir": str(self.state_dir)}
        if ipam is not None:
            conf["ipam"] = ipam
        conf.update(fields)
        return conf

    def static(self, *addresses: str) -> dict[str, Any]:
        return {"type": "static", "addresses": [{"address": a} for a in addresses or ("198.51.100.7/24",)]}

    def ipam_for(self, version: str, address: str) -> dict[str, Any]:
        """Debian's static IPAM (1.1.1) speaks up to 1.0.0; fakeipam stands in for 1.1.0."""
        return self.fake_ipam(address) if version == "1.1.0" else self.static(address)

    def fake_ipam(self, *addresses: str, **extra: Any) -> dict[str, Any]:
        return {"type": "fakeipam", "state": str(self.ipam_state),
                "addresses": list(addresses or ("198.51.100.8/24",)), **extra}

    def run(self, plugin: str, command: str, conf: dict[str, Any], *, fake: bool = True, faults: str = "",
            env: dict[str, str] | None = None, **kw: Any) -> Call:
        """A plugin process; sriov with the recording VF seam unless `fake` is off, `faults` injected
        (both through tests/launch.py, from source: see nsutil.plugin_command). Never through a shared
        agent (PYCNI_TEST_AGENT=1): the lab's sysfs root is a process setting (cni.sriov.sysfs), which
        an agent started without it does not have (tests/e2e/test_multus.py runs host-device through
        an agent started with the lab's root)."""
        return self.topo.run(plugin, command, conf, env={**self.env(), "PYCNI_AGENT": "off", **(env or {})},
                             path=f"{self.bin}:/usr/lib/cni", seams=self.seams(plugin, fake, faults), **kw)

    # ---- observing ----------------------------------------------------------------------------

    def netdev(self, name: str, ns: str | None = None) -> dict[str, Any] | None:
        """What DEL must restore: name, MTU, MAC, admin state, alias, altnames (None if absent)."""
        link = self.topo.link(ns or self.topo.host, name)
        if link is None:
            return None
        return {"name": link["ifname"], "mtu": link["mtu"], "mac": link["address"],
                "up": "UP" in link["flags"], "alias": link.get("ifalias", ""),
                "altnames": sorted(link.get("altnames", []))}

    def pf_state(self) -> dict[str, Any]:
        return dict(json.loads(self.fake_pf.read_text()))

    def vf_table(self) -> dict[str, Any]:
        return dict(self.pf_state()["pfs"][self.pf]["vfs"])

    def calls(self) -> list[dict[str, Any]]:
        return list(self.pf_state()["calls"])

    def reset_calls(self, fail: dict[str, str] | None = None) -> None:
        state = self.pf_state()
        state["calls"] = []
        state["fail"] = fail or {}
        self.fake_pf.write_text(json.dumps(state))

    def records(self) -> dict[str, list[str]]:
        out = {}
        for sub in ("attachments", "owners"):
            d = self.state_dir / sub
            out[sub] = sorted(os.listdir(d)) if d.is_dir() else []
        return out

    def allocations(self) -> list[str]:
        return self.ipam_state.read_text().split() if self.ipam_state.exists() else []

    def sysfs_rename(self, pci: str, old: str, new: str) -> None:
        """What the kernel shows after a netdev rename: net/<new> under the device, class/net/<new>."""
        device = self.sysfs / "devices" / fakesysfs.BUS / pci
        os.rename(device / "net" / old, device / "net" / new)
        os.unlink(self.sysfs / "class" / "net" / old)
        os.symlink(f"../../devices/{fakesysfs.BUS}/{pci}/net/{new}", self.sysfs / "class" / "net" / new)

    def host_names(self) -> set[str]:
        return {link["ifname"] for link in self.topo.links(self.topo.host)}


def kill_netns(topo: Topology, path: str) -> None:
    """Delete a pod namespace the topology made (as a runtime does before a late DEL)."""
    name = os.path.basename(path)
    sh("ip", "netns", "del", name)
    topo.namespaces.remove(name)


# ---- the device as Multus and DRA drivers hand it over (tests/integration/test_device_channels.py) ----

SANDBOX = "5e0b9f3c2a1d4e6f8a7b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"
POD_UID = "7f3e2d1c-0b9a-4876-8543-210fedcba987"


def k8s_args(namespace: str, name: str) -> str:
    """CNI_ARGS as Multus (pkg/types/conf.go createRuntimeConf) and dra-driver-sriov (pkg/cni/cni.go
    AttachNetwork) both build them: IgnoreUnknown, then the pod's namespace, name, sandbox id and UID."""
    return (f"IgnoreUnknown=true;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={name};"
            f"K8S_POD_INFRA_CONTAINER_ID={SANDBOX};K8S_POD_UID={POD_UID}")


def device_info(tmp: Path, net: str, ifname: str, pci: str) -> str:
    """The CNI device-info file Multus names in runtimeConfig.CNIDeviceInfoFile
    (<dir>/<network>-<containerID>_<ifname>, pkg/types/conf.go delegateRuntimeConfig; the directory is
    the test's, not /var/run/k8s.cni.cncf.io/devinfo/cni) holding its copy of the device plugin's file
    (CopyDeviceInfoForCNIFromDP), as dra-driver-sriov writes that one in Multus mode
    (pkg/devicestate/deviceinfo.go saveDeviceInfoForPreparedDevice; Go's json.Marshal field order)."""
    directory = tmp / "devinfo" / "cni"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{net}-{SANDBOX}_{ifname}"
    path.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": pci}},
                               separators=(",", ":")))
    path.chmod(0o444)
    return str(path)
