"""cni.netlink.rules and routes.delete against pyroute2 (the reference codec, tests/netlinkref.py):
requests byte for byte as pyroute2 encodes the same message; replies encoded by pyroute2 decode."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest
from pyroute2.netlink.rtnl.fibmsg import fibmsg

from cni.netlink import nla, routes, rules
from tests.netlinkref import rtmsg
from tests.unit.test_netlink_nla import ours, reply, theirs


def rule_msg(src: str, table: int, priority: int) -> Any:
    net = ipaddress.ip_network(src)
    msg = fibmsg()
    msg["family"] = socket.AF_INET if net.version == 4 else socket.AF_INET6
    msg["dst_len"], msg["src_len"], msg["tos"] = 0, net.prefixlen, 0
    msg["table"] = table if table < 256 else 0
    msg["res1"], msg["res2"], msg["action"], msg["flags"] = 0, 0, rules.FR_ACT_TO_TBL, 0
    msg["attrs"] = [("FRA_SRC", str(net.network_address)), ("FRA_PRIORITY", priority),
                    ("FRA_TABLE", table)]
    return msg


@pytest.mark.parametrize(("src", "table"), [("198.51.100.7/32", 102), ("2001:db8::7/128", 1000)])
@pytest.mark.parametrize("op", ["add", "delete"])
def test_rule_requests(src: str, table: int, op: str) -> None:
    data, msg_type = ours(getattr(rules, op), ipaddress.ip_network(src), table, 1000)
    expected = rules.RTM_NEWRULE if op == "add" else rules.RTM_DELRULE
    assert msg_type == expected
    assert data == theirs(rule_msg(src, table, 1000), expected)


def test_decode_rules() -> None:
    chunk = reply(rule_msg("198.51.100.7/32", 1000, 900), rules.RTM_NEWRULE)
    assert rules._decode(chunk) == rules.Rule(ipaddress.ip_network("198.51.100.7/32"), 1000, 900, 1, False)
    main = fibmsg()
    main["family"], main["table"], main["action"] = socket.AF_INET6, 254, 1
    main["attrs"] = [("FRA_PRIORITY", 32766), ("FRA_TABLE", 254), ("FRA_SUPPRESS_PREFIXLEN", 0xFFFFFFFF),
                     ("FRA_PROTOCOL", 2)]
    assert rules._decode(reply(main, rules.RTM_NEWRULE)) == rules.Rule(None, 254, 32766, 1, False)
    main["attrs"] = [("FRA_PRIORITY", 5), ("FRA_TABLE", 7), ("FRA_IIFNAME", "net1")]
    assert rules._decode(reply(main, rules.RTM_NEWRULE)) == rules.Rule(None, 7, 5, 1, True)
    other = rules.FIB_RULE_HDR.pack(socket.AF_BRIDGE, 0, 0, 0, 0, 0, 0, 1, 0)
    assert rules._decode(nla.Message(other, b"", bytes).encode(rules.RTM_NEWRULE, 0, 1)) is None


@pytest.mark.parametrize(("dst", "gw", "table"), [
    ("198.51.100.0/24", None, 102), ("0.0.0.0/0", "198.51.100.1", 1000), ("2001:db8::/64", None, 77)])
def test_delete_route(dst: str, gw: str | None, table: int) -> None:
    net = ipaddress.ip_network(dst)
    data, msg_type = ours(routes.delete, net, ipaddress.ip_address(gw) if gw else None, 8, table)
    assert msg_type == routes.RTM_DELROUTE
    msg = rtmsg()
    msg["family"] = socket.AF_INET if net.version == 4 else socket.AF_INET6
    msg["dst_len"], msg["table"], msg["scope"] = net.prefixlen, table if table < 256 else 0, 255
    msg["proto"], msg["type"] = 0, 0
    attrs: list[tuple[str, Any]] = [("RTA_DST", str(net.network_address)), ("RTA_OIF", 8)]
    if gw:
        attrs.append(("RTA_GATEWAY", gw))
    msg["attrs"] = [*attrs, ("RTA_TABLE", table)]
    assert data == theirs(msg, routes.RTM_DELROUTE)
