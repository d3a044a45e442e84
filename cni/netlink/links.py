"""Links: look up, create (macvlan), rename, move, set up/down/MTU/MAC/alias, delete."""

from __future__ import annotations

import os

from cni.netlink.socket import ENODEV, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, Netlink, NetlinkError
from cni.types.record import field, record

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs every call ~4 ms
if TYPE_CHECKING:
    from typing import Any

RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_NEWLINKPROP, RTM_DELLINKPROP = 16, 17, 18, 108, 109
IFF_UP = 0x1
MACVLAN_MODES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8, "source": 16}
MACVLAN_MODE_NAMES = {v: k for k, v in MACVLAN_MODES.items()}


@record
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


def _decode(msg: Any) -> Link:
    kind = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND") or ""
    mode, bcq = "", 0
    if kind == "macvlan":
        data = msg.get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
        if data is not None:
            raw_mode = data.get_attr("IFLA_MACVLAN_MODE")
            mode = raw_mode if isinstance(raw_mode, str) else MACVLAN_MODE_NAMES.get(raw_mode or 0, "")
            bcq = data.get_attr("IFLA_MACVLAN_BC_QUEUE_LEN") or 0
    props = msg.get_attr("IFLA_PROP_LIST")
    altnames = tuple(props.get_attrs("IFLA_ALT_IFNAME")) if props is not None else ()
    return Link(
        index=msg["index"],
        name=msg.get_attr("IFLA_IFNAME") or "",
        kind=kind,
        mac=msg.get_attr("IFLA_ADDRESS") or "",
        mtu=msg.get_attr("IFLA_MTU") or 0,
        up=bool(msg["flags"] & IFF_UP),
        operstate=msg.get_attr("IFLA_OPERSTATE") or "",
        parent=msg.get_attr("IFLA_LINK") or 0,
        link_netnsid=msg.get_attr("IFLA_LINK_NETNSID"),
        alias=msg.get_attr("IFLA_IFALIAS") or "",
        macvlan_mode=mode,
        bcqueuelen=bcq,
        altnames=altnames,
        perm_mac=msg.get_attr("IFLA_PERM_ADDRESS") or "",
        parent_dev=msg.get_attr("IFLA_PARENT_DEV_NAME") or "",
    )


def _msg(index: int = 0, attrs: list[tuple[str, Any]] | None = None) -> Any:
    from cni.netlink.codec import ifinfmsg  # pyroute2: only when a message is built

    msg = ifinfmsg()
    msg["family"] = 0
    msg["index"] = index
    msg["attrs"] = attrs or []
    return msg


def get(nl: Netlink, name: str | None = None, index: int = 0) -> Link | None:
    """The link by name (or altname) or index; None if it does not exist (as for a name longer than
    IFNAMSIZ-1 bytes: the kernel looks names up through IFLA_IFNAME, which cannot carry one)."""
    if name and len(os.fsencode(name)) > 15:
        return None
    attrs: list[tuple[str, Any]] = [("IFLA_IFNAME", name)] if name else []
    attrs.append(("IFLA_EXT_MASK", 1))  # RTEXT_FILTER_VF
    try:
        replies = nl.request(_msg(index, attrs), RTM_GETLINK, 0, f"get link {name or index}")
    except NetlinkError as e:
        if e.errno in (ENODEV, 19, 2):
            return None
        raise
    return _decode(replies[0]) if replies else None


def get_raw(nl: Netlink, index: int) -> Any:
    """The undecoded reply (for VF info lists)."""
    replies = nl.request(_msg(index, [("IFLA_EXT_MASK", 1)]), RTM_GETLINK, 0, f"get link {index}")
    return replies[0]


def dump(nl: Netlink) -> list[Link]:
    return [_decode(m) for m in nl.request(_msg(), RTM_GETLINK, NLM_F_DUMP, "list links")]


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
    data: list[tuple[str, Any]] = [("IFLA_MACVLAN_MODE", MACVLAN_MODES[mode])]
    if bcqueuelen:
        data.append(("IFLA_MACVLAN_BC_QUEUE_LEN", bcqueuelen))
    attrs: list[tuple[str, Any]] = [
        ("IFLA_IFNAME", name),
        ("IFLA_LINK", parent),
        ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "macvlan"), ("IFLA_INFO_DATA", {"attrs": data})]}),
    ]
    if mtu:
        attrs.append(("IFLA_MTU", mtu))
    if mac:
        attrs.append(("IFLA_ADDRESS", mac))
    if netns_fd is not None:
        attrs.append(("IFLA_NET_NS_FD", netns_fd))
    nl.request(_msg(0, attrs), RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, f"create macvlan {name}")


def _set(
    nl: Netlink, index: int, attrs: list[tuple[str, Any]], op: str, flags: int = 0, change: int = 0
) -> None:
    msg = _msg(index, attrs)
    msg["flags"], msg["change"] = flags, change
    nl.request(msg, RTM_NEWLINK, 0, op)


def set_name(nl: Netlink, index: int, name: str) -> None:
    _set(nl, index, [("IFLA_IFNAME", name)], f"rename link {index} to {name}")


def set_up(nl: Netlink, index: int, up: bool = True) -> None:
    _set(nl, index, [], f"set link {index} {'up' if up else 'down'}", IFF_UP if up else 0, IFF_UP)


def set_mtu(nl: Netlink, index: int, mtu: int) -> None:
    _set(nl, index, [("IFLA_MTU", mtu)], f"set link {index} mtu {mtu}")


def set_mac(nl: Netlink, index: int, mac: str) -> None:
    _set(nl, index, [("IFLA_ADDRESS", mac)], f"set link {index} address {mac}")


def set_alias(nl: Netlink, index: int, alias: str) -> None:
    _set(nl, index, [("IFLA_IFALIAS", alias)], f"set link {index} alias")


def set_netns(nl: Netlink, index: int, netns_fd: int) -> None:
    _set(nl, index, [("IFLA_NET_NS_FD", netns_fd)], f"move link {index} to another namespace")


def delete_altname(nl: Netlink, index: int, altname: str) -> None:
    msg = _msg(index, [("IFLA_PROP_LIST", {"attrs": [("IFLA_ALT_IFNAME", altname)]})])
    nl.request(msg, RTM_DELLINKPROP, 0, f"delete altname {altname}")


def add_altname(nl: Netlink, index: int, altname: str) -> None:
    msg = _msg(index, [("IFLA_PROP_LIST", {"attrs": [("IFLA_ALT_IFNAME", altname)]})])
    nl.request(msg, RTM_NEWLINKPROP, NLM_F_EXCL | NLM_F_CREATE, f"add altname {altname}")


def delete(nl: Netlink, index: int) -> bool:
    """Remove the link; False if it was already gone."""
    try:
        nl.request(_msg(index), RTM_DELLINK, 0, f"delete link {index}")
    except NetlinkError as e:
        if e.errno in (ENODEV, 2):
            return False
        raise
    return True
