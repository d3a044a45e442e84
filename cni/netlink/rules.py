"""Policy routing rules (`ip rule`): add, delete, list; only what source routing needs: a rule
`from <address> lookup <table>` at a priority."""

from __future__ import annotations

import ipaddress
import socket
import struct

from cni.netlink import nla
from cni.netlink.socket import NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, Netlink
from cni.types.valueclass import valueclass

RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE = 32, 33, 34
FR_ACT_TO_TBL = 1
# fib_rule_hdr: family, dst_len, src_len, tos, table, res1, res2, action, flags
FIB_RULE_HDR = struct.Struct("=BBBBBBBBI")
FRA_DST, FRA_SRC, FRA_PRIORITY, FRA_TABLE = 1, 2, 6, 15


@valueclass
class Rule:
    src: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    table: int
    priority: int
    action: int
    selectors: bool  # matches on more than the source (destination, tos, marks, interfaces...)


def _family(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> int:
    return socket.AF_INET if net.version == 4 else socket.AF_INET6


def _message(src: ipaddress.IPv4Network | ipaddress.IPv6Network, table: int, priority: int) -> nla.Message:
    header = FIB_RULE_HDR.pack(_family(src), 0, src.prefixlen, 0, table if table < 256 else 0, 0, 0,
                               FR_ACT_TO_TBL, 0)
    attrs = [nla.ip(FRA_SRC, str(src.network_address)), nla.u32(FRA_PRIORITY, priority),
             nla.u32(FRA_TABLE, table)]
    return nla.Message(header, b"".join(attrs), _decode)


def add(nl: Netlink, src: ipaddress.IPv4Network | ipaddress.IPv6Network, table: int, priority: int) -> None:
    """`ip rule add from <src> lookup <table> priority <priority>`; EEXIST when it exists already."""
    nl.request(_message(src, table, priority), RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL,
               f"add rule from {src} lookup {table}")


def delete(nl: Netlink, src: ipaddress.IPv4Network | ipaddress.IPv6Network, table: int,
           priority: int) -> None:
    """The rule with exactly these source, table and priority; ENOENT when there is none."""
    nl.request(_message(src, table, priority), RTM_DELRULE, 0, f"delete rule from {src} lookup {table}")


def _decode(chunk: bytes) -> Rule | None:
    """An RTM_NEWRULE message (nlmsghdr included) as a Rule; None for other families."""
    family, dst_len, src_len, tos, table, _r1, _r2, action, _flags = FIB_RULE_HDR.unpack_from(
        chunk, nla.NLMSGHDR.size)
    if family not in (socket.AF_INET, socket.AF_INET6):
        return None
    a = nla.parse(chunk, nla.NLMSGHDR.size + FIB_RULE_HDR.size)
    raw = nla.address(a.get(FRA_SRC))
    src = ipaddress.ip_network(f"{raw}/{src_len}", strict=False) if raw else None
    known = {FRA_SRC, FRA_PRIORITY, FRA_TABLE}
    # the kernel reports a few attributes on every rule: FRA_PROTOCOL (21), FRA_SUPPRESS_PREFIXLEN (14)
    extra = {k for k in a if k not in known and k not in (14, 21)}
    return Rule(src, nla.uint(a.get(FRA_TABLE)) or table, nla.uint(a.get(FRA_PRIORITY)) or 0, action,
                bool(dst_len or tos or extra))


def dump(nl: Netlink, family: int) -> list[Rule]:
    msg = nla.Message(FIB_RULE_HDR.pack(family, 0, 0, 0, 0, 0, 0, 0, 0), b"", _decode)
    return [r for r in nl.request(msg, RTM_GETRULE, NLM_F_DUMP, "list rules") if r is not None]
