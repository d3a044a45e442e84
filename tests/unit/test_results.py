"""Result wire shapes against golden files, conversions between every pair of versions, and parsing
of prevResult / IPAM results with errors naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import ConfigError
from cni.types.result import Result, narrowed, parse, to_wire
from cni.types.valueclass import replace
from tests.unit import models

GOLDEN = Path(__file__).parent / "golden"
VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
V02 = VERSIONS[:2]
V04 = VERSIONS[2:5]
V1 = VERSIONS[5:]


def golden(kind: str, version: str) -> Any:
    return jsonio.loads((GOLDEN / kind / f"{version}.json").read_bytes())


def same(wire: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal, including key order (the Go structs' field order)."""
    assert wire == expected
    assert jsonio.dumps(wire) == jsonio.dumps(expected)


@pytest.mark.parametrize("version", VERSIONS)
def test_full_model_golden(version: str) -> None:
    same(to_wire(models.full(), version), golden("full", version))


@pytest.mark.parametrize("version", VERSIONS[2:])
def test_l2_golden(version: str) -> None:
    same(to_wire(models.l2(), version), golden("l2", version))


@pytest.mark.parametrize("version", V02)
def test_v02_without_ips_fails_clearly(version: str) -> None:
    with pytest.raises(ConfigError) as e:
        to_wire(models.l2(), version)
    assert version in e.value.msg and "without IP addresses" in e.value.msg
    assert "0.3.0" in e.value.details


def test_golden_1_1_parses_back_to_the_model() -> None:
    assert parse(golden("full", "1.1.0"), "1.1.0") == models.full()
    assert parse(golden("l2", "1.1.0"), "1.1.0") == models.l2()


def info(version: str) -> int:
    """How much of the model a version carries: 0.x-ip4/ip6 < 0.3-1.0 < 1.1."""
    return 0 if version in V02 else 2 if version == "1.1.0" else 1


def expected_conversion(src: str, dst: str) -> dict[str, Any]:
    if info(src) >= info(dst):
        return golden("full", dst)  # nothing the destination can show was lost on the way
    if src in V02:
        return golden("from-0.2", dst)
    relabelled = golden("full", "1.0.0")  # 0.3-1.0 -> 1.1.0: the same fields, a new label
    return {
        **relabelled,
        "cniVersion": dst,
        "ips": [{k: v for k, v in ip.items() if k != "version"} for ip in golden("full", src)["ips"]],
    }


@pytest.mark.parametrize("dst", VERSIONS)
@pytest.mark.parametrize("src", VERSIONS)
def test_convert_every_version_to_every_version(src: str, dst: str) -> None:
    model = parse(golden("full", src), src)
    same(to_wire(model, dst), expected_conversion(src, dst))


@pytest.mark.parametrize("src", VERSIONS)
def test_version_taken_from_the_result_itself(src: str) -> None:
    """A prevResult or IPAM result carries its own cniVersion; the caller's is only a fallback."""
    assert parse(golden("full", src), "1.1.0") == parse(golden("full", src), src)
    untagged = {k: v for k, v in golden("full", src).items() if k != "cniVersion"}
    assert parse(untagged, src) == parse(golden("full", src), src)


def test_v02_keeps_first_address_of_each_family_and_splits_routes() -> None:
    wire = to_wire(models.full(), "0.2.0")
    assert wire["ip4"]["ip"] == "198.51.100.7/24"  # the first v4, though listed after a v6 one
    assert wire["ip6"]["ip"] == "2001:db8::7/64"
    assert [r["dst"] for r in wire["ip4"]["routes"]] == ["0.0.0.0/0", "198.18.0.0/15"]
    assert [r["dst"] for r in wire["ip6"]["routes"]] == ["2001:db8:ffff::/48", "::/0"]


def test_v02_single_family_drops_other_family_routes() -> None:
    r = replace(models.full(), ips=models.full().ips[1:3])  # IPv4 only
    wire = to_wire(r, "0.2.0")
    assert "ip6" not in wire
    assert [x["dst"] for x in wire["ip4"]["routes"]] == ["0.0.0.0/0", "198.18.0.0/15"]
    only6 = replace(models.full(), ips=models.full().ips[:1], routes=models.full().routes[1:2])
    assert to_wire(only6, "0.1.0") == {
        "cniVersion": "0.1.0",
        "ip6": {"ip": "2001:db8::7/64", "gateway": "2001:db8::1", "routes": [{"dst": "2001:db8:ffff::/48"}]},
        "dns": to_wire(models.full(), "0.2.0")["dns"],
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_dns_presence(version: str) -> None:
    wire = to_wire(models.ipam_only(), version)
    if version in V1:
        assert "dns" not in wire
    else:
        assert wire["dns"] == {}


@pytest.mark.parametrize("version", VERSIONS)
def test_ip_version_field_only_in_0_3_and_0_4(version: str) -> None:
    wire = to_wire(models.full(), version)
    if version in V02:
        return
    has = ["version" in ip for ip in wire["ips"]]
    assert has == [version in V04] * 4


@pytest.mark.parametrize("version", VERSIONS)
def test_1_1_fields_only_in_1_1(version: str) -> None:
    text = jsonio.dumps(to_wire(models.full(), version)).decode()
    for key in ('"mtu"', '"socketPath"', '"pciID"', '"advmss"', '"priority"', '"table"', '"scope"'):
        assert (key in text) == (version == "1.1.0"), key


def test_empty_result_prints_only_the_version() -> None:
    assert to_wire(Result(), "1.0.0") == {"cniVersion": "1.0.0"}
    assert to_wire(Result(), "0.4.0") == {"cniVersion": "0.4.0", "dns": {}}


# ---- parsing IPAM results and prevResults -----------------------------------------------------


IPAM_RESULTS = {
    "0.1.0": {
        "cniVersion": "0.1.0",
        "ip4": {"ip": "198.51.100.7/24", "gateway": "198.51.100.1", "routes": [{"dst": "0.0.0.0/0"}]},
    },
    "0.3.0": {
        "cniVersion": "0.3.0",
        "ips": [{"version": "4", "address": "198.51.100.7/24", "gateway": "198.51.100.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
    },
    "0.2.0": {
        "cniVersion": "0.2.0",
        "ip4": {"ip": "198.51.100.7/24", "gateway": "198.51.100.1", "routes": [{"dst": "0.0.0.0/0"}]},
        "dns": {},
    },
    "0.3.1": {
        "cniVersion": "0.3.1",
        "ips": [{"version": "4", "address": "198.51.100.7/24", "gateway": "198.51.100.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    },
    "0.4.0": {
        "cniVersion": "0.4.0",
        "ips": [{"version": "4", "address": "198.51.100.7/24", "gateway": "198.51.100.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    },
    "1.0.0": {
        "cniVersion": "1.0.0",
        "ips": [{"address": "198.51.100.7/24", "gateway": "198.51.100.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
    },
    "1.1.0": {
        "cniVersion": "1.1.0",
        "ips": [{"address": "198.51.100.7/24", "gateway": "198.51.100.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dns": {},
    },
}


@pytest.mark.parametrize("version", list(IPAM_RESULTS))
def test_ipam_results_of_every_version(version: str) -> None:
    assert parse(IPAM_RESULTS[version], "1.0.0") == models.ipam_only()


def test_route_host_bits_and_empty_gateways() -> None:
    r = parse(
        {
            "cniVersion": "1.0.0",
            "ips": [{"address": "198.51.100.7/24", "gateway": ""}],
            "routes": [{"dst": "198.51.100.9/24", "gw": ""}],
        },
        "1.0.0",
    )
    assert r.ips[0].gateway is None
    assert str(r.routes[0].dst) == "198.51.100.0/24" and r.routes[0].gw is None


BAD = [
    # (result, path in message, bad value in message)
    ([], "prevResult", "[]"),
    ("x", "prevResult", '"x"'),
    ({"cniVersion": "9.9.9"}, "prevResult.cniVersion", '"9.9.9"'),
    ({"cniVersion": 1}, "prevResult.cniVersion", "1"),
    ({"cniVersion": "1.0.0", "interfaces": {}}, "prevResult.interfaces", "{}"),
    ({"cniVersion": "1.0.0", "interfaces": ["eth0"]}, "prevResult.interfaces[0]", '"eth0"'),
    ({"cniVersion": "1.0.0", "interfaces": [{"name": 5}]}, "prevResult.interfaces[0].name", "5"),
    (
        {"cniVersion": "1.1.0", "interfaces": [{"name": "e", "mtu": "9000"}]},
        "prevResult.interfaces[0].mtu",
        '"9000"',
    ),
    ({"cniVersion": "1.0.0", "ips": "198.51.100.7/24"}, "prevResult.ips", '"198.51.100.7/24"'),
    ({"cniVersion": "1.0.0", "ips": [{}]}, "prevResult.ips[0].address", "required"),
    (
        {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.7"}]},
        "prevResult.ips[0].address",
        '"198.51.100.7"',
    ),
    (
        {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.300/24"}]},
        "prevResult.ips[0].address",
        "198.51.100.300/24",
    ),
    (
        {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.7/24", "gateway": "gw"}]},
        "prevResult.ips[0].gateway",
        '"gw"',
    ),
    (
        {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "e"}],
            "ips": [{"address": "198.51.100.7/24", "interface": 1}],
        },
        "prevResult.ips[0].interface",
        "1",
    ),
    (
        {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.7/24", "interface": -1}]},
        "prevResult.ips[0].interface",
        "-1",
    ),
    (
        {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.7/24", "interface": "0"}]},
        "prevResult.ips[0].interface",
        '"0"',
    ),
    (
        {"cniVersion": "0.4.0", "ips": [{"version": "6", "address": "198.51.100.7/24"}]},
        "prevResult.ips[0].version",
        '"6"',
    ),
    (
        {"cniVersion": "0.4.0", "ips": [{"version": 4, "address": "198.51.100.7/24"}]},
        "prevResult.ips[0].version",
        "4",
    ),
    ({"cniVersion": "1.0.0", "routes": [{}]}, "prevResult.routes[0].dst", "required"),
    ({"cniVersion": "1.0.0", "routes": [{"dst": "default"}]}, "prevResult.routes[0].dst", '"default"'),
    ({"cniVersion": "1.0.0", "routes": [{"dst": "0.0.0.0/0", "gw": "x"}]}, "prevResult.routes[0].gw", '"x"'),
    (
        {"cniVersion": "1.1.0", "routes": [{"dst": "0.0.0.0/0", "table": -1}]},
        "prevResult.routes[0].table",
        "-1",
    ),
    (
        {"cniVersion": "1.1.0", "routes": [{"dst": "0.0.0.0/0", "scope": 256}]},
        "prevResult.routes[0].scope",
        "256",
    ),
    (
        {"cniVersion": "1.1.0", "routes": [{"dst": "0.0.0.0/0", "mtu": True}]},
        "prevResult.routes[0].mtu",
        "True",
    ),
    ({"cniVersion": "1.0.0", "dns": []}, "prevResult.dns", "[]"),
    (
        {"cniVersion": "1.0.0", "dns": {"nameservers": "198.51.100.53"}},
        "prevResult.dns.nameservers",
        '"198.51.100.53"',
    ),
    ({"cniVersion": "1.0.0", "dns": {"search": [1]}}, "prevResult.dns.search[0]", "1"),
    ({"cniVersion": "1.0.0", "dns": {"domain": []}}, "prevResult.dns.domain", "[]"),
    ({"cniVersion": "0.2.0", "ip4": "198.51.100.7/24"}, "prevResult.ip4", '"198.51.100.7/24"'),
    ({"cniVersion": "0.2.0", "ip4": {}}, "prevResult.ip4.ip", "required"),
    ({"cniVersion": "0.2.0", "ip4": {"ip": "2001:db8::7/64"}}, "prevResult.ip4.ip", '"2001:db8::7/64"'),
    ({"cniVersion": "0.2.0", "ip6": {"ip": "198.51.100.7/24"}}, "prevResult.ip6.ip", '"198.51.100.7/24"'),
    ({"cniVersion": "0.1.0", "ip4": {"ip": "198.51.100.7/24", "gateway": 7}}, "prevResult.ip4.gateway", "7"),
    (
        {"cniVersion": "0.2.0", "ip4": {"ip": "198.51.100.7/24", "routes": [{"dst": "x"}]}},
        "prevResult.ip4.routes[0].dst",
        '"x"',
    ),
]


@pytest.mark.parametrize(("raw", "path", "value"), BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_parse_errors_name_the_field_and_value(raw: Any, path: str, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse(raw, "1.0.0", "prevResult")
    text = str(e.value)
    assert text.startswith(path + ":"), text
    assert value in text, text
    assert e.value.code == 7


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("model", [models.full, models.l2, models.ipam_only])
def test_narrowed_is_what_printing_and_parsing_back_gives(version: str, model: Any) -> None:
    """An in-process IPAM's Result narrowed to a version (cni.delegate) is what the Result printed in
    that version and parsed back would be; where printing fails, narrowing fails alike."""
    try:
        expected = parse(to_wire(model(), version), version)
    except ConfigError as e:
        with pytest.raises(ConfigError) as err:
            narrowed(model(), version)
        assert (err.value.msg, err.value.details) == (e.msg, e.details)
    else:
        assert narrowed(model(), version) == expected
