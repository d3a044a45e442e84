"""Multi-rail pods on the real kernel (issue 35): two pods, each with four macvlans over four masters
(a veth per pod and rail, whose other end is in a bridge per rail). With `rail`, traffic from each
source address leaves and arrives on its own interface (the interfaces' counters say so), an address is
resolved (ARP/ND) only through the interface that holds it, and pings over every rail succeed; without
it, the same topology sends everything through the first rail (the failure the option fixes).
Addresses come from Debian's host-local; (a) all rails in one subnet, (b) one subnet per rail, each with
a gateway (an address of the rail's bridge; the host namespace forwards between the rails)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from tests.nsutil import Topology, sh

pytestmark = pytest.mark.root
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
                call = self.topo.run("macvlan", "ADD", self.conf(p, rail, **extra), netns=pod.path,
                                     ifname=f"net{rail + 1}", container_id=pod.cid)
                assert call.ok, call.stderr + str(call.out)
                pod.addrs[rail] = [ip["address"].split("/")[0] for ip in call.out["ips"]]

    def delete_all(self, **extra: Any) -> None:
        for p, pod in enumerate(self.pods):
            for rail in range(RAILS):
                call = self.topo.run("macvlan", "DEL", self.conf(p, rail, **extra), netns=pod.path,
                                     ifname=f"net{rail + 1}", container_id=pod.cid)
                assert call.ok, call.stderr


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


@pytest.fixture(params=[("one-subnet", one_subnet), ("subnet-per-rail", per_rail)], ids=lambda p: p[0])
def rails(request: pytest.FixtureRequest, topo: Topology, tmp_path: Path) -> Rails:
    return Rails(topo, tmp_path, request.param[1])


@pytest.mark.parametrize("family", [4, 6])
def test_rails_keep_their_traffic(rails: Rails, family: int) -> None:
    rails.add_all(rail=True)
    for (src, dst), (ok, sent) in flows(rails, family).items():
        assert ok, f"ping from rail {src} to rail {dst} failed"
        me = f"net{src + 1}"
        assert sent[me] >= COUNT, (me, sent)
        assert all(n < COUNT for name, n in sent.items() if name != me), (me, sent)
    a, b = rails.pods
    for rail in range(RAILS):  # resolved only through the interface that holds the address
        for addr in b.addrs[rail]:
            if ipaddress.ip_address(addr).version == family:
                assert neighbours(a.ns, addr) <= {mac_of(b.ns, f"net{rail + 1}")}, addr
    rails.delete_all(rail=True)
    for pod in rails.pods:
        assert sh("ip", "-n", pod.ns, "rule", "show", "priority", "1000").stdout == ""
        assert sh("ip", "-n", pod.ns, "-6", "rule", "show", "priority", "1000").stdout == ""


def test_without_rail_everything_leaves_on_the_first_rail(topo: Topology, tmp_path: Path) -> None:
    rails = Rails(topo, tmp_path, one_subnet)
    rails.add_all()
    results = flows(rails, 4)
    _ok, sent = results[(3, 3)]
    assert sent["net1"] >= COUNT and sent["net4"] < COUNT, sent
    a, b = rails.pods
    # every interface of the peer answered for every address: the first rail's MAC wins
    assert neighbours(a.ns, b.addrs[3][0]) == {mac_of(b.ns, "net1")}
    rails.delete_all()


def test_arp_is_answered_only_by_the_holder(topo: Topology, tmp_path: Path) -> None:
    """From the first rail's interface, the peer's fourth-rail address does not resolve with `rail`
    (the peer's first-rail interface does not answer for it); without `rail` it does."""
    rails = Rails(topo, tmp_path, one_subnet)
    rails.add_all(rail=True)
    a, b = rails.pods
    assert not ping(a.ns, "net1", b.addrs[3][0], "-c", "1")
    assert ping(a.ns, "net4", b.addrs[3][0])
    rails.delete_all(rail=True)
    rails.add_all()
    assert ping(a.ns, "net1", b.addrs[3][0])
    rails.delete_all()


def test_cross_rail_through_the_gateways(topo: Topology, tmp_path: Path) -> None:
    """(b) with gateways: from rail r's address to the peer's rail r+1 address goes out on rail r via
    its gateway (the rail's table), and the reply comes back the same way on the peer's side."""
    rails = Rails(topo, tmp_path, per_rail)
    rails.add_all(rail=True)
    for family in (4, 6):
        for (src, _dst), (ok, sent) in flows(rails, family, cross=True).items():
            assert ok, (family, src)
            assert sent[f"net{src + 1}"] >= COUNT, sent
    rails.delete_all(rail=True)
    rails.add_all()
    for (src, dst), (_ok, sent) in flows(rails, 4, cross=True).items():
        # without rail tables the connected route of the destination's subnet wins: out on its rail
        assert sent[f"net{src + 1}"] < COUNT <= sent[f"net{dst + 1}"], (src, sent)
    rails.delete_all()
