"""Neighbour announcements sent after an ADD through libcni, captured on the far end of the
uplink. Both plugins set arp_notify before the link goes up, and the kernel then sends a gratuitous ARP
for every IPv4 address on it. For IPv6, Debian's 1.1.1 announces nothing (no ndisc_notify; upstream
added it in plugins#974); pycni sets ndisc_notify, so the kernel sends an unsolicited NA for every IPv6
address as soon as DAD is over (about a second after the ADD; sending one for a tentative address
would break RFC 4862), which is why the capture window is 3 s."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from typing import Any

import pytest

from cni import netns
from tests.e2e.harness import E2E

ETH_P_ALL, ETH_P_ARP, ETH_P_IPV6 = 0x0003, 0x0806, 0x86DD
V4 = ("198.18.7.10", "198.18.7.11")
V6 = "2001:db8:7::10"


def open_capture(host: str, ifname: str) -> socket.socket:
    """A packet socket on `ifname` in namespace `host` (it stays in the namespace it was made in)."""
    fd = os.open(f"/run/netns/{host}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        with netns.entered(fd):
            sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
            sock.bind((ifname, 0))
    finally:
        os.close(fd)
    sock.settimeout(0.2)
    return sock


def announced(sock: socket.socket, window: float = 3.0) -> set[str]:
    """Addresses seen in gratuitous ARPs (sender IP == target IP) and unsolicited NAs (to ff02::1),
    from frames queued during the ADD plus `window` seconds after it."""
    seen: set[str] = set()
    all_nodes = ipaddress.IPv6Address("ff02::1").packed
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        try:
            frame = sock.recv(2048)
        except TimeoutError:
            continue
        kind = int.from_bytes(frame[12:14], "big")
        if kind == ETH_P_ARP and frame[28:32] == frame[38:42]:
            seen.add(str(ipaddress.IPv4Address(frame[28:32])))
        elif kind == ETH_P_IPV6 and frame[20] == 58 and frame[54] == 136 and frame[38:54] == all_nodes:
            seen.add(str(ipaddress.IPv6Address(frame[62:78])))
    return seen


def conflist(version: str, master: str) -> dict[str, Any]:
    addresses = [{"address": f"{ip}/24"} for ip in V4] + [{"address": f"{V6}/64"}]
    return {"cniVersion": version, "name": "announce", "plugins": [
        {"type": "macvlan", "master": master, "ipam": {"type": "static", "addresses": addresses}}]}


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0"])
def test_every_address_is_announced(e2e: E2E, version: str) -> None:
    seen = {}
    for side in e2e.sides:
        run = e2e.session(side, lambda _d: conflist(version, e2e.topo.uplink))
        with open_capture(e2e.topo.host, e2e.topo.peer) as sock:
            assert run.call("add").ok
            seen[side.label] = announced(sock)
        assert run.call("del").ok
    assert seen["reference"] >= set(V4), seen
    assert seen["pycni"] >= {*V4, V6}, seen
