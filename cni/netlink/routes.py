"""Routes: add (ECMP append like the reference), delete, list, find the default route's interface."""

from __future__ import annotations

import ipaddress
import socket
import struct

from cni.netlink import nla
from cni.netlink.socket import NLM_F_APPEND, NLM_F_CREATE, NLM_F_DUMP, Netlink
from cni.types.valueclass import valueclass

RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK, RT_SCOPE_NOWHERE = 0, 253, 255


@valueclass
class KRoute:
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None
    oif: int
    table: int
    priority: int
    scope: int


RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_TABLE = 1, 4, 5, 6, 8, 15
RTAX_MTU, RTAX_ADVMSS = 2, 8


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
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    main = table if table is not None and table < 256 else RT_TABLE_MAIN
    header = RTMSG.pack(family, dst.prefixlen, 0, 0, main, RTPROT_BOOT, scope or 0, RTN_UNICAST, 0)
    attrs = [nla.ip(RTA_DST, str(dst.network_address)), nla.u32(RTA_OIF, oif)]
    if gw is not None:
        attrs.append(nla.ip(RTA_GATEWAY, str(gw)))
    if priority:
        attrs.append(nla.u32(RTA_PRIORITY, priority))
    if table is not None:
        attrs.append(nla.u32(RTA_TABLE, table))
    metrics = [nla.u32(k, v) for k, v in ((RTAX_MTU, mtu), (RTAX_ADVMSS, advmss)) if v]
    if metrics:
        attrs.append(nla.nested(RTA_METRICS, *metrics))
    msg = nla.Message(header, b"".join(attrs), _decode)
    nl.request(msg, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_APPEND, f"add route {dst} via {gw or 'link'}")


def delete(
    nl: Netlink,
    dst: ipaddress.IPv4Network | ipaddress.IPv6Network,
    gw: ipaddress.IPv4Address | ipaddress.IPv6Address | None,
    oif: int,
    table: int,
) -> None:
    """The route to `dst` via `gw` on `oif` in `table`, whatever its scope and protocol (as `ip route
    del`); ESRCH when there is none."""
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    header = RTMSG.pack(family, dst.prefixlen, 0, 0, table if table < 256 else 0, 0, RT_SCOPE_NOWHERE, 0, 0)
    attrs = [nla.ip(RTA_DST, str(dst.network_address)), nla.u32(RTA_OIF, oif)]
    if gw is not None:
        attrs.append(nla.ip(RTA_GATEWAY, str(gw)))
    attrs.append(nla.u32(RTA_TABLE, table))
    msg = nla.Message(header, b"".join(attrs), _decode)
    nl.request(msg, RTM_DELROUTE, 0, f"delete route {dst} via {gw or 'link'} table {table}")


def _decode(chunk: bytes) -> KRoute | None:
    """An RTM_NEWROUTE message (nlmsghdr included) as a KRoute; None for other families."""
    family, dst_len, _src, _tos, table, _proto, scope, _type, _flags = RTMSG.unpack_from(
        chunk, nla.NLMSGHDR.size)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    a = nla.parse(chunk, nla.NLMSGHDR.size + RTMSG.size)
    zero = "0.0.0.0" if family == socket.AF_INET else "::"
    dst = ipaddress.ip_network(f"{nla.address(a.get(RTA_DST)) or zero}/{dst_len}", strict=False)
    gw = nla.address(a.get(RTA_GATEWAY))
    return KRoute(
        dst,
        ipaddress.ip_address(gw) if gw else None,
        nla.uint(a.get(RTA_OIF)) or 0,
        nla.uint(a.get(RTA_TABLE)) or table,
        nla.uint(a.get(RTA_PRIORITY)) or 0,
        scope,
    )


def dump(nl: Netlink, family: int = socket.AF_UNSPEC) -> list[KRoute]:
    msg = nla.Message(RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0), b"", _decode)
    return [r for r in nl.request(msg, RTM_GETROUTE, NLM_F_DUMP, "list routes") if r is not None]


def default_route_oif(nl: Netlink) -> int:
    """The interface of the first default route (IPv4 first, then IPv6); 0 if there is none."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in dump(nl, family):
            if r.dst.prefixlen == 0 and r.oif and r.table == RT_TABLE_MAIN:
                return r.oif
    return 0
