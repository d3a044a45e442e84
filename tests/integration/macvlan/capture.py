"""Capture what a pod announces: an AF_PACKET socket opened inside the test's host namespace on the
uplink's veth peer, so it sees every frame the macvlan sends out through the uplink."""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import time
from collections import Counter

from cni import netns

ETH_P_ALL, ETH_P_ARP, ETH_P_IPV6 = 0x0003, 0x0806, 0x86DD
ARP_REQUEST, ARP_REPLY = 1, 2
IPPROTO_ICMPV6, NEIGHBOR_ADVERT = 58, 136


class Capture:
    def __init__(self, host_ns: str, ifname: str) -> None:
        fd = netns.open_netns(f"/run/netns/{host_ns}")
        try:
            with netns.entered(fd):
                self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        finally:
            os.close(fd)
        self.sock.bind((ifname, 0))
        self.frames: list[bytes] = []

    def close(self) -> None:
        self.sock.close()

    def collect(self, seconds: float) -> None:
        """Read frames for `seconds` (what was queued since the socket opened, and what follows)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                self.frames.append(self.sock.recv(65535))

    def announcements(self, mac: str) -> Counter[str]:
        """address -> number of gratuitous ARPs / unsolicited NAs sent from `mac` for it."""
        src = bytes(int(x, 16) for x in mac.split(":"))
        seen: Counter[str] = Counter()
        for frame in self.frames:
            if frame[6:12] != src:
                continue
            ethertype = struct.unpack_from("!H", frame, 12)[0]
            address = _garp(frame) if ethertype == ETH_P_ARP else _unsolicited_na(frame)
            if address is not None:
                seen[address] += 1
        return seen


def _garp(frame: bytes) -> str | None:
    """Sender IP of a gratuitous ARP (request or reply with sender IP == target IP)."""
    op = struct.unpack_from("!H", frame, 20)[0]
    sender, target = frame[28:32], frame[38:42]
    if op in (ARP_REQUEST, ARP_REPLY) and sender == target:
        return str(ipaddress.IPv4Address(sender))
    return None


def _unsolicited_na(frame: bytes) -> str | None:
    """Target of an unsolicited NA (to all nodes, solicited flag clear)."""
    if struct.unpack_from("!H", frame, 12)[0] != ETH_P_IPV6 or frame[20] != IPPROTO_ICMPV6:
        return None
    icmp = frame[54:]
    dst = ipaddress.IPv6Address(frame[38:54])
    if icmp[0] != NEIGHBOR_ADVERT or dst != ipaddress.IPv6Address("ff02::1") or icmp[4] & 0x40:
        return None
    return str(ipaddress.IPv6Address(icmp[8:24]))
