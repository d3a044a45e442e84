"""sriov: attach an SR-IOV VF (found by its PCI address, `deviceID`) to a pod. PF-side settings go
through cni.sriov.vf; the netdev moves like a host device (cni.device); a VF bound to a userspace
driver (DPDK) is not moved, but its PF-side settings are applied and restored all the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cni.device import attach, release, sources
from cni.device.conf import DeviceConf, Target
from cni.errors import ConfigError, NotAvailableError
from cni.plugins import common
from cni.sriov import sysfs
from cni.sriov.settings import VfHooks
from cni.sriov.vf import LINK_STATES, PROTOS, Setting, control
from cni.types import fields as f
from cni.types.netconf import Request, requested_mac
from cni.types.result import Result

ON_OFF = ("on", "off")


@dataclass(frozen=True)
class SriovConf:
    device_id: str
    device_field: str
    plan: tuple[Setting, ...]
    mac: str | None
    device: DeviceConf

    @staticmethod
    def from_request(req: Request) -> SriovConf:
        c = req.conf
        field, raw = _device_id(req)
        pci = sysfs.normalize_pci(raw)
        if pci is None:
            raise ConfigError(f'{field}: "{raw}" is not a PCI address (like 0000:af:06.0)')
        mac = requested_mac(req, f.mac(c["mac"], "mac") if c.get("mac") else None)
        plan = [*_vlan(c)]
        if mac:
            plan.append(Setting("mac", (mac,)))
        plan += [*_rate(c), *_flags(c)]
        return SriovConf(pci, field, tuple(plan), mac, DeviceConf.from_request(req))


def _device_id(req: Request) -> tuple[str, str]:
    """The VF from every channel that names it (cni.device.sources: they must agree)."""
    named = sources.required(req, "deviceID: required (the VF's PCI address; Multus sets it from the "
                                  "resource, a DRA driver from the claim)",
                             "runtimeConfig.deviceID, deviceID or pciBusID")
    return named.field, named.value


def _vlan(c: dict[str, Any]) -> list[Setting]:
    vlan = f.int_range(c, "vlan", "", 0, 4094)
    qos = f.int_range(c, "vlanQoS", "", 0, 7)
    proto_raw = f.opt(c, "vlanProto", str, "")
    if vlan is None:
        for key, value in (("vlanQoS", qos), ("vlanProto", proto_raw)):
            if value is not None:
                raise ConfigError(f"{key}: set without vlan")
        return []
    proto = (proto_raw or "802.1q").lower()
    if proto not in PROTOS:
        raise ConfigError(f'vlanProto: unknown value "{proto_raw}" (expected 802.1q or 802.1ad)')
    if vlan == 0 and qos:
        raise ConfigError(f"vlanQoS: {qos} needs a non-zero vlan")
    if vlan == 0 and proto == "802.1ad":
        raise ConfigError("vlanProto: 802.1ad needs a non-zero vlan")
    return [Setting("vlan", (vlan, qos or 0, proto))]


def _rate(c: dict[str, Any]) -> list[Setting]:
    lo = f.int_range(c, "min_tx_rate", "", 0, 2**32 - 1)
    hi = f.int_range(c, "max_tx_rate", "", 0, 2**32 - 1)
    if lo is None and hi is None:
        return []
    if lo and hi and lo > hi:
        raise ConfigError(f"min_tx_rate: {lo} is above max_tx_rate {hi}")
    return [Setting("rate", (lo or 0, hi or 0))]


def _flags(c: dict[str, Any]) -> list[Setting]:
    out = []
    for key in ("spoofchk", "trust"):
        value = f.opt(c, key, str, "")
        if value:
            out.append(Setting(key, (1 if f.choice(c, key, "", ON_OFF, "on") == "on" else 0,)))
    state = f.opt(c, "link_state", str, "")
    if state:
        out.append(Setting("link_state", (LINK_STATES[f.choice(c, "link_state", "", tuple(LINK_STATES),
                                                               "auto")],)))
    return out


@dataclass(frozen=True)
class Vf:
    pci: str
    pf: str
    index: int
    netdev: str
    driver: str


def resolve(conf: SriovConf, fs: sysfs.Sysfs) -> Vf:
    """VF -> PF netdev, VF index, VF netdev (none for a userspace driver), driver, from sysfs."""
    pci, field = conf.device_id, conf.device_field
    if not fs.pci_exists(pci):
        raise ConfigError(f'{field}: "{pci}": no such PCI device under {fs.pci("")}')
    pf_pci = fs.physfn(pci)
    if pf_pci is None:
        raise ConfigError(f'{field}: "{pci}" is not an SR-IOV VF (no physfn link)')
    pf_names = fs.pci_netdevs(pf_pci)
    if not pf_names:
        raise ConfigError(f'{field}: "{pci}": its PF {pf_pci} has no network interface')
    index = fs.vf_index(pf_pci, pci)
    if index is None:
        raise ConfigError(f'{field}: "{pci}" is not among the enabled VFs of PF {pf_names[0]} ({pf_pci})')
    driver = fs.driver(pci) or ""
    names = fs.pci_netdevs(pci)
    if driver in sysfs.USERSPACE_DRIVERS:
        names = []
    elif not names:
        known = ", ".join(sysfs.USERSPACE_DRIVERS)
        raise ConfigError(f'{field}: VF "{pci}" has no network interface and driver '
                          f'"{driver or "none"}" is not a userspace driver ({known})')
    return Vf(pci, pf_names[0], index, names[0] if names else "", driver)


def add(req: Request) -> Result:
    common.setup_logging(req.conf, "sriov")
    conf = SriovConf.from_request(req)
    fs = sysfs.open_sysfs()
    vf = resolve(conf, fs)
    target = Target(key=f"pci-{vf.pci}", what=f"VF {vf.pci}", pci=vf.pci, netdev=vf.netdev,
                    driver=vf.driver)
    hooks = VfHooks(control(), vf.pf, vf.index, conf.plan, fs)
    return attach.add(req, "sriov", conf.device, target, hooks, conf.mac)


def delete(req: Request) -> None:
    common.setup_logging(req.conf, "sriov")
    release.delete(req, DeviceConf.from_request(req))


def check(req: Request) -> None:
    common.setup_logging(req.conf, "sriov")
    SriovConf.from_request(req)
    attach.check(req, DeviceConf.from_request(req))


def status(req: Request) -> None:
    """Not available (50) without a PCI tree under the sysfs root or a usable state dir."""
    fs = sysfs.open_sysfs()
    if not fs.pci_exists(""):
        raise NotAvailableError(f"no PCI device tree at {fs.pci('')} (sysfs root {fs.top})")
    attach.status(req, DeviceConf.from_request(req))


def gc(req: Request) -> None:
    release.gc(req, "sriov", DeviceConf.from_request(req))
