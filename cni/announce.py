"""Gratuitous ARP and unsolicited IPv6 neighbour advertisements, sent through an AF_PACKET socket.

cni.ifconfig decides which addresses are ours to announce and which the kernel announces (with
arp_notify/ndisc_notify), so that each address is announced once. Never send an NA for a tentative
address. Open the socket while entered in the link's namespace."""

from __future__ import annotations

import ipaddress
import socket
import struct

from cni import log

ETH_P_ARP, ETH_P_IPV6 = 0x0806, 0x86DD
BROADCAST = b"\xff" * 6
ALL_NODES_MAC = b"\x33\x33\x00\x00\x00\x01"
ALL_NODES = ipaddress.IPv6Address("ff02::1")


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(x, 16) for x in mac.split(":"))


def garp_frame(mac: str, ip: ipaddress.IPv4Address) -> bytes:
    """An ARP request with sender = target = ip, to broadcast (what arping -U sends)."""
    src = _mac_bytes(mac)
    eth = BROADCAST + src + struct.pack("!H", ETH_P_ARP)
    arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, 1) + src + ip.packed + b"\x00" * 6 + ip.packed
    return eth + arp


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def una_frame(mac: str, ip: ipaddress.IPv6Address) -> bytes:
    """An unsolicited NA (override flag, target link-layer option) to ff02::1, hop limit 255."""
    src = _mac_bytes(mac)
    body = struct.pack("!BBHI", 136, 0, 0, 0x20000000) + ip.packed + struct.pack("!BB", 2, 1) + src
    pseudo = ip.packed + ALL_NODES.packed + struct.pack("!I3xB", len(body), 58)
    body = body[:2] + struct.pack("!H", _checksum(pseudo + body)) + body[4:]
    ip6 = struct.pack("!IHBB", 0x60000000, len(body), 58, 255) + ip.packed + ALL_NODES.packed
    return ALL_NODES_MAC + src + struct.pack("!H", ETH_P_IPV6) + ip6 + body


def announce(ifname: str, mac: str, ips: list[ipaddress.IPv4Address | ipaddress.IPv6Address]) -> int:
    """Send one announcement per address; returns how many were sent. Failures are logged only:
    announcing is an optimisation, never a reason to fail an ADD."""
    sent = 0
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC)
    except OSError as e:
        log.warning("announce on %s: %s", ifname, e.strerror)
        return 0
    with sock:
        try:
            sock.bind((ifname, 0))
        except OSError as e:
            log.warning("announce on %s: bind: %s", ifname, e.strerror)
            return 0
        for ip in ips:
            frame = garp_frame(mac, ip) if ip.version == 4 else una_frame(mac, ip)
            try:
                sock.send(frame)
                sent += 1
            except OSError as e:
                log.warning("announce %s on %s: %s", ip, ifname, e.strerror)
    return sent
