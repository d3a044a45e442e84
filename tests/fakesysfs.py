"""Build a sysfs tree with the real kernel layout (relative symlinks, so a copy works as well) for
PYCNI_SYSFS_ROOT: SR-IOV PFs with VFs (physfn/virtfnN links, sriov_numvfs, net/ entries, driver
links), plain PCI NICs, and auxiliary devices. Netdev names are whatever the test passes, typically
veth ends in a test namespace that stand in for the VF netdevs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

BUS = "pci0000:00"


@dataclass
class VF:
    pci: str
    netdev: str = ""  # "" with a userspace driver
    driver: str = "iavf"


@dataclass
class PF:
    pci: str
    netdev: str
    vfs: list[VF] = field(default_factory=list)
    driver: str = "ice"
    totalvfs: int = 8


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "bus" / "pci" / "devices").mkdir(parents=True, exist_ok=True)
        (root / "class" / "net").mkdir(parents=True, exist_ok=True)

    def device(self, pci: str, driver: str | None, netdev: str = "", vendor: str = "0x8086") -> Path:
        d = self.root / "devices" / BUS / pci
        d.mkdir(parents=True)
        _write(d / "vendor", vendor)
        _write(d / "class", "0x020000")
        _link(self.root / "bus" / "pci" / "devices" / pci, f"../../../devices/{BUS}/{pci}")
        if driver:
            self.bind(pci, driver)
        if netdev:
            self.netdev(d, netdev)
        return d

    def bind(self, pci: str, driver: str) -> None:
        d = self.root / "devices" / BUS / pci
        drv = self.root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        if (d / "driver").is_symlink():
            os.unlink(d / "driver")
        _link(d / "driver", f"../../../bus/pci/drivers/{driver}")
        if not (drv / pci).is_symlink():
            _link(drv / pci, f"../../../../devices/{BUS}/{pci}")

    def netdev(self, device_dir: Path, name: str) -> None:
        net = device_dir / "net" / name
        net.mkdir(parents=True)
        # as the kernel writes it: ../../../<device> (up to the bus, down to the device by name)
        _link(net / "device", os.path.join(os.path.relpath(device_dir.parent, net), device_dir.name))
        _link(self.root / "class" / "net" / name, os.path.relpath(net, self.root / "class" / "net"))

    def pf(self, pf: PF) -> None:
        d = self.device(pf.pci, pf.driver, pf.netdev)
        _write(d / "sriov_totalvfs", str(pf.totalvfs))
        _write(d / "sriov_numvfs", str(len(pf.vfs)))
        for n, vf in enumerate(pf.vfs):
            self.device(vf.pci, vf.driver, vf.netdev)
            _link(d / f"virtfn{n}", f"../{vf.pci}")
            _link(self.root / "devices" / BUS / vf.pci / "physfn", f"../{pf.pci}")

    def auxiliary(self, parent_pci: str, ident: str, netdev: str) -> None:
        d = self.root / "devices" / BUS / parent_pci / ident
        d.mkdir(parents=True)
        self.netdev(d, netdev)
        target = f"../../../devices/{BUS}/{parent_pci}/{ident}"
        _link(self.root / "bus" / "auxiliary" / "devices" / ident, target)


def build(root: Path, pfs: list[PF], nics: tuple[tuple[str, str, str], ...] = ()) -> Tree:
    """PFs with their VFs, and plain NICs given as (pci, netdev, driver)."""
    tree = Tree(root)
    for pf in pfs:
        tree.pf(pf)
    for pci, netdev, driver in nics:
        tree.device(pci, driver, netdev)
    return tree
