"""pyroute2 as the reference codec of the netlink tests (tests/unit/test_netlink_nla.py,
tests/unit/test_vf_encoding.py), through its public message classes only: pycni itself never imports
pyroute2 (a dev/test dependency; cni.netlink.nla and the modules on it are the product's codec).

The one addition: macvlan's IFLA_INFO_DATA with the broadcast-queue attributes pyroute2 0.9 lacks, a
new nla class registered for the "macvlan" kind with pyroute2's own register_link_kind."""

from __future__ import annotations

from typing import Any

from pyroute2.netlink import nla
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg, macvx_data
from pyroute2.netlink.rtnl.rtmsg import rtmsg

__all__ = ["encode", "ifaddrmsg", "ifinfmsg", "rtmsg"]


class macvlan_data(nla):  # type: ignore[misc]
    """macvx_data's attributes (and its value classes) plus the broadcast-queue ones. A class of its
    own rather than a subclass: pyroute2 compiles an attribute table per class on first use."""

    prefix = "IFLA_"
    nla_map = (
        *macvx_data.nla_map,
        ("IFLA_MACVLAN_BC_QUEUE_LEN", "uint32"),
        ("IFLA_MACVLAN_BC_QUEUE_LEN_USED", "uint32"),
        ("IFLA_MACVLAN_BC_CUTOFF", "int32"),
    )
    mode, flags = macvx_data.mode, macvx_data.flags
    macaddr_mode, macaddr_data = macvx_data.macaddr_mode, macvx_data.macaddr_data


ifinfmsg.ifinfo.register_link_kind(module={"macvlan": macvlan_data})


def encode(msg: Any, msg_type: int, flags: int, seq: int) -> bytes:
    """`msg` (a pyroute2 message) encoded as a whole netlink message."""
    msg["header"]["type"], msg["header"]["flags"] = msg_type, flags
    msg["header"]["sequence_number"], msg["header"]["pid"] = seq, 0
    msg.encode()
    return bytes(msg.data)


def decoded(cls: Any, data: bytes) -> Any:
    """`data` decoded by pyroute2's message class `cls`."""
    msg = cls(data)
    msg.decode()
    return msg
