"""Two pods with four rails each for the multi-rail tests (tests/integration/test_rail.py, the
reference comparison tests/e2e/test_rail_reference.py, the cost in tests/bench): per rail a bridge in
the topology's host namespace and, per pod, a veth whose host end is the macvlan master and whose
other end is in the rail's bridge; the pods' interfaces are net1..net4. `subnets` gives a rail's
host-local ranges: all rails in one subnet, or one subnet per rail with a gateway (an address of the
rail's bridge; the host namespace forwards between rails)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio
from tests.nsutil import Topology, sh

RAILS = 4
COUNT = 20
VERSION = "1.0.0"  # Debian's host-local accepts configs up to 1.0.0


def one_subnet(rail: int) -> list[dict[str, str]]:
    return [{"subnet": "198.51.100.0/24"}, {"subnet": "2001:db8:1::/64"}]


def per_rail(rail: int) -> list[dict[str, str]]:
    return [{"subnet": f"198.18.{rail}.0/24", "gateway": f"198.18.{rail}.1"},
            {"subnet": f"2001:db8:{rail + 10}::/64", "gateway": f"2001:db8:{rail + 10}::1"}]


@dataclass
class Pod:
    path: str
    cid: str
    addrs: dict[int, list[str]] = field(default_factory=dict)  # rail -> addresses (no prefix)

    @property
    def ns(self) -> str:
        return os.path.basename(self.path)


@dataclass
class Rails:
    topo: Topology
    state: Path
    subnets: Any
    pods: list[Pod] = field(default_factory=list)

    def __post_init__(self) -> None:
        host = self.topo.host
        sh("ip", "netns", "exec", host, "sysctl", "-qw", "net.ipv4.ip_forward=1",
           "net.ipv6.conf.all.forwarding=1")
        for rail in range(RAILS):
            bridge = f"{self.topo.tag}b{rail}"
            sh("ip", "-n", host, "link", "add", bridge, "type", "bridge")
            sh("ip", "-n", host, "link", "set", bridge, "up")
            for gw in (s.get("gateway") for s in self.subnets(rail)):
                if gw:
                    plen = 24 if "." in gw else 64
                    sh("ip", "-n", host, "addr", "add", f"{gw}/{plen}", "dev", bridge, "nodad")
        for p in range(2):
            for rail in range(RAILS):
                master, peer = self.master(p, rail), f"{self.master(p, rail)}x"
                sh("ip", "-n", host, "link", "add", master, "type", "veth", "peer", "name", peer)
                sh("ip", "-n", host, "link", "set", peer, "master", f"{self.topo.tag}b{rail}")
                for dev in (master, peer):
                    sh("ip", "-n", host, "link", "set", dev, "up")
            self.pods.append(Pod(self.topo.pod(f"r{p}"), f"c{p}"))

    def master(self, pod: int, rail: int) -> str:
        return f"{self.topo.tag}m{pod}{rail}"

    def conf(self, pod: int, index: int, **extra: Any) -> dict[str, Any]:
        return {"cniVersion": VERSION, "name": "rails", "type": "macvlan", "master": self.master(pod, index),
                "dad": "off", **extra,
                "ipam": {"type": "host-local", "dataDir": str(self.state / "host-local"),
                         "ranges": [[r] for r in self.subnets(index)]}}

    def add_all(self, **extra: Any) -> None:
        for p, pod in enumerate(self.pods):
            for rail in range(RAILS):
                out = self.call("ADD", p, rail, extra)
                pod.addrs[rail] = [ip["address"].split("/")[0] for ip in out["ips"]]

    def delete_all(self, **extra: Any) -> None:
        for p in range(len(self.pods)):
            for rail in range(RAILS):
                self.call("DEL", p, rail, extra)

    def call(self, command: str, p: int, rail: int, extra: dict[str, Any]) -> Any:
        """One plugin call for pod `p`'s interface on `rail` (pycni's macvlan, run as a runtime would;
        tests/e2e/test_rail_reference.py runs conflists through libcni instead)."""
        pod = self.pods[p]
        call = self.topo.run("macvlan", command, self.conf(p, rail, **extra), netns=pod.path,
                             ifname=f"net{rail + 1}", container_id=pod.cid)
        assert call.ok, call.stderr + str(call.out)
        return call.out


def counters(ns: str) -> dict[str, tuple[int, int]]:
    """ifname -> (tx packets, rx packets) of the rail interfaces in `ns`."""
    out = jsonio.loads(sh("ip", "-j", "-s", "-n", ns, "link", "show").stdout)
    return {d["ifname"]: (d["stats64"]["tx"]["packets"], d["stats64"]["rx"]["packets"])
            for d in out if d["ifname"].startswith("net")}


def ping(ns: str, src: str, dst: str, *extra: str) -> bool:
    cmd = ["ip", "netns", "exec", ns, "ping", "-q", "-c", str(COUNT), "-i", "0.01", "-W", "2",
           "-I", src, *extra, dst]
    return sh(*cmd, check=False).returncode == 0


Flows = dict[tuple[int, int], tuple[bool, dict[str, int]]]


def flows(rails: Rails, family: int, *, cross: bool = False) -> Flows:
    """Ping pod 1 from pod 0 from each rail's address of `family` (to the same rail, or with `cross`
    to the next rail's address); (from, to) -> (success, packets each interface of pod 0 sent)."""
    a, b = rails.pods
    out: Flows = {}
    for rail in range(RAILS):
        to = (rail + 1) % RAILS if cross else rail
        src = next(x for x in a.addrs[rail] if ipaddress.ip_address(x).version == family)
        dst = next(x for x in b.addrs[to] if ipaddress.ip_address(x).version == family)
        before = counters(a.ns)
        ok = ping(a.ns, src, dst)
        after = counters(a.ns)
        out[(rail, to)] = (ok, {n: after[n][0] - before[n][0] for n in after})
    return out


def mac_of(ns: str, ifname: str) -> str:
    return str(jsonio.loads(sh("ip", "-j", "-n", ns, "link", "show", "dev", ifname).stdout)[0]["address"])


def neighbours(ns: str, address: str) -> set[str]:
    """The link-layer addresses `ns` resolved `address` to (any interface)."""
    out = jsonio.loads(sh("ip", "-j", "-n", ns, "neigh", "show", "to", address).stdout)
    return {n["lladdr"] for n in out if "lladdr" in n}
