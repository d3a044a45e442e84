"""Addresses on a link: add, list (with DAD state)."""

from __future__ import annotations

import ipaddress
import socket

from cni.netlink.socket import NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, Netlink
from cni.types.record import record

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs every call ~4 ms
if TYPE_CHECKING:
    from typing import Any

RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
IFA_F_NODAD, IFA_F_OPTIMISTIC, IFA_F_DADFAILED, IFA_F_TENTATIVE = 0x02, 0x04, 0x08, 0x40
IFA_F_PERMANENT = 0x80


@record
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


def add(
    nl: Netlink, index: int, addr: ipaddress.IPv4Interface | ipaddress.IPv6Interface, flags: int = 0
) -> None:
    from cni.netlink.codec import ifaddrmsg  # pyroute2: only when a message is built

    msg = ifaddrmsg()
    msg["family"] = _family(addr)
    msg["prefixlen"] = addr.network.prefixlen
    msg["index"] = index
    attrs: list[tuple[str, Any]] = [("IFA_LOCAL", str(addr.ip)), ("IFA_ADDRESS", str(addr.ip))]
    if addr.version == 4 and addr.network.prefixlen < 31:
        attrs.append(("IFA_BROADCAST", str(addr.network.broadcast_address)))
    if flags:
        attrs.append(("IFA_FLAGS", flags))
    msg["attrs"] = attrs
    nl.request(msg, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, f"add address {addr}")


def dump(nl: Netlink, index: int = 0, family: int = socket.AF_UNSPEC) -> list[Addr]:
    from cni.netlink.codec import ifaddrmsg  # pyroute2: only when a message is built

    msg = ifaddrmsg()
    msg["family"] = family
    out = []
    for m in nl.request(msg, RTM_GETADDR, NLM_F_DUMP, "list addresses"):
        if index and m["index"] != index:
            continue
        local = m.get_attr("IFA_LOCAL") or m.get_attr("IFA_ADDRESS")
        flags = m.get_attr("IFA_FLAGS")
        out.append(
            Addr(
                ipaddress.ip_interface(f"{local}/{m['prefixlen']}"),
                m["index"],
                flags if flags is not None else m["flags"],
                m["scope"],
            )
        )
    return out
