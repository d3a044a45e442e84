"""PF-side VF settings: the one narrow seam between the sriov plugin and the kernel.

A VF's VLAN, admin MAC, rates, spoof check, trust and link state live on its PF and are read and
written with netlink VF attributes on the PF link (IFLA_VFINFO_LIST / IFLA_VF_INFO / IFLA_VF_*).
Everything the plugin does to a PF goes through `VfControl.read` and `VfControl.set`, one setting per
request, so a test can record and check the exact requests and their order.

`control()` returns what `factory` makes: the netlink implementation. Only a test process replaces
`factory` (tests/launch.py installs the recording fake of tests/fakevf.py); nothing outside the code
(no environment variable, file or flag) selects another implementation.
The codec is cni.netlink.vfinfo and the socket cni.netlink's (both imported on first use: the fake
and a config error never load them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Protocol

from cni.errors import KernelError

if TYPE_CHECKING:
    from cni.netlink.nla import Message
    from cni.netlink.vfinfo import VfInfo

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


def attribute(vf: int, setting: Setting) -> bytes:
    """The IFLA_VF_* attribute (encoded) that carries `setting` for VF `vf`."""
    from cni.netlink import vfinfo

    if setting.kind not in KIND_FIELDS:
        raise ValueError(f"unknown VF setting {setting.kind!r}")
    v = setting.fields()
    if setting.kind == "vlan":
        return vfinfo.vf_vlan_list(vf, int(v["vlan"]), int(v["qos"]), PROTOS[str(v["proto"])])
    if setting.kind == "mac":
        return vfinfo.vf_mac(vf, str(v["mac"]))
    if setting.kind == "rate":
        return vfinfo.vf_rate(vf, int(v["min_tx_rate"]), int(v["max_tx_rate"]))
    encode = {"spoofchk": vfinfo.vf_spoofchk, "trust": vfinfo.vf_trust, "link_state": vfinfo.vf_link_state}
    return encode[setting.kind](vf, int(v[setting.kind]))


def message(pf_index: int, vf: int, setting: Setting) -> Message:
    """The RTM_SETLINK message that applies `setting` to VF `vf` of PF `pf_index`."""
    from cni.netlink import vfinfo

    return vfinfo.set_message(pf_index, attribute(vf, setting))


def _u32_flag(value: int | None) -> int:
    return -1 if value is None or value == UNKNOWN else int(value)


def state(info: VfInfo) -> VfState:
    """A VF as the kernel reported it, as a VfState."""
    return VfState(mac=info.mac, vlan=info.vlan, qos=info.qos, proto=PROTO_NAMES.get(info.proto, "802.1q"),
                   spoofchk=_u32_flag(info.spoofchk), trust=_u32_flag(info.trust),
                   link_state=info.link_state or 0, min_tx_rate=info.min_tx_rate,
                   max_tx_rate=info.max_tx_rate)


def decode_vfs(infos: Iterable[VfInfo]) -> dict[int, VfState]:
    """VF number -> state, from the VF list of the PF's RTM_NEWLINK (cni.netlink.vfinfo.decode)."""
    return {info.vf: state(info) for info in infos}


class NetlinkVf:
    """VF settings through the PF link in the plugin's own (host) namespace."""

    def read(self, pf: str, vf: int) -> VfState:
        """One RTM_GETLINK of the PF with RTEXT_FILTER_VF: the link and its VF list."""
        from cni.netlink import vfinfo
        from cni.netlink.socket import opened

        with opened(None) as nl:
            got = vfinfo.get(nl, pf)
        if got is None:
            raise KernelError(f"PF {pf}: no such interface in the host network namespace")
        vfs = decode_vfs(got.vfs)
        if vf not in vfs:
            raise KernelError(f"PF {pf}: reports no VF {vf} (the driver exposes no SR-IOV VF settings)")
        return vfs[vf]

    def set(self, pf: str, vf: int, setting: Setting) -> None:
        """RTM_SETLINK on the PF's ifindex with IFLA_VFINFO_LIST / IFLA_VF_INFO / the setting's IFLA_VF_*."""
        from cni.netlink import links, vfinfo
        from cni.netlink.socket import opened

        with opened(None) as nl:
            link = links.get(nl, pf)
            if link is None:
                raise KernelError(f"PF {pf}: no such interface in the host network namespace")
            vfinfo.set_vf(nl, link.index, attribute(vf, setting),
                          op=f"PF {pf}: set VF {vf} {setting.describe()}")
