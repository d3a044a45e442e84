"""Where sriov and host-device take the allocated device from (cni.device.sources): the order of the
sources, agreement between them, a disagreement refused naming both, and the device-info file
(k8snetworkplumbingwg device-info spec 1.1.0) absent, of another type, unreadable or malformed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni.device import sources
from cni.errors import CniError
from cni.types.netconf import Request

VF = "0000:af:06.1"
OTHER = "0000:af:06.2"
AUX = "mlx5_core.sf.4"


def req(**conf: Any) -> Request:
    return Request("ADD", "1.0.0", {"cniVersion": "1.0.0", "name": "n", "type": "sriov", **conf}, b"")


def named(**conf: Any) -> tuple[str, str] | None:
    found = sources.device_id(req(**conf))
    return None if found is None else (found.field, found.value)


def refused(**conf: Any) -> str:
    with pytest.raises(CniError) as info:
        sources.device_id(req(**conf))
    assert info.value.code == 7
    return info.value.msg


def info_file(tmp_path: Path, content: Any, name: str = "devinfo") -> str:
    """A CNI device-info file as Multus leaves it: a copy of the device plugin's (multus-cni
    pkg/multus/multus.go CmdAdd: nadutils.CopyDeviceInfoForCNIFromDP)."""
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def pci_info(address: str) -> dict[str, Any]:
    """What dra-driver-sriov writes in Multus mode (pkg/devicestate/deviceinfo.go
    saveDeviceInfoForPreparedDevice: type pci, version 1.1.0, pci-address, rdma-device if any)."""
    return {"type": "pci", "version": "1.1.0", "pci": {"pci-address": address, "rdma-device": "mlx5_3"}}


def test_no_source_names_nothing() -> None:
    assert named() is None
    assert named(deviceID="", pciBusID="", runtimeConfig={"deviceID": ""}) is None


@pytest.mark.parametrize(("conf", "field"), [
    ({"runtimeConfig": {"deviceID": VF}}, "runtimeConfig.deviceID"),
    ({"deviceID": VF}, "deviceID"),
    ({"pciBusID": VF}, "pciBusID"),
    # in the documented order: the first source that names the device is the one messages name
    ({"deviceID": VF, "pciBusID": VF, "runtimeConfig": {"deviceID": VF}}, "runtimeConfig.deviceID"),
    ({"deviceID": VF, "pciBusID": VF}, "deviceID"),
])
def test_each_source_and_the_order(conf: dict[str, Any], field: str) -> None:
    assert named(**conf) == (field, VF)


def test_sources_that_agree_once_normalised() -> None:
    assert named(deviceID="0000:AF:06.1", pciBusID="af:06.1", runtimeConfig={"deviceID": VF}) == (
        "runtimeConfig.deviceID", VF)
    assert named(deviceID=AUX, pciBusID=AUX, runtimeConfig={"deviceID": AUX}) == (
        "runtimeConfig.deviceID", AUX)


@pytest.mark.parametrize(("conf", "message"), [
    ({"deviceID": VF, "pciBusID": OTHER},
     f'pciBusID: "{OTHER}" disagrees with deviceID "{VF}": '
     "every source of the device must name the same one"),
    ({"runtimeConfig": {"deviceID": VF}, "deviceID": OTHER},
     f'deviceID: "{OTHER}" disagrees with runtimeConfig.deviceID "{VF}"'),
    ({"runtimeConfig": {"deviceID": AUX}, "pciBusID": VF},
     f'pciBusID: "{VF}" disagrees with runtimeConfig.deviceID "{AUX}"'),
    ({"runtimeConfig": {"deviceID": VF}, "deviceID": VF, "pciBusID": OTHER},
     f'pciBusID: "{OTHER}" disagrees with runtimeConfig.deviceID "{VF}"'),
])
def test_a_disagreement_is_refused_naming_both(conf: dict[str, Any], message: str) -> None:
    assert refused(**conf).startswith(message)


@pytest.mark.parametrize(("conf", "path"), [
    ({"deviceID": 3}, "deviceID"),
    ({"runtimeConfig": {"deviceID": []}}, "runtimeConfig.deviceID"),
    ({"pciBusID": {}}, "pciBusID"),
    ({"runtimeConfig": {"CNIDeviceInfoFile": 7}}, "runtimeConfig.CNIDeviceInfoFile"),
])
def test_type_errors_name_the_field(conf: dict[str, Any], path: str) -> None:
    assert refused(**conf).startswith(f"{path}: must be a string")


def test_the_device_info_file_alone_and_agreeing(tmp_path: Path) -> None:
    path = info_file(tmp_path, pci_info(VF))
    assert named(runtimeConfig={"CNIDeviceInfoFile": path}) == ("runtimeConfig.CNIDeviceInfoFile", VF)
    # Multus with its DRA client: deviceID and pciBusID in the plugin, both capabilities in runtimeConfig
    conf = {"deviceID": VF, "pciBusID": VF, "runtimeConfig": {"deviceID": VF, "CNIDeviceInfoFile": path}}
    assert named(**conf) == ("runtimeConfig.deviceID", VF)
    upper = info_file(tmp_path, pci_info(VF.upper()), "upper")
    assert named(deviceID=VF, runtimeConfig={"CNIDeviceInfoFile": upper}) == ("deviceID", VF)


def test_the_device_info_file_disagreeing(tmp_path: Path) -> None:
    path = info_file(tmp_path, pci_info(OTHER))
    msg = refused(deviceID=VF, pciBusID=VF, runtimeConfig={"CNIDeviceInfoFile": path})
    assert msg.startswith(f'runtimeConfig.CNIDeviceInfoFile: "{OTHER}" disagrees with deviceID "{VF}"'), msg


def test_vdpa_with_and_without_a_pci_address(tmp_path: Path) -> None:
    vdpa = {"type": "vdpa", "version": "1.1.0",
            "vdpa": {"parent-device": "vdpa2", "driver": "vhost", "path": "/dev/vhost-vdpa0"}}
    path = info_file(tmp_path, vdpa, "plain")
    assert named(runtimeConfig={"CNIDeviceInfoFile": path}) is None
    vdpa["vdpa"]["pci-address"] = VF
    path = info_file(tmp_path, vdpa, "pci")
    assert named(runtimeConfig={"CNIDeviceInfoFile": path}) == ("runtimeConfig.CNIDeviceInfoFile", VF)


def test_types_without_a_pci_device_name_nothing(tmp_path: Path) -> None:
    vhost = {"type": "vhost-user", "version": "1.1.0", "vhost-user": {"mode": "server", "path": "/x.sock"}}
    path = info_file(tmp_path, vhost)
    assert named(runtimeConfig={"CNIDeviceInfoFile": path}) is None
    assert named(deviceID=VF, runtimeConfig={"CNIDeviceInfoFile": path}) == ("deviceID", VF)


def test_an_absent_file_names_nothing(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """No device plugin file for this attachment (or none this process can see): not an error."""
    path = str(tmp_path / "absent")
    assert named(runtimeConfig={"CNIDeviceInfoFile": path}) is None
    assert named(deviceID=VF, runtimeConfig={"CNIDeviceInfoFile": path}) == ("deviceID", VF)
    assert "warning" not in capfd.readouterr().err


def test_the_device_info_file_alone_naming_nothing_is_what_the_plugins_error_names(tmp_path: Path) -> None:
    """Issue 45: runtimeConfig.CNIDeviceInfoFile the only source given, and the file absent (or of a
    type without a PCI device): sriov and host-device name the file they looked for and what they found
    there, not a field the user never set; with no source at all, their own messages."""
    from cni.plugins import hostdevice
    from cni.plugins.sriov import SriovConf

    def sriov(**conf: Any) -> str:
        with pytest.raises(CniError) as info:
            SriovConf.from_request(req(**conf))
        assert info.value.code == 7
        return info.value.msg

    def host_device(**conf: Any) -> str:
        with pytest.raises(CniError) as info:
            hostdevice.selector(req(**conf))
        assert info.value.code == 7
        return info.value.msg

    absent = str(tmp_path / "absent")
    vhost = info_file(tmp_path, {"type": "vhost-user", "version": "1.1.0", "vhost-user": {"path": "/x.sock"}})
    for path, found in ((absent, "no such file"), (vhost, 'its type "vhost-user" names no PCI device')):
        given = {"runtimeConfig": {"CNIDeviceInfoFile": path}}
        file = f'runtimeConfig.CNIDeviceInfoFile: "{path}": {found}, and no other field names the device'
        assert sriov(**given) == f"{file} (runtimeConfig.deviceID, deviceID or pciBusID)"
        assert host_device(**given) == (
            f"{file} (device, hwaddr, kernelpath, runtimeConfig.deviceID, deviceID or pciBusID)")
    assert sriov().startswith("deviceID: required (the VF's PCI address")
    assert host_device().startswith("specify one of device, hwaddr, kernelpath, pciBusID or deviceID")


def test_an_auxiliary_id_is_not_compared_with_the_files_pci_address(tmp_path: Path) -> None:
    path = info_file(tmp_path, pci_info(VF))
    assert named(runtimeConfig={"deviceID": AUX, "CNIDeviceInfoFile": path}) == (
        "runtimeConfig.deviceID", AUX)


UNUSABLE = [
    ("not json", "{", "not a JSON device-info object"),
    ("a list", "[1]", "not a JSON device-info object"),
    ("no type", {"version": "1.1.0", "pci": {"pci-address": VF}}, 'no "type"'),
    ("pci without its object", {"type": "pci", "version": "1.1.0"}, 'type "pci" without a "pci" object'),
    ("pci without an address", {"type": "pci", "pci": {}}, "pci.pci-address: None is not a PCI address"),
    ("a bad address", {"type": "pci", "pci": {"pci-address": "eth0"}}, 'pci.pci-address: "eth0" is not'),
    ("too large", " " * (sources.MAX_INFO_BYTES + 1), "larger than 65536 bytes"),
]


@pytest.mark.parametrize(("content", "problem"), [u[1:] for u in UNUSABLE], ids=[u[0] for u in UNUSABLE])
def test_an_unusable_file(tmp_path: Path, capfd: pytest.CaptureFixture[str], content: Any,
                          problem: str) -> None:
    """Alone it is code 7 naming the file and the problem; with another source, a warning and the
    other source decides (sriov-cni never reads the file: a broken one must not fail what works)."""
    path = info_file(tmp_path, content)
    msg = refused(runtimeConfig={"CNIDeviceInfoFile": path})
    assert msg.startswith(f'runtimeConfig.CNIDeviceInfoFile: "{path}": {problem}'), msg
    assert named(pciBusID=VF, runtimeConfig={"CNIDeviceInfoFile": path}) == ("pciBusID", VF)
    err = capfd.readouterr().err
    assert "warning: runtimeConfig.CNIDeviceInfoFile" in err and 'the device comes from pciBusID "' in err


def test_the_whole_path_is_named(tmp_path: Path) -> None:
    long = tmp_path / ("x" * 200)
    long.write_text("{")
    assert refused(runtimeConfig={"CNIDeviceInfoFile": str(long)}) == (
        f'runtimeConfig.CNIDeviceInfoFile: "{long}": not a JSON device-info object')
    assert len(refused(runtimeConfig={"CNIDeviceInfoFile": "/" + "y" * 5000})) < 200


def test_unreadable_and_relative_paths(tmp_path: Path) -> None:
    directory = str(tmp_path)
    assert refused(runtimeConfig={"CNIDeviceInfoFile": directory}) == (
        f'runtimeConfig.CNIDeviceInfoFile: "{directory}": not a regular file')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would hang the call
    assert refused(runtimeConfig={"CNIDeviceInfoFile": str(fifo)}) == (
        f'runtimeConfig.CNIDeviceInfoFile: "{fifo}": not a regular file')
    looping = tmp_path / "loop"
    looping.symlink_to(looping)
    assert refused(runtimeConfig={"CNIDeviceInfoFile": str(looping)}).startswith(
        f'runtimeConfig.CNIDeviceInfoFile: "{looping}": cannot read it: Too many levels of symbolic links')
    assert refused(runtimeConfig={"CNIDeviceInfoFile": "devinfo/x"}) == (
        'runtimeConfig.CNIDeviceInfoFile: "devinfo/x" is not an absolute path')
    assert refused(runtimeConfig={"CNIDeviceInfoFile": "/run/a\0b"}).endswith("holds a NUL byte")
    assert named(deviceID=VF, runtimeConfig={"CNIDeviceInfoFile": directory}) == ("deviceID", VF)


@pytest.mark.parametrize(("conf", "expected"), [
    ({"device": "ens1f0", "hwaddr": "02:00:00:00:00:01", "kernelpath": "/sys/devices/x", "deviceID": VF},
     ("device", "ens1f0")),
    ({"hwaddr": "02:00:00:00:00:01", "kernelpath": "/sys/devices/x", "deviceID": VF},
     ("hwaddr", "02:00:00:00:00:01")),
    ({"kernelpath": "/sys/devices/x", "deviceID": VF}, ("kernelpath", "/sys/devices/x")),
    # a named selector decides alone: the id sources (even disagreeing ones) are not consulted
    ({"device": "ens1f0", "deviceID": VF, "pciBusID": OTHER}, ("device", "ens1f0")),
    ({"device": "", "pciBusID": VF, "runtimeConfig": {"deviceID": VF}}, ("runtimeConfig.deviceID", VF)),
    ({"runtimeConfig": {"deviceID": AUX}, "deviceID": AUX, "pciBusID": AUX}, ("runtimeConfig.deviceID", AUX)),
])
def test_host_device_precedence(conf: dict[str, Any], expected: tuple[str, str]) -> None:
    from cni.plugins import hostdevice

    assert hostdevice.selector(req(**conf)) == expected


def test_host_device_without_a_selector_or_with_disagreeing_ids() -> None:
    from cni.plugins import hostdevice

    with pytest.raises(CniError) as info:
        hostdevice.selector(req())
    assert info.value.code == 7 and info.value.msg.startswith("specify one of device, hwaddr, kernelpath")
    with pytest.raises(CniError) as info:
        hostdevice.selector(req(deviceID=VF, pciBusID=OTHER))
    assert info.value.code == 7 and info.value.msg.startswith(f'pciBusID: "{OTHER}" disagrees with deviceID')
