"""PCI and SR-IOV facts from sysfs, read with the real kernel layout under a root that defaults to
/sys and comes from PYCNI_SYSFS_ROOT in the process environment (the plugin's, or the agent's: never a
request's), so tests and users can point it at a copy of a node's tree.

  <root>/bus/pci/devices/<pci>            -> ../../../devices/pci0000:00/<pci>
  <root>/bus/pci/devices/<vf>/physfn      -> ../<pf>                  (a VF)
  <root>/bus/pci/devices/<pf>/virtfnN     -> ../<vf>                  (N < sriov_numvfs)
  <root>/bus/pci/devices/<pci>/net/<name>/                            (its netdevs)
  <root>/bus/pci/devices/<pci>/driver     -> .../bus/pci/drivers/<driver>
  <root>/bus/auxiliary/devices/<id>/net/<name>/                      (sub-functions)
  <root>/class/net/<name>/device          -> the PCI device of a netdev
"""

from __future__ import annotations

import os
import re

ENV = "PYCNI_SYSFS_ROOT"
USERSPACE_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")
PCI_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def root() -> str:
    """The sysfs root of this process: not a CNI request's, which the agent carries from its caller."""
    return os.environ.get(ENV) or "/sys"


def normalize_pci(value: str) -> str | None:
    """'0000:AF:06.0' -> '0000:af:06.0'; a short 'af:06.0' gets domain 0000; None if malformed."""
    text = value.strip().lower()
    if re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", text):
        text = "0000:" + text
    return text if PCI_RE.match(text) else None


class Sysfs:
    """Read-only views of one sysfs tree."""

    def __init__(self, top: str) -> None:
        self.top = top.rstrip("/") or "/"

    def path(self, *parts: str) -> str:
        return os.path.join(self.top, *parts)

    def pci(self, addr: str, *parts: str) -> str:
        return self.path("bus", "pci", "devices", addr, *parts)

    def pci_exists(self, addr: str) -> bool:
        return os.path.isdir(self.pci(addr))

    def aux_exists(self, ident: str) -> bool:
        return os.path.isdir(self.path("bus", "auxiliary", "devices", ident))

    def _link_name(self, path: str) -> str | None:
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    def driver(self, addr: str) -> str | None:
        """The bound driver's name; None when the device is unbound."""
        return self._link_name(self.pci(addr, "driver"))

    def physfn(self, vf: str) -> str | None:
        """The PF's PCI address of a VF; None when `vf` is not a VF."""
        return self._link_name(self.pci(vf, "physfn"))

    def numvfs(self, pf: str) -> int:
        try:
            with open(self.pci(pf, "sriov_numvfs")) as fh:
                return int(fh.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def vf_index(self, pf: str, vf: str) -> int | None:
        """N where <pf>/virtfnN points at `vf`, scanning the enabled VFs."""
        for n in range(self.numvfs(pf)):
            if self._link_name(self.pci(pf, f"virtfn{n}")) == vf:
                return n
        return None

    def netdevs_in(self, device_dir: str) -> list[str]:
        """Netdev names under <device_dir>/net (virtio: <device_dir>/virtio*/net), sorted."""
        for net in (os.path.join(device_dir, "net"), *self._virtio_nets(device_dir)):
            try:
                names = sorted(os.listdir(net))
            except OSError:
                continue
            if names:
                return names
        return []

    def _virtio_nets(self, device_dir: str) -> list[str]:
        try:
            subdirs = sorted(d for d in os.listdir(device_dir) if d.startswith("virtio"))
        except OSError:
            return []
        return [os.path.join(device_dir, d, "net") for d in subdirs]

    def pci_netdevs(self, addr: str) -> list[str]:
        return self.netdevs_in(self.pci(addr))

    def aux_netdevs(self, ident: str) -> list[str]:
        return self.netdevs_in(self.path("bus", "auxiliary", "devices", ident))

    def pci_of_netdev(self, name: str) -> str | None:
        """The PCI address behind a netdev (class/net/<name>/device), if it is a PCI device."""
        addr = self._link_name(self.path("class", "net", name, "device"))
        return addr if addr and PCI_RE.match(addr) else None

    def kernel_dir(self, kernelpath: str) -> str:
        """A /sys/devices/... path given by a user, mapped under this root."""
        return self.path(kernelpath[len("/sys/") :])


def open_sysfs() -> Sysfs:
    return Sysfs(root())
