"""sriov configuration: sriov-cni's validation rules, each error naming the field (code 7)."""

from __future__ import annotations

from typing import Any

import pytest

from cni.errors import CniError
from cni.plugins.sriov import SriovConf
from cni.sriov.vf import Setting
from cni.types.args import parse as parse_args
from cni.types.netconf import Request

VF = "0000:af:06.1"


def conf(cni_args: str = "", **fields: Any) -> SriovConf:
    c = {"cniVersion": "1.0.0", "name": "n", "type": "sriov", "deviceID": VF, **fields}
    c = {k: v for k, v in c.items() if v is not None}
    return SriovConf.from_request(Request("ADD", "1.0.0", c, b"", args=parse_args(cni_args)))


def error(**fields: Any) -> str:
    with pytest.raises(CniError) as info:
        conf(**fields)
    assert info.value.code == 7
    return info.value.msg


def test_device_id_required_and_checked() -> None:
    assert error(deviceID=None) .startswith("deviceID: required")
    assert error(deviceID="eth0") == 'deviceID: "eth0" is not a PCI address (like 0000:af:06.0)'
    assert conf(deviceID="0000:AF:06.1").device_id == VF
    assert conf(deviceID="af:06.1").device_id == VF


def test_device_id_sources() -> None:
    c = conf(deviceID=None, pciBusID="0000:af:06.2")
    assert (c.device_id, c.device_field) == ("0000:af:06.2", "pciBusID")
    c = conf(deviceID=None, runtimeConfig={"deviceID": "0000:af:06.3"})
    assert (c.device_id, c.device_field) == ("0000:af:06.3", "runtimeConfig.deviceID")
    c = conf(pciBusID=VF, runtimeConfig={"deviceID": VF})  # Multus: the same device in every channel
    assert (c.device_id, c.device_field) == (VF, "runtimeConfig.deviceID")
    assert error(runtimeConfig={"deviceID": "0000:af:06.3"}).startswith(
        f'deviceID: "{VF}" disagrees with runtimeConfig.deviceID "0000:af:06.3"')


def test_mtu() -> None:
    assert conf().device.mtu == 0
    assert conf(mtu=9000).device.mtu == 9000
    assert conf(mtu=0).device.mtu == 0
    assert error(mtu=67) == "mtu: 67 out of range [68, 65535] (0 or absent: the device's own)"
    assert error(mtu="1500") == 'mtu: must be an integer, got "1500"'


@pytest.mark.parametrize(("fields", "message"), [
    ({"vlan": 4095}, "vlan: 4095 out of range [0, 4094]"),
    ({"vlan": -1}, "vlan: -1 out of range [0, 4094]"),
    ({"vlan": "10"}, 'vlan: must be an integer, got "10"'),
    ({"vlanQoS": 3}, "vlanQoS: set without vlan"),
    ({"vlanProto": "802.1q"}, "vlanProto: set without vlan"),
    ({"vlan": 10, "vlanQoS": 8}, "vlanQoS: 8 out of range [0, 7]"),
    ({"vlan": 0, "vlanQoS": 2}, "vlanQoS: 2 needs a non-zero vlan"),
    ({"vlan": 0, "vlanProto": "802.1ad"}, "vlanProto: 802.1ad needs a non-zero vlan"),
    ({"vlan": 10, "vlanProto": "qinq"}, 'vlanProto: unknown value "qinq" (expected 802.1q or 802.1ad)'),
    ({"spoofchk": "yes"}, 'spoofchk: unknown value "yes" (expected one of on, off)'),
    ({"trust": "enabled"}, 'trust: unknown value "enabled" (expected one of on, off)'),
    ({"link_state": "up"}, 'link_state: unknown value "up" (expected one of auto, enable, disable)'),
    ({"min_tx_rate": 500, "max_tx_rate": 100}, "min_tx_rate: 500 is above max_tx_rate 100"),
    ({"max_tx_rate": -5}, "max_tx_rate: -5 out of range [0, 4294967295]"),
    ({"mac": "02:00:00:00:00"}, 'mac: not a MAC address: "02:00:00:00:00"'),
    ({"mac": "03:00:00:00:00:01"}, "mac: 03:00:00:00:00:01 is a multicast MAC address"),
    ({"stateDir": "relative/dir"}, 'stateDir: "relative/dir" is not an absolute path'),
])
def test_rejected(fields: dict[str, Any], message: str) -> None:
    assert error(**fields) == message


def test_plan_in_apply_order_and_defaults() -> None:
    c = conf(link_state="disable", trust="on", spoofchk="off", max_tx_rate=1000, vlan=100,
             vlanProto="802.1AD", mac="02:AA:bb:cc:dd:ee")
    assert c.plan == (
        Setting("vlan", (100, 0, "802.1ad")),
        Setting("mac", ("02:aa:bb:cc:dd:ee",)),
        Setting("rate", (0, 1000)),
        Setting("spoofchk", (0,)),
        Setting("trust", (1,)),
        Setting("link_state", (2,)),
    )
    assert conf().plan == ()
    assert conf(vlan=0).plan == (Setting("vlan", (0, 0, "802.1q")),)


def test_mac_precedence() -> None:
    assert conf(mac="02:00:00:00:00:01").mac == "02:00:00:00:00:01"
    c = conf("IgnoreUnknown=true;MAC=02:00:00:00:00:02", mac="02:00:00:00:00:01")
    assert c.mac == "02:00:00:00:00:02"
    c = conf("MAC=02:00:00:00:00:02", runtimeConfig={"mac": "02:00:00:00:00:03"})
    assert c.mac == "02:00:00:00:00:03"
    assert c.plan == (Setting("mac", ("02:00:00:00:00:03",)),)
