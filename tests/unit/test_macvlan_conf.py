"""MacvlanConf parsing: defaults, and an error naming the field and the bad value for every field."""

from __future__ import annotations

from typing import Any

import pytest

from cni import jsonio
from cni.errors import ConfigError
from cni.plugins.macvlan import MacvlanConf
from cni.types.args import parse as parse_args
from cni.types.netconf import Request


def parse(cni_args: str = "", **fields: Any) -> MacvlanConf:
    c = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan", **fields}
    return MacvlanConf.from_request(Request("ADD", "1.0.0", c, jsonio.dumps(c), args=parse_args(cni_args)))


def test_defaults() -> None:
    c = parse()
    assert (c.master, c.mode, c.mtu, c.mac, c.link_in_container, c.bcqueuelen, c.dad) == (
        "",
        "bridge",
        0,
        None,
        False,
        0,
        "on",
    )
    assert c.ipam is None and not c.dns


def test_every_field() -> None:
    c = parse(
        master="uplink0",
        mode="passthru",
        mtu=9000,
        mac="02:00:5E:00:53:01",
        linkInContainer=True,
        bcqueuelen=1000,
        dad="optimistic",
        dns={"nameservers": ["198.51.100.53"]},
        ipam={"type": "host-local", "subnet": "198.51.100.0/24"},
    )
    assert (c.master, c.mode, c.mtu, c.mac, c.link_in_container, c.bcqueuelen, c.dad) == (
        "uplink0",
        "passthru",
        9000,
        "02:00:5e:00:53:01",
        True,
        1000,
        "optimistic",
    )
    assert c.dns.nameservers == ("198.51.100.53",)
    assert c.ipam == {"type": "host-local", "subnet": "198.51.100.0/24"}


@pytest.mark.parametrize("mode", ["bridge", "private", "vepa", "passthru"])
def test_modes(mode: str) -> None:
    assert parse(mode=mode).mode == mode


@pytest.mark.parametrize("mode", ["", None])
def test_empty_mode_is_bridge(mode: Any) -> None:
    assert parse(mode=mode).mode == "bridge"


@pytest.mark.parametrize(("mtu", "expected"), [(68, 68), (1500, 1500), (65535, 65535), (0, 0), (None, 0)])
def test_mtu_accepted(mtu: Any, expected: int) -> None:
    assert parse(mtu=mtu).mtu == expected


def test_mac_from_cni_args_and_runtime_config() -> None:
    assert parse("MAC=02:00:5e:00:53:02", mac="02:00:5e:00:53:01").mac == "02:00:5e:00:53:02"
    assert (
        parse(mac="02:00:5e:00:53:01", runtimeConfig={"mac": "02:00:5e:00:53:04"}).mac == "02:00:5e:00:53:04"
    )


@pytest.mark.parametrize("blank", ["", None])
def test_blank_mac_means_none(blank: Any) -> None:
    assert parse(mac=blank).mac is None


BAD = [
    # (field, value, start of message, text that must appear)
    ("master", 5, "master: must be a string", "5"),
    ("master", ["eth0"], "master: must be a string", "['eth0']"),
    ("mode", "Bridge", 'mode: unknown value "Bridge"', "bridge, private, vepa, passthru"),
    ("mode", "source", 'mode: unknown value "source"', "passthru"),
    ("mode", 1, "mode: must be a string", "1"),
    ("mtu", "1500", "mtu: must be an integer", '"1500"'),
    ("mtu", 1500.0, "mtu: must be an integer", "1500.0"),
    ("mtu", True, "mtu: must be an integer", "True"),
    ("mtu", -1, "mtu: -1 out of range", "between 68 and the master's MTU"),
    ("mtu", 65536, "mtu: 65536 out of range", "between 68 and the master's MTU"),
    ("mtu", 99999, "mtu: 99999 out of range", "must be between 68 and the master's MTU"),
    ("mtu", 67, "mtu: 67 out of range", "between 68 and the master's MTU"),
    ("mtu", 1, "mtu: 1 out of range", "between 68 and the master's MTU"),
    ("mac", "02:00:5e:00:53", "mac: not a MAC address", '"02:00:5e:00:53"'),
    ("mac", "02:00:5e:00:53:01:02", "mac: not a MAC address", "02:00:5e:00:53:01:02"),
    ("mac", "02:00:5e:00:53:0g", "mac: not a MAC address", "0g"),
    ("mac", "02:00-5e:00:53:01", "mac: not a MAC address", "02:00-5e"),
    ("mac", "02:00:5e:00:53:01\n", "mac: not a MAC address", "02:00:5e:00:53:01"),
    ("mac", "0200.5e00.5301", "mac: not a MAC address", "0200.5e00.5301"),
    ("mac", "01:00:5e:00:53:01", "mac: 01:00:5e:00:53:01 is a multicast", "multicast"),
    ("mac", "33:33:00:00:00:01", "mac: 33:33:00:00:00:01 is a multicast", "multicast"),
    ("mac", "ff:ff:ff:ff:ff:ff", "mac: ff:ff:ff:ff:ff:ff is a multicast", "multicast"),
    ("mac", "00:00:00:00:00:00", "mac: 00:00:00:00:00:00 is all zeros", "zeros"),
    ("mac", 5, "mac: must be a string", "5"),
    ("mac", 0, "mac: must be a string", "0"),
    ("mac", False, "mac: must be a string", "False"),
    ("mac", [], "mac: must be a string", "[]"),
    ("bcqueuelen", -1, "bcqueuelen: -1 out of range", "4294967295"),
    ("bcqueuelen", 2**32, "bcqueuelen: 4294967296 out of range", "4294967295"),
    ("bcqueuelen", "100", "bcqueuelen: must be an integer", '"100"'),
    ("linkInContainer", "true", "linkInContainer: must be a boolean", '"true"'),
    ("linkInContainer", 1, "linkInContainer: must be a boolean", "1"),
    ("dad", "yes", 'dad: unknown value "yes"', "on, optimistic, off"),
    ("dad", False, "dad: must be a string", "False"),
    ("dns", [], "dns: must be an object", "[]"),
    ("ipam", "host-local", "ipam: must be an object", '"host-local"'),
    ("ipam", {"type": 7}, "ipam.type: must be a string", "7"),
]


@pytest.mark.parametrize(("field", "value", "start", "shown"), BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_field_errors(field: str, value: Any, start: str, shown: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(**{field: value})
    assert e.value.code == 7
    assert e.value.msg.startswith(start), e.value.msg
    assert shown in e.value.msg, e.value.msg
