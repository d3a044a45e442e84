"""The product has no test switches: the environment variables that once selected test seams,
PYCNI_TEST_FAULTS (fault points) and PYCNI_SRIOV_FAKE_PF (the recording VF seam), change nothing.
These calls run the product as each pass runs it (from source, frozen, frozen through the agent),
with both variables set: every fault point named, each one as a kill and as a failure, and the fake's
state file. The seams exist only in a test process (tests/launch.py)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

from tests import ipamutil
from tests.devlab import NIC_PCI, VF_PCIS, Lab

STEPS = ("link", "rename", "ipam", "configure", "snapshot", "move-temp", "alias", "mac", "move-pod",
         "record", "store-reserve", "store-commit", "result",
         *(f"vf-{k}" for k in ("vlan", "mac", "rate", "spoofchk", "trust", "link_state")))
FULL = {"vlan": 100, "mac": "02:11:22:33:44:55", "spoofchk": "off", "trust": "on", "link_state": "enable",
        "min_tx_rate": 10, "max_tx_rate": 1000}


def former_switches(lab: Lab) -> dict[str, str]:
    return {"PYCNI_TEST_FAULTS": ",".join([*(f"{s}!" for s in STEPS), *STEPS]),
            "PYCNI_SRIOV_FAKE_PF": str(lab.fake_pf)}


def whereabouts(tmp: Path) -> tuple[dict[str, Any], str]:
    """Our IPAM on a local store in `tmp`, and the CNI_PATH that finds it: the frozen bundle's entry in
    the frozen passes (the plugin then runs it in-process, as installed), the source otherwise."""
    flat = tmp / "whereabouts.conf"
    flat.write_text("{}")
    ipam = {"type": "whereabouts", "range": "198.18.7.0/29", "datastore": "local",
            "local_db": str(tmp / "ipam" / "w.db"), "configuration_path": str(flat)}
    frozen = os.environ.get("PYCNI_PLUGIN_DIR")
    path = frozen or str(ipamutil.write_wrappers(tmp / "ipam-bin"))
    return ipam, f"{path}:/usr/lib/cni"


def test_macvlan_and_whereabouts_ignore_the_former_switches(lab: Lab, tmp_path: Path) -> None:
    pod = lab.topo.pod()
    ipam, path = whereabouts(tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "no-switch", "type": "macvlan", "master": lab.topo.uplink,
            "dad": "off", "ipam": ipam}
    env = {**lab.env(), **former_switches(lab)}
    add = lab.topo.run("macvlan", "ADD", conf, netns=pod, env=env, path=path)
    assert add.ok, (add.rc, add.out, add.stderr)
    assert lab.topo.addrs(pod, "net1") == ["198.18.7.1/29"]
    assert lab.topo.run("macvlan", "DEL", conf, netns=pod, env=env, path=path).ok
    assert lab.topo.link(pod, "net1") is None


def test_host_device_ignores_the_former_switches(lab: Lab) -> None:
    pod = lab.topo.pod()
    before = lab.netdev(lab.nic)
    conf = lab.conf("host-device", ipam=lab.fake_ipam("198.51.100.62/24"), pciBusID=NIC_PCI)
    add = lab.run("host-device", "ADD", conf, netns=pod, env=former_switches(lab))
    assert add.ok, (add.rc, add.out, add.stderr)
    assert lab.topo.addrs(pod, "net1") == ["198.51.100.62/24"]
    assert lab.run("host-device", "DEL", conf, netns=pod, env=former_switches(lab)).ok
    assert lab.netdev(lab.nic) == before
    assert lab.records() == {"attachments": [], "owners": []} and lab.allocations() == []


def test_sriov_ignores_the_former_switches(lab: Lab) -> None:
    """No fault fires, and the PF is asked through netlink (a veth 'PF' has no VFs to report), never
    through the fake's state file."""
    pod = lab.topo.pod()
    before = lab.netdev(lab.vfs[0])
    state = copy.deepcopy(lab.pf_state())
    plain = lab.conf("sriov", ipam=lab.fake_ipam("198.51.100.63/24"), deviceID=VF_PCIS[0])
    add = lab.run("sriov", "ADD", plain, netns=pod, fake=False, env=former_switches(lab))
    assert add.ok, (add.rc, add.out, add.stderr)
    assert lab.run("sriov", "DEL", plain, netns=pod, fake=False, env=former_switches(lab)).ok
    assert lab.netdev(lab.vfs[0]) == before
    settings = lab.conf("sriov", ipam=lab.fake_ipam("198.51.100.63/24"), deviceID=VF_PCIS[0], **FULL)
    refused = lab.run("sriov", "ADD", settings, netns=pod, fake=False, env=former_switches(lab))
    # the kernel's answer: a veth reports no VFs (the fake's table has VF 0)
    assert refused.rc == 1 and refused.out["msg"].startswith(f"PF {lab.pf}: reports no VF 0"), refused
    assert lab.pf_state() == state, "the fake's state file was never opened"
    assert lab.netdev(lab.vfs[0]) == before and lab.topo.link(pod, "net1") is None
    assert lab.records() == {"attachments": [], "owners": []} and lab.allocations() == []
