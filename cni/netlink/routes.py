"""Routes: add (ECMP append like the reference), list, find the default route's interface."""

from __future__ import annotations

import ipaddress
import socket

from cni.netlink.socket import NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, Netlink
from cni.types.record import record

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs every call ~4 ms
if TYPE_CHECKING:
    from typing import Any

RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1


@record
class KRoute:
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    oif: int
    table: int
    priority: int
    scope: int


def add(
    nl: Netlink,
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network,
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
    oif: int,
    *,
    priority: int = 0,
    table: int | None = None,
    scope: int | None = None,
    mtu: int = 0,
    advmss: int = 0,
) -> None:
    from cni.netlink.codec import rtmsg  # pyroute2: only when a message is built

    msg = rtmsg()
    msg["family"] = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    msg["dst_len"] = dst.prefixlen
    msg["table"] = table if table is not None and table < 256 else RT_TABLE_MAIN
    msg["proto"] = RTPROT_BOOT
    msg["scope"] = scope or 0
    msg["type"] = RTN_UNICAST
    attrs: list[tuple[str, Any]] = [("RTA_DST", str(dst.network_address)), ("RTA_OIF", oif)]
    if gw is not None:
        attrs.append(("RTA_GATEWAY", str(gw)))
    if priority:
        attrs.append(("RTA_PRIORITY", priority))
    if table is not None:
        attrs.append(("RTA_TABLE", table))
    metrics = [(k, v) for k, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v]
    if metrics:
        attrs.append(("RTA_METRICS", {"attrs": metrics}))
    msg["attrs"] = attrs
    nl.request(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_APPEND, f"add route {dst} via {gw or 'link'}")


def dump(nl: Netlink, family: int = socket.AF_UNSPEC) -> list[KRoute]:
    from cni.netlink.codec import rtmsg  # pyroute2: only when a message is built

    msg = rtmsg()
    msg["family"] = family
    out = []
    for m in nl.request(msg, RTM_GETROUTE, NLM_F_DUMP, "list routes"):
        fam = m["family"]
        if fam not in (socket.AF_INET, socket.AF_INET6):
            continue
        zero = "0.0.0.0" if fam == socket.AF_INET else "::"
        dst = ipaddress.ip_network(f"{m.get_attr('RTA_DST') or zero}/{m['dst_len']}", strict=False)
        gw = m.get_attr("RTA_GATEWAY")
        out.append(
            KRoute(
                dst,
                ipaddress.ip_address(gw) if gw else None,
                m.get_attr("RTA_OIF") or 0,
                m.get_attr("RTA_TABLE") or m["table"],
                m.get_attr("RTA_PRIORITY") or 0,
                m["scope"],
            )
        )
    return out


def default_route_oif(nl: Netlink) -> int:
    """The interface of the first default route (IPv4 first, then IPv6); 0 if there is none."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in dump(nl, family):
            if r.dst.prefixlen == 0 and r.oif and r.table == RT_TABLE_MAIN:
                return r.oif
    return 0
