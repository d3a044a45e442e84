"""Import cost is latency: a real macvlan ADD/DEL (host-local from /usr/lib/cni) under
`python -X importtime` speaks netlink through cni.netlink.nla and loads no pyroute2 at all (only the
netlink tests use it, as their reference codec), nor asyncio or ssl; neither does VERSION. Runs from
source (the frozen bundle has no -X)."""

from __future__ import annotations

from pathlib import Path

from tests.bench import importprof
from tests.e2e import libcni
from tests.nsutil import Topology


def test_add_and_del_speak_netlink_without_pyroute2(topo: Topology, tmp_path: Path) -> None:
    entry = libcni.source_plugin_dir(tmp_path / "bin") / "macvlan"
    pod = topo.pod()
    conf = {"cniVersion": "1.0.0", "name": "imports", "type": "macvlan", "master": topo.uplink,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path / "hl"),
                     "ranges": [[{"subnet": "198.51.100.0/24"}]]}}
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": pod, "CNI_IFNAME": "net1", "CNI_PATH": libcni.REFERENCE_DIR,
           "PYCNI_AGENT": "off"}  # the in-process path (the shim's own: tests/unit/test_agent_shim.py)
    for command in ("ADD", "DEL"):
        prof = importprof.profile_call(topo.host, entry, {**env, "CNI_COMMAND": command}, conf)
        assert prof.rc == 0, prof.stdout
        assert len(prof.entries) > 50, "no -X importtime output parsed"
        assert "cni.netlink.nla" in prof.names(), "netlink was not spoken?"
        assert prof.matching("pyroute2") == [], command
        assert not {"asyncio", "ssl", "logging", "dataclasses"} & prof.names(), command
    assert topo.link(pod, "net1") is None


def test_version_loads_no_pyroute2(topo: Topology, tmp_path: Path) -> None:
    entry = libcni.source_plugin_dir(tmp_path / "bin") / "macvlan"
    prof = importprof.profile_call(topo.host, entry, {"CNI_COMMAND": "VERSION"}, {"cniVersion": "1.0.0"})
    assert prof.rc == 0 and b"supportedVersions" in prof.stdout
    assert prof.matching("pyroute2") == []
