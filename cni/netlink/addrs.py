"""Addresses on a link: add, list (with DAD state)."""

from __future__ import annotations

import ipaddress
import socket
import struct

from cni.netlink import nla
from cni.netlink.socket import NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, Netlink
from cni.types.valueclass import valueclass

RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
IFA_F_NODAD, IFA_F_OPTIMISTIC, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x04, 0x08, 0x40
IFA_F_PERMANENT = 0x80


@valueclass
class Addr:
    address: ipaddress.IPv4Interface | ipaddress.IPv6Interface
    index: int
    flags: int
    scope: int

    @property
    def tentative(self) -> bool:
        return bool(self.flags & IFA_F_TENTATIVE) and not self.flags & IFA_F_OPTIMISTIC

    @property
    def dad_failed(self) -> bool:
        return bool(self.flags & IFA_F_DADFAILED)


def _family(addr: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> int:
    return socket.AF_INET if addr.version == 4 else socket.AF_INET6


IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 4, 8


def add(
    nl: Netlink, index: int, addr: ipaddress.IPv4Interface | ipaddress.IPv6Interface, flags: int = 0
) -> None:
    header = IFADDRMSG.pack(_family(addr), addr.network.prefixlen, 0, 0, index)
    attrs = [nla.ip(IFA_LOCAL, str(addr.ip)), nla.ip(IFA_ADDRESS, str(addr.ip))]
    if addr.version == 4 and addr.network.prefixlen < 31:
        attrs.append(nla.ip(IFA_BROADCAST, str(addr.network.broadcast_address)))
    if flags:
        attrs.append(nla.u32(IFA_FLAGS, flags))
    msg = nla.Message(header, b"".join(attrs), _decode)
    nl.request(msg, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, f"add address {addr}")


def _decode(chunk: bytes) -> Addr | None:
    """An RTM_NEWADDR message (nlmsghdr included) as an Addr; None without an address."""
    _family, prefixlen, flags, scope, index = IFADDRMSG.unpack_from(chunk, nla.NLMSGHDR.size)
    a = nla.parse(chunk, nla.NLMSGHDR.size + IFADDRMSG.size)
    local = nla.address(a.get(IFA_LOCAL)) or nla.address(a.get(IFA_ADDRESS))
    if local is None:
        return None
    extended = nla.uint(a.get(IFA_FLAGS))
    return Addr(ipaddress.ip_interface(f"{local}/{prefixlen}"), index,
                extended if extended is not None else flags, scope)


def dump(nl: Netlink, index: int = 0, family: int = socket.AF_UNSPEC) -> list[Addr]:
    msg = nla.Message(IFADDRMSG.pack(family, 0, 0, 0, 0), b"", _decode)
    replies = nl.request(msg, RTM_GETADDR, NLM_F_DUMP, "list addresses")
    return [a for a in replies if a is not None and (not index or a.index == index)]
