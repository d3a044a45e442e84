"""sysfs resolution against a fake tree with the kernel's layout, and against a copy of it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cni.errors import CniError
from cni.plugins import hostdevice
from cni.plugins.sriov import SriovConf, resolve
from cni.sriov import sysfs
from cni.types.netconf import Request
from tests import fakesysfs

PF = "0000:af:00.1"
VFS = [fakesysfs.VF("0000:af:06.0", "ens1f0v0"), fakesysfs.VF("0000:af:06.1", "ens1f0v1"),
       fakesysfs.VF("0000:af:06.2", "", "vfio-pci"), fakesysfs.VF("0000:af:06.3", "", "")]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    fakesysfs.build(root, [fakesysfs.PF(PF, "ens1f0", VFS)], (("0000:3b:00.0", "eno1", "mlx5_core"),))
    return root


def vf_of(root: Path, device: str) -> object:
    req = Request("ADD", "1.0.0", {"name": "n", "type": "sriov", "deviceID": device}, b"")
    return resolve(SriovConf.from_request(req), sysfs.Sysfs(str(root)))


def test_vf_resolution(tree: Path) -> None:
    got = vf_of(tree, "0000:af:06.1")
    assert (got.pf, got.index, got.netdev, got.driver) == ("ens1f0", 1, "ens1f0v1", "iavf")  # type: ignore[attr-defined]
    dpdk = vf_of(tree, "0000:af:06.2")
    assert (dpdk.index, dpdk.netdev, dpdk.driver) == (2, "", "vfio-pci")  # type: ignore[attr-defined]


def test_a_copy_of_the_tree_resolves_the_same(tree: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy, symlinks=True)
    shutil.rmtree(tree)
    assert vf_of(copy, "0000:af:06.1").netdev == "ens1f0v1"  # type: ignore[attr-defined]


@pytest.mark.parametrize(("device", "message"), [
    ("0000:af:07.0", 'deviceID: "0000:af:07.0": no such PCI device under'),
    ("0000:3b:00.0", 'deviceID: "0000:3b:00.0" is not an SR-IOV VF (no physfn link)'),
    ("0000:af:06.3", 'deviceID: VF "0000:af:06.3" has no network interface and driver "none"'),
])
def test_resolution_errors(tree: Path, device: str, message: str) -> None:
    with pytest.raises(CniError) as info:
        vf_of(tree, device)
    assert info.value.code == 7 and info.value.msg.startswith(message)


def test_vf_beyond_sriov_numvfs_is_not_enabled(tree: Path) -> None:
    (tree / "bus/pci/devices" / PF / "sriov_numvfs").write_text("1\n")
    with pytest.raises(CniError, match="is not among the enabled VFs of PF ens1f0"):
        vf_of(tree, "0000:af:06.1")


def test_sysfs_reads(tree: Path) -> None:
    fs = sysfs.Sysfs(str(tree))
    assert fs.physfn("0000:af:06.0") == PF and fs.physfn(PF) is None
    assert fs.numvfs(PF) == 4 and fs.vf_index(PF, "0000:af:06.3") == 3
    assert fs.pci_of_netdev("ens1f0v0") == "0000:af:06.0"
    assert fs.pci_of_netdev("missing") is None
    assert fs.driver("0000:3b:00.0") == "mlx5_core"
    nic = fs.kernel_dir("/sys/devices/pci0000:00/0000:3b:00.0")
    assert nic == str(tree / "devices/pci0000:00/0000:3b:00.0")
    assert fs.netdevs_in(nic) == ["eno1"]


def test_virtio_netdevs_are_found(tmp_path: Path) -> None:
    net = tmp_path / "dev" / "virtio3" / "net" / "ens3"
    net.mkdir(parents=True)
    assert sysfs.Sysfs(str(tmp_path)).netdevs_in(str(tmp_path / "dev")) == ["ens3"]


def test_root_and_pci_normalisation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sysfs.ENV, raising=False)
    assert sysfs.root() == "/sys"
    monkeypatch.setenv(sysfs.ENV, "/tmp/x")
    assert sysfs.root() == "/tmp/x"
    assert sysfs.normalize_pci("0000:AF:06.1") == "0000:af:06.1"
    assert sysfs.normalize_pci("af:06.1") == "0000:af:06.1"
    assert sysfs.normalize_pci("0000:af:06.8") is None
    assert sysfs.normalize_pci("mlx5_core.sf.4") is None


def test_the_root_is_the_processs_never_the_requests(tree: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """PYCNI_SYSFS_ROOT in a request's environment (what the agent carries from its caller) chooses
    nothing: the device is looked up under the process's root."""
    empty = tmp_path / "empty"
    (empty / "bus" / "pci" / "devices").mkdir(parents=True)
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "host-device", "pciBusID": "0000:3b:00.0"}
    req = Request("ADD", "1.0.0", conf, b"", env={sysfs.ENV: str(tree)})
    monkeypatch.setenv(sysfs.ENV, str(empty))
    with pytest.raises(CniError, match=f"no such PCI or auxiliary device under {empty}/bus"):
        hostdevice.target(req)
    monkeypatch.setenv(sysfs.ENV, str(tree))
    assert hostdevice.target(Request("ADD", "1.0.0", conf, b"", env={sysfs.ENV: str(empty)})).netdev == "eno1"
