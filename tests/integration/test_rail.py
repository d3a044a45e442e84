"""Multi-rail pods on the real kernel (issue 35): two pods, each with four macvlans over four masters
(a veth per pod and rail, whose other end is in a bridge per rail). With `rail`, traffic from each
source address leaves and arrives on its own interface (the interfaces' counters say so), an address is
resolved (ARP/ND) only through the interface that holds it, and pings over every rail succeed; without
it, the same topology sends everything through the first rail (the failure the option fixes).
Addresses come from Debian's host-local; (a) all rails in one subnet, (b) one subnet per rail, each with
a gateway (an address of the rail's bridge; the host namespace forwards between the rails)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from tests.nsutil import Topology, sh
from tests.railab import COUNT, RAILS, Rails, flows, mac_of, neighbours, one_subnet, per_rail, ping

pytestmark = pytest.mark.root


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
