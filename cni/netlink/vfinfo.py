"""SR-IOV VF attributes of a PF link (include/uapi/linux/if_link.h): the VF list the kernel puts in
its answer to RTM_GETLINK with IFLA_EXT_MASK RTEXT_FILTER_VF (IFLA_NUM_VF, IFLA_VFINFO_LIST of
IFLA_VF_INFO), and the RTM_SETLINK on the PF that changes one VF (IFLA_VFINFO_LIST holding one
IFLA_VF_INFO holding the IFLA_VF_* structs).

Every IFLA_VF_* attribute is a fixed C struct that starts with the VF number; IFLA_VF_VLAN_LIST nests
`struct ifla_vf_vlan_info` (16 bytes: three u32, a __be16 protocol, padding). The kernel checks each
length against its policy before a driver is asked. tests/unit/test_vf_encoding.py compares every
request with pyroute2's encoding byte for byte and decodes pyroute2-encoded VF lists."""

from __future__ import annotations

import struct

from cni.netlink import links, nla
from cni.types.valueclass import field, valueclass

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from cni.netlink.socket import Netlink

RTM_SETLINK = 19
IFLA_NUM_VF, IFLA_VFINFO_LIST = 21, 22
IFLA_VF_INFO = 1
IFLA_VF_MAC, IFLA_VF_VLAN, IFLA_VF_TX_RATE, IFLA_VF_SPOOFCHK, IFLA_VF_LINK_STATE, IFLA_VF_RATE = range(1, 7)
IFLA_VF_TRUST, IFLA_VF_VLAN_LIST = 9, 12
IFLA_VF_VLAN_INFO = 1
ETH_P_8021Q, ETH_P_8021AD = 0x8100, 0x88A8

VF_MAC = struct.Struct("=I32s")  # struct ifla_vf_mac: vf, mac[32]
VF_VLAN = struct.Struct("=III")  # struct ifla_vf_vlan: vf, vlan, qos
VF_VLAN_INFO = struct.Struct("=III")  # struct ifla_vf_vlan_info: vf, vlan, qos, then __be16 vlan_proto
BE16 = struct.Struct("!H")
VF_VLAN_INFO_SIZE = 16  # with the padding after vlan_proto (the kernel's policy minimum)
VF_RATE = struct.Struct("=III")  # struct ifla_vf_rate: vf, min_tx_rate, max_tx_rate
VF_U32 = struct.Struct("=II")  # ifla_vf_tx_rate, _spoofchk, _link_state, _trust: vf, value


@valueclass
class VfInfo:
    """One VF as its PF reports it, the kernel's numbers unchanged (spoofchk/trust 0xFFFFFFFF: the driver
    cannot tell). A field whose attribute was absent keeps its default (None for the flags)."""

    vf: int
    mac: str
    vlan: int = 0
    qos: int = 0
    proto: int = ETH_P_8021Q
    tx_rate: int = 0
    min_tx_rate: int = 0
    max_tx_rate: int = 0
    spoofchk: int | None = None
    trust: int | None = None
    link_state: int | None = None


@valueclass
class Pf:
    """A link and its VFs (num_vf None: the kernel sent no IFLA_NUM_VF, the device has no bus parent)."""

    link: links.Link
    num_vf: int | None = None
    vfs: tuple[VfInfo, ...] = field(default=())


# ---- building -------------------------------------------------------------------------------------


def vf_mac(vf: int, mac: str) -> bytes:
    return nla.attr(IFLA_VF_MAC, VF_MAC.pack(vf, bytes.fromhex(mac.replace(":", ""))))


def vf_vlan(vf: int, vlan: int, qos: int) -> bytes:
    """The legacy IFLA_VF_VLAN (802.1Q only)."""
    return nla.attr(IFLA_VF_VLAN, VF_VLAN.pack(vf, vlan, qos))


def vf_vlan_list(vf: int, vlan: int, qos: int, proto: int) -> bytes:
    info = VF_VLAN_INFO.pack(vf, vlan, qos) + BE16.pack(proto)
    info += bytes(VF_VLAN_INFO_SIZE - len(info))
    return nla.attr(IFLA_VF_VLAN_LIST, nla.attr(IFLA_VF_VLAN_INFO, info))


def vf_tx_rate(vf: int, rate: int) -> bytes:
    """The legacy IFLA_VF_TX_RATE (a maximum only)."""
    return nla.attr(IFLA_VF_TX_RATE, VF_U32.pack(vf, rate))


def vf_rate(vf: int, min_tx_rate: int, max_tx_rate: int) -> bytes:
    return nla.attr(IFLA_VF_RATE, VF_RATE.pack(vf, min_tx_rate, max_tx_rate))


def vf_spoofchk(vf: int, on: int) -> bytes:
    return nla.attr(IFLA_VF_SPOOFCHK, VF_U32.pack(vf, on))


def vf_trust(vf: int, on: int) -> bytes:
    return nla.attr(IFLA_VF_TRUST, VF_U32.pack(vf, on))


def vf_link_state(vf: int, state: int) -> bytes:
    return nla.attr(IFLA_VF_LINK_STATE, VF_U32.pack(vf, state))


def set_message(pf_index: int, *vf_attrs: bytes) -> nla.Message:
    """The RTM_SETLINK body for PF `pf_index` carrying `vf_attrs` (the attributes of one VF)."""
    vflist = nla.nested(IFLA_VFINFO_LIST, nla.nested(IFLA_VF_INFO, *vf_attrs))
    return nla.Message(links.IFINFOMSG.pack(0, 0, pf_index, 0, 0), vflist, links.decode)


def set_vf(nl: Netlink, pf_index: int, *vf_attrs: bytes, op: str) -> None:
    nl.request(set_message(pf_index, *vf_attrs), RTM_SETLINK, 0, op)


# ---- reading --------------------------------------------------------------------------------------


def decode_info(payload: bytes) -> VfInfo | None:
    """One IFLA_VF_INFO; None without the IFLA_VF_MAC that names the VF (or when it is malformed)."""
    a = nla.parse(payload)
    mac = a.get(IFLA_VF_MAC)
    if mac is None or len(mac) < VF_MAC.size:
        return None
    vf, raw = VF_MAC.unpack_from(mac)
    vlan, qos, proto = 0, 0, ETH_P_8021Q
    legacy = a.get(IFLA_VF_VLAN)
    if legacy is not None and len(legacy) >= VF_VLAN.size:
        _, vlan, qos = VF_VLAN.unpack_from(legacy)
    for kind, item in nla.items(a.get(IFLA_VF_VLAN_LIST)):
        # the kernel sends one, 16 bytes; pyroute2 (0.9) encodes it without the 2 bytes of padding
        if kind == IFLA_VF_VLAN_INFO and len(item) >= VF_VLAN_INFO.size + BE16.size:
            _, vlan, qos = VF_VLAN_INFO.unpack_from(item)
            proto = BE16.unpack_from(item, VF_VLAN_INFO.size)[0]
            break
    rate = a.get(IFLA_VF_RATE)
    min_rate, max_rate = VF_RATE.unpack_from(rate)[1:] if rate and len(rate) >= VF_RATE.size else (0, 0)
    return VfInfo(vf=vf, mac=nla.hwaddr(raw[:6]), vlan=vlan, qos=qos, proto=proto,
                  tx_rate=_value(a.get(IFLA_VF_TX_RATE)) or 0, min_tx_rate=min_rate, max_tx_rate=max_rate,
                  spoofchk=_value(a.get(IFLA_VF_SPOOFCHK)), trust=_value(a.get(IFLA_VF_TRUST)),
                  link_state=_value(a.get(IFLA_VF_LINK_STATE)))


def _value(payload: bytes | None) -> int | None:
    """The value of a {u32 vf; u32 value} struct."""
    return int(VF_U32.unpack_from(payload)[1]) if payload and len(payload) >= VF_U32.size else None


def decode_list(payload: bytes | None) -> tuple[VfInfo, ...]:
    """The VFs of an IFLA_VFINFO_LIST, in the kernel's order."""
    out = []
    for kind, item in nla.items(payload):
        info = decode_info(item) if kind == IFLA_VF_INFO else None
        if info is not None:
            out.append(info)
    return tuple(out)


def decode(chunk: bytes) -> Pf:
    """An RTM_NEWLINK message (nlmsghdr included) as a Pf: the link and its VF list."""
    a = nla.parse(chunk, nla.NLMSGHDR.size + links.IFINFOMSG.size)
    return Pf(link=links.decode(chunk), num_vf=nla.uint(a.get(IFLA_NUM_VF)),
              vfs=decode_list(a.get(IFLA_VFINFO_LIST)))


def get(nl: Netlink, name: str | None = None, index: int = 0) -> Pf | None:
    """The link by name or index with its VFs (RTM_GETLINK with RTEXT_FILTER_VF); None if it does not
    exist."""
    return links.fetch(nl, decode, name, index)
