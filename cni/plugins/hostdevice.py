"""host-device: move an existing host interface (a PF, a VF netdev, any NIC) into a pod and bring it
home on DEL. The device is selected by `device`, `hwaddr`, `kernelpath`, else by the device id sources
(runtimeConfig.deviceID, deviceID, pciBusID, the device-info file: cni.device.sources, which must
agree; runtimeConfig.deviceID may also be an auxiliary device); a PCI device bound to a userspace driver
(vfio-pci, uio_pci_generic, igb_uio) is not moved: only the IPAM result is returned."""

from __future__ import annotations

import contextlib
import os

from cni import skel
from cni.device import attach, release, sources
from cni.device.conf import DeviceConf, Target
from cni.errors import ConfigError
from cni.netlink import links
from cni.netlink.socket import opened
from cni.plugins import common
from cni.sriov import sysfs
from cni.types import fields as f
from cni.types.netconf import Request
from cni.types.result import Result

SELECTORS = ("device", "hwaddr", "kernelpath")  # then the device id sources (cni.device.sources)


def selector(req: Request) -> tuple[str, str]:
    """(field, value) of the selector in force, by precedence; code 7 when there is none."""
    for name in SELECTORS:
        value = f.opt(req.conf, name, str, "", "")
        if value:
            return name, str(value)
    named = sources.required(req, "specify one of device, hwaddr, kernelpath, pciBusID or deviceID "
                                  "(runtimeConfig.deviceID, runtimeConfig.CNIDeviceInfoFile)",
                             "device, hwaddr, kernelpath, runtimeConfig.deviceID, deviceID or pciBusID")
    return named.field, named.value


def _by_name(field: str, value: str, name: str, fs: sysfs.Sysfs) -> Target:
    """The netdev `name`. It need not be in the host namespace yet: when another attachment holds
    it, ADD reports who does (the device key comes from sysfs); otherwise ADD says it is missing."""
    with opened(None) as host:
        link = links.get(host, name)
    parent = link.parent_dev if link is not None else ""
    pci = fs.pci_of_netdev(name) or (parent if sysfs.PCI_RE.match(parent) else "")
    netdev = link.name if link is not None else name
    key = f"pci-{pci}" if pci else f"net-{netdev}"
    return Target(key, f'{field} "{value}"', pci, netdev, (fs.driver(pci) or "") if pci else "")


def _by_mac(value: str, fs: sysfs.Sysfs) -> Target:
    mac = f.mac(value, "hwaddr")
    with opened(None) as host:
        found = [link for link in links.dump(host) if link.mac.lower() == mac]
    if not found:
        raise ConfigError(f'hwaddr: "{value}": no interface with this MAC in the host network namespace')
    return _by_name("hwaddr", value, found[0].name, fs)


def _by_dir(field: str, value: str, directory: str, pci: str, fs: sysfs.Sysfs) -> Target:
    """A device directory (PCI, auxiliary or kernelpath): its first netdev, or DPDK mode."""
    driver = ""
    with contextlib.suppress(OSError):
        driver = os.path.basename(os.readlink(os.path.join(directory, "driver")))
    if driver in sysfs.USERSPACE_DRIVERS:
        return Target(f"pci-{pci or value}", f'{field} "{value}"', pci, "", driver)
    names = fs.netdevs_in(directory)
    if not names:
        raise ConfigError(f'{field}: "{value}": no network interface under {directory}/net and driver '
                          f'"{driver or "none"}" is not a userspace driver')
    return _by_name(field, value, names[0], fs)


def _by_id(field: str, value: str, fs: sysfs.Sysfs) -> Target:
    pci = sysfs.normalize_pci(value)
    if pci and fs.pci_exists(pci):
        return _by_dir(field, value, fs.pci(pci), pci, fs)
    if fs.aux_exists(value):
        return _by_dir(field, value, fs.path("bus", "auxiliary", "devices", value), "", fs)
    raise ConfigError(f'{field}: "{value}": no such PCI or auxiliary device under {fs.top}/bus')


def target(req: Request) -> Target:
    fs = sysfs.open_sysfs()
    field, value = selector(req)
    if field == "device":
        problem = skel.ifname_problem(value)
        if problem:
            raise ConfigError(f"device: {f.show(value)} {problem}")
        return _by_name(field, value, value, fs)
    if field == "hwaddr":
        return _by_mac(value, fs)
    if field == "kernelpath":
        if not value.startswith("/sys/devices/") or ".." in value.split("/"):
            raise ConfigError(f'kernelpath: "{value}" must be an absolute path under /sys/devices/')
        directory = fs.kernel_dir(value)
        if not os.path.isdir(directory):
            raise ConfigError(f'kernelpath: "{value}": no such device under {fs.top}')
        base = os.path.basename(value.rstrip("/"))
        return _by_dir(field, value, directory, base if sysfs.PCI_RE.match(base) else "", fs)
    return _by_id(field, value, fs)


def add(req: Request) -> Result:
    common.setup_logging(req.conf, "host-device")
    conf = DeviceConf.from_request(req)
    return attach.add(req, "host-device", conf, target(req), None)


def delete(req: Request) -> None:
    common.setup_logging(req.conf, "host-device")
    release.delete(req, DeviceConf.from_request(req))


def check(req: Request) -> None:
    common.setup_logging(req.conf, "host-device")
    attach.check(req, DeviceConf.from_request(req))


def status(req: Request) -> None:
    attach.status(req, DeviceConf.from_request(req))


def gc(req: Request) -> None:
    release.gc(req, "host-device", DeviceConf.from_request(req))
