"""cni.types.netconf.Request helpers: MAC precedence, device id, GC attachments, ipam/args/prevResult."""

from __future__ import annotations

from typing import Any

import pytest

from cni import jsonio
from cni.errors import CniError, ConfigError
from cni.types.args import parse as parse_args
from cni.types.netconf import Request, requested_mac, require_prev_result
from tests.unit import models

M_CONF, M_ARGS, M_CNI, M_RT = (
    "02:00:5e:00:53:01",
    "02:00:5e:00:53:02",
    "02:00:5e:00:53:03",
    "02:00:5e:00:53:04",
)


def req(conf: dict[str, Any] | None = None, cni_args: str = "", version: str = "1.0.0") -> Request:
    c = {"cniVersion": version, "name": "n", "type": "macvlan", **(conf or {})}
    return Request("ADD", version, c, jsonio.dumps(c), args=parse_args(cni_args))


@pytest.mark.parametrize(
    ("configured", "cni_args", "conf", "expected"),
    [
        (None, "", {}, None),
        (M_CONF, "", {}, M_CONF),
        (M_CONF, f"MAC={M_ARGS}", {}, M_ARGS),
        (M_CONF, f"MAC={M_ARGS}", {"args": {"cni": {"mac": M_CNI}}}, M_CNI),
        (M_CONF, f"MAC={M_ARGS}", {"args": {"cni": {"mac": M_CNI}}, "runtimeConfig": {"mac": M_RT}}, M_RT),
        (M_CONF, "", {"runtimeConfig": {"mac": M_RT}}, M_RT),
        (None, f"MAC={M_ARGS}", {"runtimeConfig": {"mac": ""}}, M_ARGS),  # empty means not given
        (M_CONF, "MAC=", {"args": {"cni": {}}}, M_CONF),
        (None, "MAC=02-00-5E-00-53-0A", {}, "02:00:5e:00:53:0a"),  # normalised
    ],
)
def test_mac_precedence(
    configured: str | None, cni_args: str, conf: dict[str, Any], expected: str | None
) -> None:
    assert requested_mac(req(conf, cni_args), configured) == expected


def test_invalid_cni_args_mac_is_an_env_error() -> None:
    with pytest.raises(CniError) as e:
        requested_mac(req({}, "MAC=nonsense"), None)
    assert e.value.code == 4
    assert e.value.msg.startswith("CNI_ARGS MAC:") and "nonsense" in e.value.msg


@pytest.mark.parametrize(
    ("conf", "path"),
    [
        ({"args": {"cni": {"mac": "01:00:5e:00:53:01"}}}, "args.cni.mac"),
        ({"args": {"cni": {"mac": 5}}}, "args.cni.mac"),
        ({"args": {"cni": "mac"}}, "args.cni"),
        ({"args": []}, "args"),
        ({"runtimeConfig": {"mac": "zz:00:5e:00:53:01"}}, "runtimeConfig.mac"),
        ({"runtimeConfig": "x"}, "runtimeConfig"),
    ],
)
def test_mac_errors_name_the_source(conf: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as e:
        requested_mac(req(conf), None)
    assert e.value.msg.startswith(path + ":"), e.value.msg


VA = "cni.dev/valid-attachments"
OLD = "cni.dev/attachments"


@pytest.mark.parametrize(
    ("conf", "expected"),
    [
        ({}, None),
        ({VA: []}, set()),
        ({OLD: []}, set()),
        ({VA: [{"containerID": "c1", "ifname": "net1"}]}, {("c1", "net1")}),
        ({OLD: [{"containerID": "c1", "ifname": "net1"}]}, {("c1", "net1")}),
        (
            {VA: [{"containerID": "c1", "ifname": "net1"}], OLD: [{"containerID": "c2", "ifname": "net2"}]},
            {("c1", "net1"), ("c2", "net2")},
        ),
        ({VA: [], OLD: [{"containerID": "c2", "ifname": "net2"}]}, {("c2", "net2")}),
        ({VA: [{"containerID": "c1", "ifname": "net1", "extra": True}]}, {("c1", "net1")}),
    ],
)
def test_valid_attachments(conf: dict[str, Any], expected: set[tuple[str, str]] | None) -> None:
    assert req(conf, version="1.1.0").valid_attachments() == expected


@pytest.mark.parametrize(
    ("conf", "path"),
    [
        ({VA: {}}, VA),
        ({OLD: "c1"}, OLD),
        ({VA: ["c1"]}, f"{VA}[0]"),
        ({VA: [{"ifname": "net1"}]}, f"{VA}[0].containerID"),
        (
            {OLD: [{"containerID": "c1", "ifname": "n"}, {"containerID": "c2", "ifname": 1}]},
            f"{OLD}[1].ifname",
        ),
    ],
)
def test_valid_attachments_errors(conf: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as e:
        req(conf).valid_attachments()
    assert e.value.msg.startswith(path + ":"), e.value.msg


@pytest.mark.parametrize(
    ("ipam", "expected"),
    [
        (None, None),
        ({}, None),
        ({"type": ""}, None),
        ({"subnet": "198.51.100.0/24"}, None),
        ({"type": "host-local"}, {"type": "host-local"}),
    ],
)
def test_ipam_section(ipam: Any, expected: Any) -> None:
    conf = {} if ipam is None else {"ipam": ipam}
    assert req(conf).ipam() == expected


@pytest.mark.parametrize(("ipam", "path"), [("host-local", "ipam"), ({"type": 1}, "ipam.type"), ([], "ipam")])
def test_ipam_section_errors(ipam: Any, path: str) -> None:
    with pytest.raises(ConfigError, match=f"^{path}: must be"):
        req({"ipam": ipam}).ipam()


def test_prev_result_any_version() -> None:
    from tests.unit.test_results import golden

    for version in ("0.2.0", "0.4.0", "1.0.0", "1.1.0"):
        r = req({"prevResult": golden("full", version)}, version=version)
        assert r.prev_result() is not None
    assert req({"prevResult": golden("full", "1.1.0")}, version="1.1.0").prev_result() == models.full()
    # a prevResult without cniVersion is read in the config's version
    untagged = {k: v for k, v in golden("full", "0.2.0").items() if k != "cniVersion"}
    assert req({"prevResult": untagged}, version="0.2.0").prev_result() is not None


@pytest.mark.parametrize("prev", [None, {}])
def test_prev_result_absent(prev: Any) -> None:
    r = req({} if prev is None else {"prevResult": prev})
    assert r.prev_result() is None
    with pytest.raises(ConfigError, match=r"^prevResult: required for CHECK"):
        require_prev_result(r)


def test_prev_result_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^prevResult\.ips\[0\]\.address: required"):
        req({"prevResult": {"cniVersion": "1.0.0", "ips": [{}]}}).prev_result()


def test_dns_and_runtime_config() -> None:
    r = req(
        {"dns": {"nameservers": ["198.51.100.53"], "search": ["a.example"]}, "runtimeConfig": {"ips": []}}
    )
    assert r.dns().nameservers == ("198.51.100.53",) and r.dns().search == ("a.example",)
    assert r.runtime_config() == {"ips": []}
    assert not req().dns()
    with pytest.raises(ConfigError, match=r"^dns\.nameservers\[0\]: must be a string"):
        req({"dns": {"nameservers": [1]}}).dns()
