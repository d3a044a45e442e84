"""cni.netlink.nla against pyroute2 (a test dependency, the reference here: tests/netlinkref.py): every
request links/addrs/routes build is byte for byte what the same message encoded by pyroute2 is, and
replies encoded by pyroute2 decode to the same records as pyroute2's own decoding gives."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from cni.netlink import addrs, links, nla, routes
from tests.netlinkref import encode, ifaddrmsg, ifinfmsg, rtmsg

SEQ, FLAGS = 7, 0x405


class Recorder:
    """Stands in for cni.netlink.socket.Netlink: keeps what would be sent, answers nothing."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, int]] = []

    def request(self, msg: nla.Message, msg_type: int, flags: int, op: str) -> list[Any]:
        self.sent.append((msg.encode(msg_type, FLAGS, SEQ), msg_type))
        return []


def ours(fn: Any, *args: Any, **kw: Any) -> tuple[bytes, int]:
    rec = Recorder()
    fn(rec, *args, **kw)
    (sent,) = rec.sent
    return sent


def theirs(msg: Any, msg_type: int) -> bytes:
    return encode(msg, msg_type, FLAGS, SEQ)


def link_msg(index: int = 0, attrs: list[tuple[str, Any]] | None = None, flags: int = 0,
             change: int = 0) -> Any:
    msg = ifinfmsg()
    msg["family"], msg["index"], msg["flags"], msg["change"] = 0, index, flags, change
    msg["attrs"] = attrs or []
    return msg


@pytest.mark.parametrize("kw", [
    {},
    {"mtu": 9000, "mac": "02:11:22:33:44:55", "bcqueuelen": 500, "netns_fd": 9},
], ids=["plain", "every-option"])
def test_create_macvlan(kw: dict[str, Any]) -> None:
    data, got_type = ours(links.create_macvlan, "pt0net1", 4, "bridge", **kw)
    info: list[tuple[str, Any]] = [("IFLA_MACVLAN_MODE", 4)]
    if kw.get("bcqueuelen"):
        info.append(("IFLA_MACVLAN_BC_QUEUE_LEN", kw["bcqueuelen"]))
    attrs: list[tuple[str, Any]] = [
        ("IFLA_IFNAME", "pt0net1"), ("IFLA_LINK", 4),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "macvlan"), ("IFLA_INFO_DATA", {"attrs": info})]})]
    attrs += [(name, kw[key]) for key, name in (("mtu", "IFLA_MTU"), ("mac", "IFLA_ADDRESS"),
                                                ("netns_fd", "IFLA_NET_NS_FD")) if kw.get(key)]
    assert got_type == links.RTM_NEWLINK
    assert data == theirs(link_msg(0, attrs), links.RTM_NEWLINK)


@pytest.mark.parametrize(("fn", "args", "attrs", "flags", "change"), [
    (links.set_name, ("eth7",), [("IFLA_IFNAME", "eth7")], 0, 0),
    (links.set_up, (), [], 1, 1),
    (links.set_up, (False,), [], 0, 1),
    (links.set_mtu, (1400,), [("IFLA_MTU", 1400)], 0, 0),
    (links.set_mac, ("02:aa:bb:cc:dd:ee",), [("IFLA_ADDRESS", "02:aa:bb:cc:dd:ee")], 0, 0),
    (links.set_alias, ("pycni:pod",), [("IFLA_IFALIAS", "pycni:pod")], 0, 0),
    (links.set_netns, (12,), [("IFLA_NET_NS_FD", 12)], 0, 0),
], ids=["name", "up", "down", "mtu", "mac", "alias", "netns"])
def test_set_link(fn: Any, args: tuple[Any, ...], attrs: list[tuple[str, Any]], flags: int,
                  change: int) -> None:
    data, _ = ours(fn, 5, *args)
    assert data == theirs(link_msg(5, attrs, flags, change), links.RTM_NEWLINK)


def test_get_delete_and_altnames() -> None:
    rec = Recorder()
    links.get(rec, "eth0")  # type: ignore[arg-type]
    links.get(rec, index=3)  # type: ignore[arg-type]
    links.delete(rec, 3)  # type: ignore[arg-type]
    links.add_altname(rec, 3, "pycni-alt")  # type: ignore[arg-type]
    links.delete_altname(rec, 3, "pycni-alt")  # type: ignore[arg-type]
    prop = [("IFLA_PROP_LIST", {"attrs": [("IFLA_ALT_IFNAME", "pycni-alt")]})]
    want = [
        theirs(link_msg(0, [("IFLA_IFNAME", "eth0"), ("IFLA_EXT_MASK", 1)]), links.RTM_GETLINK),
        theirs(link_msg(3, [("IFLA_EXT_MASK", 1)]), links.RTM_GETLINK),
        theirs(link_msg(3), links.RTM_DELLINK),
        theirs(link_msg(3, prop), links.RTM_NEWLINKPROP),
        theirs(link_msg(3, prop), links.RTM_DELLINKPROP),
    ]
    assert [d for d, _ in rec.sent] == want


@pytest.mark.parametrize(("address", "flags"), [
    ("198.51.100.7/24", 0), ("198.18.0.1/31", 0), ("198.18.0.9/32", 0),
    ("2001:db8::7/64", addrs.IFA_F_NODAD), ("2001:db8::8/64", addrs.IFA_F_OPTIMISTIC)])
def test_add_address(address: str, flags: int) -> None:
    iface = ipaddress.ip_interface(address)
    data, _ = ours(addrs.add, 6, iface, flags)
    msg = ifaddrmsg()
    msg["family"] = socket.AF_INET if iface.version == 4 else socket.AF_INET6
    msg["prefixlen"], msg["index"] = iface.network.prefixlen, 6
    attrs: list[tuple[str, Any]] = [("IFA_LOCAL", str(iface.ip)), ("IFA_ADDRESS", str(iface.ip))]
    if iface.version == 4 and iface.network.prefixlen < 31:
        attrs.append(("IFA_BROADCAST", str(iface.network.broadcast_address)))
    if flags:
        attrs.append(("IFA_FLAGS", flags))
    msg["attrs"] = attrs
    assert data == theirs(msg, addrs.RTM_NEWADDR)


@pytest.mark.parametrize(("dst", "gw", "kw"), [
    ("0.0.0.0/0", "198.51.100.1", {}),
    ("198.18.0.0/15", None, {"scope": 253}),
    ("2001:db8:5::/48", "2001:db8::1", {"priority": 100, "table": 100, "mtu": 9000, "advmss": 8960}),
    ("198.51.100.0/24", "198.51.100.1", {"table": 1000}),
])
def test_add_route(dst: str, gw: str | None, kw: dict[str, Any]) -> None:
    net = ipaddress.ip_network(dst)
    via = ipaddress.ip_address(gw) if gw else None
    data, _ = ours(routes.add, net, via, 8, **kw)
    msg = rtmsg()
    msg["family"] = socket.AF_INET if net.version == 4 else socket.AF_INET6
    msg["dst_len"] = net.prefixlen
    table = kw.get("table")
    msg["table"] = table if table is not None and table < 256 else routes.RT_TABLE_MAIN
    msg["proto"], msg["scope"], msg["type"] = routes.RTPROT_BOOT, kw.get("scope", 0), routes.RTN_UNICAST
    attrs: list[tuple[str, Any]] = [("RTA_DST", str(net.network_address)), ("RTA_OIF", 8)]
    if via is not None:
        attrs.append(("RTA_GATEWAY", str(via)))
    if kw.get("priority"):
        attrs.append(("RTA_PRIORITY", kw["priority"]))
    if table is not None:
        attrs.append(("RTA_TABLE", table))
    metrics = [(k, kw[n]) for k, n in (("RTAX_MTU", "mtu"), ("RTAX_ADVMSS", "advmss")) if kw.get(n)]
    if metrics:
        attrs.append(("RTA_METRICS", {"attrs": metrics}))
    msg["attrs"] = attrs
    assert data == theirs(msg, routes.RTM_NEWROUTE)


def reply(msg: Any, msg_type: int, *raw: bytes) -> bytes:
    """`msg` encoded by pyroute2, plus attributes given as raw bytes (what the kernel sends for types
    pyroute2 cannot encode from a value, such as IFLA_PERM_ADDRESS)."""
    data = theirs(msg, msg_type) + b"".join(raw)
    return nla.NLMSGHDR.pack(len(data), *nla.NLMSGHDR.unpack_from(data)[1:]) + data[nla.NLMSGHDR.size:]


def test_decode_a_link_like_pyroute2() -> None:
    attrs = [
        ("IFLA_IFNAME", "pt0mv"), ("IFLA_ADDRESS", "02:11:22:33:44:55"), ("IFLA_MTU", 9000),
        ("IFLA_OPERSTATE", "LOWERLAYERDOWN"), ("IFLA_LINK", 4), ("IFLA_LINK_NETNSID", 3),
        ("IFLA_IFALIAS", "pycni"),
        ("IFLA_PARENT_DEV_NAME", "0000:af:06.0"),
        ("IFLA_PROP_LIST", {"attrs": [("IFLA_ALT_IFNAME", "alt-one"), ("IFLA_ALT_IFNAME", "alt-two")]}),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "macvlan"), ("IFLA_INFO_DATA", {"attrs": [
            ("IFLA_MACVLAN_MODE", 2), ("IFLA_MACVLAN_BC_QUEUE_LEN", 300)]})]}),
    ]
    chunk = reply(link_msg(11, attrs, flags=1), links.RTM_NEWLINK, nla.mac(54, "02:00:00:00:00:09"))
    assert links.decode(chunk) == links.Link(
        index=11, name="pt0mv", kind="macvlan", mac="02:11:22:33:44:55", mtu=9000, up=True,
        operstate="LOWERLAYERDOWN", parent=4, link_netnsid=3, alias="pycni", macvlan_mode="vepa",
        bcqueuelen=300, altnames=("alt-one", "alt-two"), perm_mac="02:00:00:00:00:09",
        parent_dev="0000:af:06.0")
    theirs_decoded = ifinfmsg(chunk)
    theirs_decoded.decode()
    assert theirs_decoded.get_attr("IFLA_OPERSTATE") == "LOWERLAYERDOWN"
    assert theirs_decoded.get_attr("IFLA_PERM_ADDRESS") == "02:00:00:00:00:09"
    bare = links.decode(reply(link_msg(2, [("IFLA_IFNAME", "x")]), links.RTM_NEWLINK))
    assert (bare.kind, bare.mac, bare.operstate, bare.link_netnsid, bare.altnames) == ("", "", "", None, ())


def test_decode_addresses_and_routes() -> None:
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["flags"] = socket.AF_INET6, 64, 0x80
    msg["scope"], msg["index"] = 0, 6
    msg["attrs"] = [("IFA_ADDRESS", "2001:db8::7"), ("IFA_FLAGS", 0x4C0)]
    assert addrs._decode(reply(msg, addrs.RTM_NEWADDR)) == addrs.Addr(
        ipaddress.ip_interface("2001:db8::7/64"), 6, 0x4C0, 0)
    msg["family"], msg["prefixlen"] = socket.AF_INET, 24
    msg["attrs"] = [("IFA_LOCAL", "198.51.100.7"), ("IFA_ADDRESS", "198.51.100.9")]
    assert addrs._decode(reply(msg, addrs.RTM_NEWADDR)) == addrs.Addr(
        ipaddress.ip_interface("198.51.100.7/24"), 6, 0x80, 0)
    r = rtmsg()
    r["family"], r["dst_len"], r["table"], r["scope"] = socket.AF_INET, 0, 254, 0
    r["attrs"] = [("RTA_GATEWAY", "198.51.100.1"), ("RTA_OIF", 4), ("RTA_TABLE", 1000), ("RTA_PRIORITY", 5)]
    assert routes._decode(reply(r, routes.RTM_NEWROUTE)) == routes.KRoute(
        ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_address("198.51.100.1"), 4, 1000, 5, 0)
    bridge = routes.RTMSG.pack(socket.AF_BRIDGE, 0, 0, 0, 254, 0, 0, 1, 0)
    assert routes._decode(nla.Message(bridge, b"", bytes).encode(routes.RTM_NEWROUTE, 0, 1)) is None


def test_attributes_are_padded_and_truncation_is_harmless() -> None:
    assert nla.asciiz(3, "ab") == b"\x07\x00\x03\x00ab\x00\x00"
    assert nla.parse(nla.u32(4, 9) + nla.asciiz(3, "ab")) == {4: b"\t\0\0\0", 3: b"ab\0"}
    assert nla.parse(nla.u32(4, 9)[:6]) == {}  # a truncated attribute ends the list
    assert nla.parse(b"\x02\x00\x01\x00") == {}  # a length below the header ends it too
    assert nla.uint(b"\x01\x02\x03") is None and nla.address(b"\x01") is None
