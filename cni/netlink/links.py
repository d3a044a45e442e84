"""Links: look up, create (macvlan), rename, move, set up/down/MTU/MAC/alias, delete."""

from __future__ import annotations

import os
import struct

from cni.netlink import nla
from cni.netlink.socket import ENODEV, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, Netlink, NetlinkError
from cni.types.valueclass import field, valueclass

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_NEWLINKPROP, RTM_DELLINKPROP = 16, 17, 18, 108, 109
IFF_UP = 0x1
MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}
MACVLAN_MODE_NAMES = {v: k for k, v in MACVLAN_MODES.items()}


@valueclass
class Link:
    index: int
    name: str
    kind: str = ""
    mac: str = ""
    mtu: int = 0
    up: bool = False
    operstate: str = ""
    parent: int = 0  # IFLA_LINK: the master's index (in the master's namespace)
    link_netnsid: int | None = None
    alias: str = ""
    macvlan_mode: str = ""
    bcqueuelen: int = 0
    altnames: tuple[str, ...] = field(default=())
    perm_mac: str = ""
    parent_dev: str = ""  # IFLA_PARENT_DEV_NAME: the bus device ("0000:af:06.0"), any namespace


IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_OPERSTATE, IFLA_LINKINFO = 1, 3, 4, 5, 16, 18
IFLA_IFALIAS, IFLA_NET_NS_FD, IFLA_EXT_MASK, IFLA_LINK_NETNSID = 20, 28, 29, 37
IFLA_PROP_LIST, IFLA_ALT_IFNAME, IFLA_PERM_ADDRESS, IFLA_PARENT_DEV_NAME = 52, 53, 54, 56
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_MACVLAN_MODE, IFLA_MACVLAN_BC_QUEUE_LEN = 1, 7
RTEXT_FILTER_VF = 1
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")


def decode(chunk: bytes) -> Link:
    """An RTM_NEWLINK message (nlmsghdr included) as a Link."""
    _family, _type, index, flags, _change = IFINFOMSG.unpack_from(chunk, nla.NLMSGHDR.size)
    a = nla.parse(chunk, nla.NLMSGHDR.size + IFINFOMSG.size)
    info = nla.parse(a.get(IFLA_LINKINFO))
    kind = nla.text(info.get(IFLA_INFO_KIND))
    mode, bcq = "", 0
    if kind == "macvlan" and IFLA_INFO_DATA in info:
        data = nla.parse(info[IFLA_INFO_DATA])
        mode = MACVLAN_MODE_NAMES.get(nla.uint(data.get(IFLA_MACVLAN_MODE)) or 0, "")
        bcq = nla.uint(data.get(IFLA_MACVLAN_BC_QUEUE_LEN)) or 0
    state = nla.uint(a.get(IFLA_OPERSTATE))
    altnames = tuple(nla.text(v) for k, v in nla.items(a.get(IFLA_PROP_LIST)) if k == IFLA_ALT_IFNAME)
    return Link(
        index=index,
        name=nla.text(a.get(IFLA_IFNAME)),
        kind=kind,
        mac=nla.hwaddr(a.get(IFLA_ADDRESS)),
        mtu=nla.uint(a.get(IFLA_MTU)) or 0,
        up=bool(flags & IFF_UP),
        operstate="" if state is None else OPERSTATES[state] if state < len(OPERSTATES) else str(state),
        parent=nla.uint(a.get(IFLA_LINK)) or 0,
        link_netnsid=nla.sint(a.get(IFLA_LINK_NETNSID)),
        alias=nla.text(a.get(IFLA_IFALIAS)),
        macvlan_mode=mode,
        bcqueuelen=bcq,
        altnames=altnames,
        perm_mac=nla.hwaddr(a.get(IFLA_PERM_ADDRESS)),
        parent_dev=nla.text(a.get(IFLA_PARENT_DEV_NAME)),
    )


def _msg(index: int = 0, *attrs: bytes, flags: int = 0, change: int = 0) -> nla.Message:
    return nla.Message(IFINFOMSG.pack(0, 0, index, flags, change), b"".join(attrs), decode)


def get(nl: Netlink, name: str | None = None, index: int = 0) -> Link | None:
    """The link by name (or altname) or index; None if it does not exist (as for a name longer than
    IFNAMSIZ-1 bytes: the kernel looks names up through IFLA_IFNAME, which cannot carry one)."""
    return fetch(nl, decode, name, index)


def fetch[T](nl: Netlink, decoder: Callable[[bytes], T], name: str | None = None, index: int = 0) -> T | None:
    """get() with the answer decoded by `decoder` (cni.netlink.vfinfo reads a PF's VF list from it)."""
    if name and len(os.fsencode(name)) > 15:
        return None
    attrs = [nla.asciiz(IFLA_IFNAME, name)] if name else []
    attrs.append(nla.u32(IFLA_EXT_MASK, RTEXT_FILTER_VF))
    try:
        replies = nl.request(nla.Message(IFINFOMSG.pack(0, 0, index, 0, 0), b"".join(attrs), decoder),
                             RTM_GETLINK, 0, f"get link {name or index}")
    except NetlinkError as e:
        if e.errno in (ENODEV, 19, 2):
            return None
        raise
    return replies[0] if replies else None


def dump(nl: Netlink) -> list[Link]:
    return nl.request(_msg(), RTM_GETLINK, NLM_F_DUMP, "list links")


def create_macvlan(
    nl: Netlink,
    name: str,
    parent: int,
    mode: str,
    *,
    mtu: int = 0,
    mac: str | None = None,
    bcqueuelen: int = 0,
    netns_fd: int | None = None,
) -> None:
    data = [nla.u32(IFLA_MACVLAN_MODE, MACVLAN_MODES[mode])]
    if bcqueuelen:
        data.append(nla.u32(IFLA_MACVLAN_BC_QUEUE_LEN, bcqueuelen))
    attrs = [
        nla.asciiz(IFLA_IFNAME, name),
        nla.u32(IFLA_LINK, parent),
        nla.nested(IFLA_LINKINFO, nla.asciiz(IFLA_INFO_KIND, "macvlan"),
                    nla.nested(IFLA_INFO_DATA, *data)),
    ]
    if mtu:
        attrs.append(nla.u32(IFLA_MTU, mtu))
    if mac:
        attrs.append(nla.mac(IFLA_ADDRESS, mac))
    if netns_fd is not None:
        attrs.append(nla.u32(IFLA_NET_NS_FD, netns_fd))
    nl.request(_msg(0, *attrs), RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, f"create macvlan {name}")


def _set(nl: Netlink, index: int, attr: bytes, op: str, flags: int = 0, change: int = 0) -> None:
    nl.request(_msg(index, attr, flags=flags, change=change), RTM_NEWLINK, 0, op)


def set_name(nl: Netlink, index: int, name: str) -> None:
    _set(nl, index, nla.asciiz(IFLA_IFNAME, name), f"rename link {index} to {name}")


def set_up(nl: Netlink, index: int, up: bool = True) -> None:
    _set(nl, index, b"", f"set link {index} {'up' if up else 'down'}", IFF_UP if up else 0, IFF_UP)


def set_mtu(nl: Netlink, index: int, mtu: int) -> None:
    _set(nl, index, nla.u32(IFLA_MTU, mtu), f"set link {index} mtu {mtu}")


def set_mac(nl: Netlink, index: int, mac: str) -> None:
    _set(nl, index, nla.mac(IFLA_ADDRESS, mac), f"set link {index} address {mac}")


def set_alias(nl: Netlink, index: int, alias: str) -> None:
    _set(nl, index, nla.asciiz(IFLA_IFALIAS, alias), f"set link {index} alias")


def set_netns(nl: Netlink, index: int, netns_fd: int) -> None:
    _set(nl, index, nla.u32(IFLA_NET_NS_FD, netns_fd), f"move link {index} to another namespace")


def _altname(index: int, altname: str) -> nla.Message:
    name = nla.asciiz(IFLA_ALT_IFNAME, altname)
    return _msg(index, nla.nested(IFLA_PROP_LIST, name, flags=nla.NLA_F_NESTED))


def delete_altname(nl: Netlink, index: int, altname: str) -> None:
    nl.request(_altname(index, altname), RTM_DELLINKPROP, 0, f"delete altname {altname}")


def add_altname(nl: Netlink, index: int, altname: str) -> None:
    nl.request(_altname(index, altname), RTM_NEWLINKPROP, NLM_F_EXCL | NLM_F_CREATE, f"add altname {altname}")


def delete(nl: Netlink, index: int) -> bool:
    """Remove the link; False if it was already gone."""
    try:
        nl.request(_msg(index), RTM_DELLINK, 0, f"delete link {index}")
    except NetlinkError as e:
        if e.errno in (ENODEV, 2):
            return False
        raise
    return True
