"""What the macvlan integration tests share: one `Env` per test (a Topology with a pod, the fake IPAM's
state dir, the config version under test) and small readers of the kernel state.

Speed: the test configs default to `"dad": "off"` so an IPv6 gateway does not make every ADD wait a
second for duplicate address detection; the tests that are about DAD, announcements and the round
trip pass `dad="on"` (the plugin's default)."""

from __future__ import annotations

import copy
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio, netns, spec, sysctl
from tests.nsutil import REPO, Call, Topology, sh

VERSIONS = spec.SUPPORTED
CHECK_VERSIONS = tuple(v for v in VERSIONS if spec.at_least(v, "0.4.0"))
PRE_CHECK_VERSIONS = tuple(v for v in VERSIONS if v not in CHECK_VERSIONS)
# Debian's host-local (containernetworking-plugins 1.1.1) accepts configs up to 1.0.0 only
HOST_LOCAL_VERSIONS = tuple(v for v in VERSIONS if not spec.at_least(v, "1.1.0"))
FAKES = REPO / "tests" / "fakes"
CNI_PATH = f"{FAKES}:/usr/lib/cni"
V4_GW, V6_GW = "198.51.100.1", "2001:db8:1::1"


def ipam_result(n: int = 5) -> dict[str, Any]:
    """A dual-stack IPAM result (1.x shape; the fake prints it in the requested version). Routes
    without gw must go via their family's gateway; one v6 route names its own."""
    return {
        "ips": [
            {"address": f"198.51.100.{n}/24", "gateway": V4_GW},
            {"address": f"2001:db8:1::{n}/64", "gateway": V6_GW},
        ],
        "routes": [{"dst": "198.18.0.0/15"}, {"dst": "2001:db8:fe::/48"},
                   {"dst": "2001:db8:ff::/48", "gw": "2001:db8:1::fe"}],
        "dns": {"nameservers": ["198.51.100.53"]},
    }


@dataclass
class Env:
    topo: Topology
    version: str
    state: Path
    pod: str = ""
    extra_env: dict[str, str] = field(default_factory=lambda: {"PYCNI_FAKE_PYTHON": sys.executable})

    def __post_init__(self) -> None:
        self.pod = self.new_pod("p")

    def new_pod(self, role: str) -> str:
        """A pod namespace (path) where IPv6 DAD starts without the random solicitation delay."""
        pod = self.topo.pod(role)
        fd = netns.open_netns(pod)
        try:
            with netns.entered(fd):  # /proc/sys/net belongs to the namespace of whoever opens it
                sysctl.write("ipv6/conf/default/router_solicitation_delay", "0", quiet=False)
        finally:
            os.close(fd)
        return pod

    # ---- configs ------------------------------------------------------------------------------

    def fake_ipam(self, result: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        return {"type": "fakeipam", "stateDir": str(self.state),
                "result": copy.deepcopy(dict(result or ipam_result())), **extra}

    def host_local(self, subnet: str = "198.51.100.0/24", **extra: Any) -> dict[str, Any]:
        return {"type": "host-local", "dataDir": str(self.state / "host-local"),
                "ranges": [[{"subnet": subnet, **extra}]]}

    def conf(
        self, ipam: Mapping[str, Any] | None = None, *, dad: str = "off", **fields: Any
    ) -> dict[str, Any]:
        """A macvlan config on the test's uplink; `ipam=None` means the fake with ipam_result()."""
        out: dict[str, Any] = {"cniVersion": self.version, "name": "mvnet", "type": "macvlan",
                               "master": self.topo.uplink, "dad": dad,
                               "ipam": dict(ipam) if ipam is not None else self.fake_ipam()}
        out.update(fields)
        return {k: v for k, v in out.items() if v is not None}

    # ---- running ------------------------------------------------------------------------------

    def run(self, command: str, conf: Mapping[str, Any], *, netns: str | None = None, **kw: Any) -> Call:
        env = {**self.extra_env, **kw.pop("env", {})}
        return self.topo.run("macvlan", command, conf, netns=self.pod if netns is None else netns,
                             path=CNI_PATH, env=env, **kw)

    def add(self, conf: Mapping[str, Any], **kw: Any) -> dict[str, Any]:
        call = self.run("ADD", conf, **kw)
        assert call.ok, (call.out, call.stderr)
        assert isinstance(call.out, dict)
        return call.out

    # ---- the fake IPAM's records --------------------------------------------------------------

    def calls(self) -> list[tuple[str, str, str]]:
        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        lines = [jsonio.loads(line) for line in path.read_text().splitlines()]
        return [(c["command"], c["containerID"], c["ifname"]) for c in lines]

    def allocations(self) -> list[str]:
        alloc = self.state / "alloc"
        return sorted(os.listdir(alloc)) if alloc.exists() else []

    def host_local_ips(self) -> list[str]:
        """Addresses host-local holds (one file per address in its network directory)."""
        net = self.state / "host-local" / "mvnet"
        if not net.exists():
            return []
        return sorted(p.name for p in net.iterdir() if p.name[0].isdigit() or ":" in p.name)

    # ---- kernel state -------------------------------------------------------------------------

    def pod_links(self, pod: str | None = None) -> list[str]:
        return sorted(link["ifname"] for link in self.topo.links(pod or self.pod))

    def link(self, name: str = "net1", pod: str | None = None) -> dict[str, Any]:
        link = self.topo.link(pod or self.pod, name)
        assert link is not None, f"{name} not found in {pod or self.pod}"
        return link

    def host_ifindex(self, name: str) -> int:
        link = self.topo.link(self.topo.host, name)
        assert link is not None
        return int(link["ifindex"])

    def routes(self, family: str, pod: str | None = None) -> list[dict[str, Any]]:
        out = sh("ip", "-j", family, "-n", os.path.basename(pod or self.pod), "route", "show").stdout
        return list(jsonio.loads(out)) if out.strip() else []

    def foreign_host_links(self) -> list[str]:
        """Links in the test's host namespace that the topology did not make."""
        return [link["ifname"] for link in self.topo.links(self.topo.host)
                if link["ifname"] != "lo" and not link["ifname"].startswith(self.topo.tag)]


def error(call: Call, code: int, *words: str) -> None:
    """The call failed with `code` and a message naming every one of `words`."""
    assert not call.ok, call.out
    assert isinstance(call.out, dict), (call.out, call.stderr)
    assert call.out["code"] == code, call.out
    text = f"{call.out['msg']} {call.out.get('details', '')}"
    for word in words:
        assert word in text, (word, call.out)
    assert "Traceback" not in call.stderr, call.stderr
