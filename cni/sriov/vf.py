"""PF-side VF settings: the one narrow seam between the sriov plugin and the kernel.

A VF's VLAN, admin MAC, rates, spoof check, trust and link state live on its PF and are read and
written with netlink VF attributes on the PF link (IFLA_VFINFO_LIST / IFLA_VF_INFO / IFLA_VF_*).
Everything the plugin does to a PF goes through `VfControl.read` and `VfControl.set`, one setting per
request, so a test can record and check the exact requests and their order.

`control()` returns what `factory` makes: the netlink implementation. Only a test process replaces
`factory` (tests/launch.py installs the recording fake of tests/fakevf.py); nothing outside the code
(no environment variable, file or flag) selects another implementation.
pyroute2's message classes are the codec (imported on first use); the socket is cni.netlink's."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol

from cni.errors import KernelError

PROTOS = {"802.1q": 0x8100, "802.1ad": 0x88A8}
PROTO_NAMES = {v: k for k, v in PROTOS.items()}
LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}
UNKNOWN = 0xFFFFFFFF  # what the kernel reports for spoofchk/trust a driver cannot tell
# which VfState fields one request of each kind carries
KIND_FIELDS: dict[str, tuple[str, ...]] = {
    "vlan": ("vlan", "qos", "proto"),
    "mac": ("mac",),
    "rate": ("min_tx_rate", "max_tx_rate"),
    "spoofchk": ("spoofchk",),
    "trust": ("trust",),
    "link_state": ("link_state",),
}
APPLY_ORDER = ("vlan", "mac", "rate", "spoofchk", "trust", "link_state")
# PF-side MAC before trust: some drivers refuse a MAC reset while trust is off (as sriov-cni)
RESTORE_ORDER = ("vlan", "spoofchk", "mac", "trust", "rate", "link_state")


@dataclass(frozen=True)
class VfState:
    """One VF as its PF reports it. spoofchk/trust: 1 on, 0 off, -1 unknown."""

    mac: str = "00:00:00:00:00:00"
    vlan: int = 0
    qos: int = 0
    proto: str = "802.1q"
    spoofchk: int = -1
    trust: int = -1
    link_state: int = 0
    min_tx_rate: int = 0
    max_tx_rate: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> VfState:
        known = {f.name for f in fields(VfState)}
        return VfState(**{k: v for k, v in d.items() if k in known})


@dataclass(frozen=True)
class Setting:
    """One PF-side request: `kind` and the values of its fields (KIND_FIELDS[kind])."""

    kind: str
    values: tuple[int | str, ...]

    @staticmethod
    def of(kind: str, state: VfState) -> Setting:
        return Setting(kind, tuple(getattr(state, name) for name in KIND_FIELDS[kind]))

    def fields(self) -> dict[str, int | str]:
        return dict(zip(KIND_FIELDS[self.kind], self.values, strict=True))

    def applied_to(self, state: VfState) -> VfState:
        return replace(state, **self.fields())  # type: ignore[arg-type]

    def restorable(self) -> bool:
        """False for values the kernel reported as unknown (nothing to put back)."""
        return all(v != -1 for v in self.values)

    def describe(self) -> str:
        return f"{self.kind} " + " ".join(f"{k}={v}" for k, v in self.fields().items())


class VfControl(Protocol):
    def read(self, pf: str, vf: int) -> VfState: ...

    def set(self, pf: str, vf: int, setting: Setting) -> None: ...


factory: Callable[[], VfControl] | None = None  # None: NetlinkVf (the seam tests replace)


def control() -> VfControl:
    return NetlinkVf() if factory is None else factory()


# ---- the netlink implementation ------------------------------------------------------------------


def attribute(vf: int, setting: Setting) -> tuple[str, dict[str, Any]]:
    """The IFLA_VF_* attribute (pyroute2 form) that carries `setting` for VF `vf`."""
    if setting.kind not in KIND_FIELDS:
        raise ValueError(f"unknown VF setting {setting.kind!r}")
    v = setting.fields()
    if setting.kind == "vlan":
        info = {"vf": vf, "vlan": v["vlan"], "qos": v["qos"], "proto": PROTOS[str(v["proto"])]}
        return "IFLA_VF_VLAN_LIST", {"attrs": [("IFLA_VF_VLAN_INFO", info)]}
    if setting.kind == "mac":
        return "IFLA_VF_MAC", {"vf": vf, "mac": v["mac"]}
    if setting.kind == "rate":
        return "IFLA_VF_RATE", {"vf": vf, "min_tx_rate": v["min_tx_rate"], "max_tx_rate": v["max_tx_rate"]}
    return f"IFLA_VF_{setting.kind.upper()}", {"vf": vf, setting.kind: v[setting.kind]}


def message(pf_index: int, vf: int, setting: Setting) -> Any:
    """The RTM_NEWLINK body (unencoded) that applies `setting` to VF `vf` of PF `pf_index`."""
    msg = codec()()
    msg["family"] = 0
    msg["index"] = pf_index
    attr = attribute(vf, setting)
    msg["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": [attr]})]})]
    return msg


def _u32_flag(value: int) -> int:
    return -1 if value == UNKNOWN else int(value)


def decode_vfs(msg: Any) -> dict[int, VfState]:
    """VF index -> state from an RTM_NEWLINK reply of the PF (requested with RTEXT_FILTER_VF)."""
    out: dict[int, VfState] = {}
    vflist = msg.get_attr("IFLA_VFINFO_LIST")
    for info in vflist.get_attrs("IFLA_VF_INFO") if vflist is not None else ():
        mac = info.get_attr("IFLA_VF_MAC")
        if mac is None:
            continue
        state = VfState(mac=mac["mac"])
        vlan = info.get_attr("IFLA_VF_VLAN")
        if vlan is not None:
            state = replace(state, vlan=vlan["vlan"], qos=vlan["qos"])
        vlist = info.get_attr("IFLA_VF_VLAN_LIST")
        item = vlist.get_attr("IFLA_VF_VLAN_INFO") if vlist is not None else None
        if item is not None:
            proto = PROTO_NAMES.get(item["proto"], "802.1q")
            state = replace(state, vlan=item["vlan"], qos=item["qos"], proto=proto)
        state = _decode_flags(info, state)
        out[mac["vf"]] = state
    return out


def _decode_flags(info: Any, state: VfState) -> VfState:
    spoof, trust = info.get_attr("IFLA_VF_SPOOFCHK"), info.get_attr("IFLA_VF_TRUST")
    link, rate = info.get_attr("IFLA_VF_LINK_STATE"), info.get_attr("IFLA_VF_RATE")
    if spoof is not None:
        state = replace(state, spoofchk=_u32_flag(spoof["spoofchk"]))
    if trust is not None:
        state = replace(state, trust=_u32_flag(trust["trust"]))
    if link is not None:
        state = replace(state, link_state=link["link_state"])
    if rate is not None:
        state = replace(state, min_tx_rate=rate["min_tx_rate"], max_tx_rate=rate["max_tx_rate"])
    return state


# pyroute2 compiles a class's attribute table once and marks the class; a subclass inherits both the
# mark and the table (which names the base's nested classes) unless it gets its own fresh ones.
_FRESH = {"_nlmsg_base__compiled_nla": False, "_nlmsg_base__t_nla_map": None,
          "_nlmsg_base__r_nla_map": None}


@functools.cache
def codec() -> type:
    """ifinfmsg with a correct IFLA_VF_VLAN_INFO: struct ifla_vf_vlan_info is 16 bytes (three u32 and
    a __be16, padded), the kernel rejects anything shorter, and pyroute2 0.9 encodes 14."""
    from cni.netlink.codec import ifinfmsg, nla

    ivvi = type("ivvi", (nla,), {**_FRESH, "fields": (
        ("vf", "I"), ("vlan", "I"), ("qos", "I"), ("proto", ">H"), ("__pad", "2x"))})
    vf_vlist = type("vf_vlist", (nla,), {**_FRESH, "ivvi": ivvi, "nla_map": (
        ("IFLA_VF_VLAN_INFO_UNSPEC", "none"), ("IFLA_VF_VLAN_INFO", "ivvi"))})
    vfinfo = type("vfinfo", (ifinfmsg.vflist.vfinfo,), {**_FRESH, "vf_vlist": vf_vlist})
    vflist = type("vflist", (ifinfmsg.vflist,), {**_FRESH, "vfinfo": vfinfo})
    return type("vfinfmsg", (ifinfmsg,), {**_FRESH, "vflist": vflist})


class NetlinkVf:
    """VF settings through the PF link in the plugin's own (host) namespace."""

    def _index(self, nl: Any, pf: str) -> int:
        from cni.netlink import links

        link = links.get(nl, pf)
        if link is None:
            raise KernelError(f"PF {pf}: no such interface in the host network namespace")
        return link.index

    def read(self, pf: str, vf: int) -> VfState:
        from cni.netlink.links import RTM_GETLINK
        from cni.netlink.socket import opened

        with opened(None) as nl:
            msg = codec()()
            msg["family"], msg["index"] = 0, self._index(nl, pf)
            msg["attrs"] = [("IFLA_EXT_MASK", 1)]  # RTEXT_FILTER_VF
            replies = nl.request(msg, RTM_GETLINK, 0, f"PF {pf}: read VF {vf}")
        vfs = decode_vfs(replies[0]) if replies else {}
        if vf not in vfs:
            raise KernelError(f"PF {pf}: reports no VF {vf} (the driver exposes no SR-IOV VF settings)")
        return vfs[vf]

    def set(self, pf: str, vf: int, setting: Setting) -> None:
        from cni.netlink.links import RTM_NEWLINK
        from cni.netlink.socket import opened

        with opened(None) as nl:
            msg = message(self._index(nl, pf), vf, setting)
            nl.request(msg, RTM_NEWLINK, 0, f"PF {pf}: set VF {vf} {setting.describe()}")
