"""Who announces the addresses of an ADD: cni.ifconfig on a veth end in a test namespace,
frames captured on its peer. A link that was down before (every link a plugin creates or moves) is
announced by the kernel at link-up (arp_notify/ndisc_notify); a link that was already up by our own
packet socket. Either way, each address exactly once."""

from __future__ import annotations

import pytest

from cni import ifconfig, netns
from cni.netlink import links
from cni.netlink.socket import opened
from cni.types import result
from tests.integration.macvlan.capture import Capture
from tests.nsutil import Topology

V4 = ("198.18.9.10", "198.18.9.11")


@pytest.mark.parametrize("was_up", [False, True], ids=["link-down", "link-up"])
def test_every_ipv4_address_announced_once(topo: Topology, was_up: bool) -> None:
    topo.ip(topo.host, "link", "set", topo.uplink, "up" if was_up else "down")
    res = result.parse({"cniVersion": "1.0.0", "ips": [{"address": f"{a}/24"} for a in V4]}, "1.0.0")
    capture = Capture(topo.host, topo.peer)
    try:
        with netns.opened(f"/run/netns/{topo.host}") as fd:
            with netns.entered(fd), opened(None) as nl:
                link = links.get(nl, topo.uplink)
                assert link is not None and link.up == was_up
            ifconfig.configure(fd, link.index, res)
        capture.collect(0.5)
        seen = capture.announcements(link.mac)
    finally:
        capture.close()
    assert {a: n for a, n in seen.items() if not a.startswith("fe80:")} == dict.fromkeys(V4, 1)
    arp_notify = f"/proc/sys/net/ipv4/conf/{topo.uplink}/arp_notify"  # later MAC changes too
    with netns.opened(f"/run/netns/{topo.host}") as fd, netns.entered(fd), open(arp_notify) as fh:
        assert fh.read().strip() == "1"
