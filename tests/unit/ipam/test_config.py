"""Configuration: every whereabouts field, errors naming the field (code 7), the flat-file merge."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import Code, ConfigError
from ipam import config
from ipam.config import from_dict, load, merge


def bad(d: dict[str, Any], field: str, text: str = "") -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(d)
    assert e.value.code == Code.INVALID_CONFIG
    assert e.value.msg.startswith(field + ":"), e.value.msg
    assert text in e.value.msg, e.value.msg


R = "198.51.100.0/24"


@pytest.mark.parametrize(
    ("d", "field", "text"),
    [
        ({"range": "198.51.100.0/33"}, "ipam.range", "not a CIDR"),
        ({"range": "banana"}, "ipam.range", "not a CIDR"),
        ({"range": 7}, "ipam.range", "must be a string"),
        ({}, "ipam.range", "required"),
        (
            {"range": R, "range_start": "198.51.100.50", "range_end": "198.51.100.40"},
            "ipam.range_start",
            "after",
        ),
        ({"range": R, "range_start": "198.51.101.5"}, "ipam.range_start", "outside the range"),
        ({"range": R, "range_end": "2001:db8::5"}, "ipam.range_end", "outside the range"),
        ({"range": R, "range_start": "not-an-ip"}, "ipam.range_start", "not an IP address"),
        ({"range": R, "exclude": ["198.51.100.0/28", "198.51.101.0/28"]}, "ipam.exclude[1]", "not inside"),
        ({"range": R, "exclude": ["198.51.100.0/23"]}, "ipam.exclude[0]", "not inside"),
        ({"range": R, "exclude": ["nope"]}, "ipam.exclude[0]", "not an IP address"),
        ({"range": R, "exclude": "198.51.100.1"}, "ipam.exclude", "must be a list"),
        (
            {"range": "198.51.100.0/30", "exclude": ["198.51.100.1", "198.51.100.2"]},
            "ipam.range",
            "no usable",
        ),
        (
            {"range": "198.51.100.200-198.51.100.210/24", "range_start": "198.51.100.201"},
            "ipam.range",
            "conflicts",
        ),
        ({"range": "198.51.101.5-198.51.100.210/24"}, "ipam.range", "not inside"),
        ({"range": "2001:db8::5-198.51.100.210/24"}, "ipam.range", "different IP versions"),
        (
            {"ipRanges": [{"range": R}, {"range": "2001:db8::/64", "exclude": ["2001:db9::/64"]}]},
            "ipam.ipRanges[1].exclude[0]",
            "not inside",
        ),
        ({"ipRanges": [{"range": R}, {}]}, "ipam.ipRanges[1].range", "required"),
        ({"ipRanges": [{"range": R}, {"range": "198.51.100.128/25"}]}, "ipam.ipRanges[1].range", "overlaps"),
        ({"range": R, "ipRanges": [{"range": "198.51.100.0/25"}]}, "ipam.ipRanges[0].range", "overlaps"),
        ({"ipRanges": "x"}, "ipam.ipRanges", "must be a list"),
        ({"range": R, "gateway": "198.51.100.256"}, "ipam.gateway", "not an IP address"),
        ({"range": R, "routes": [{"dst": "x"}]}, "ipam.routes[0].dst", "not a CIDR"),
        ({"range": R, "addresses": [{"address": "198.51.100.9"}]}, "ipam.addresses[0].address", "not a CIDR"),
        ({"range": R, "enable_overlapping_ranges": "yes"}, "ipam.enable_overlapping_ranges", "boolean"),
        ({"range": R, "network_name": "a/b"}, "ipam.network_name", "invalid characters"),
        ({"range": R, "node_slice_size": "/22"}, "ipam.node_slice_size", "larger than the range"),
        ({"range": R, "node_slice_size": "/26"}, "ipam.node_slice_size", "kubernetes datastore"),
        ({"range": R, "datastore": "consul"}, "ipam.datastore", "unknown value"),
        ({"range": R, "datastore": "kubernetes"}, "ipam.kubernetes.kubeconfig", "required"),
        ({"range": R, "datastore": "etcd"}, "ipam.etcd_host", "required"),
        ({"range": R, "local_db": "relative/x.db"}, "ipam.local_db", "absolute"),
        ({"range": R, "kubernetes": {"kubeconfig": 5}}, "ipam.kubernetes.kubeconfig", "must be a string"),
    ],
)
def test_errors_name_the_field(d: dict[str, Any], field: str, text: str) -> None:
    bad(d, field, text)


def test_every_field() -> None:
    c = from_dict(
        {
            "type": "whereabouts",
            "range": R,
            "range_start": "198.51.100.10",
            "range_end": "198.51.100.90",
            "exclude": ["198.51.100.16/28", "198.51.100.50"],
            "gateway": "198.51.100.1",
            "ipRanges": [
                {"range": "2001:db8::/64", "range_start": "2001:db8::10", "exclude": ["2001:db8::11"]}
            ],
            "routes": [{"dst": "198.18.0.0/15", "gw": "198.51.100.1"}],
            "dns": {"nameservers": ["198.51.100.53"]},
            "addresses": [{"address": "198.51.100.200/24", "gateway": "198.51.100.1"}],
            "enable_overlapping_ranges": False,
            "network_name": "rdma-a",
            "log_file": "/tmp/x.log",
            "log_level": "debug",
            "leader_lease_duration": 1500,
            "leader_renew_deadline": 1000,
            "leader_retry_period": 500,
            "sleep_for_race": 0,
            "reconciler_cron_expression": "30 4 * * *",
            "configuration_path": "/nonexistent",
            "local_db": "/tmp/pycni-test/x.db",
        }
    )
    assert [r.cidr for r in c.ranges] == [R, "2001:db8::/64"]
    v4, v6 = c.ranges
    assert str(ipaddress.ip_address(v4.start)) == "198.51.100.10" and v4.excludes[1].prefixlen == 32
    assert v6.excludes == (ipaddress.ip_network("2001:db8::11/128"),)
    assert c.gateway == ipaddress.ip_address("198.51.100.1") and len(c.routes) == 1
    assert c.dns.nameservers == ("198.51.100.53",) and len(c.addresses) == 1
    assert (c.overlapping, c.network_name, c.log_level) == (False, "rdma-a", "debug")
    assert c.store.datastore == "local" and c.store.local_db == "/tmp/pycni-test/x.db"
    assert not Path("/tmp/pycni-test").exists()  # parsing has no side effects


def test_defaults() -> None:
    c = from_dict({"range": R})
    assert c.overlapping is True and c.network_name == ""
    assert c.store.datastore == "local" and c.store.local_db == config.DEFAULT_LOCAL_DB


@pytest.mark.parametrize(
    ("d", "store"),
    [
        ({"kubernetes": {"kubeconfig": "/etc/k"}}, "kubernetes"),
        ({"etcd_host": "127.0.0.1:2379"}, "etcd"),
        ({"datastore": "local", "kubernetes": {"kubeconfig": "/etc/k"}}, "local"),
        ({}, "local"),
    ],
)
def test_datastore_selection(d: dict[str, Any], store: str) -> None:
    assert from_dict({"range": R, **d}).store.datastore == store


def test_etcd_password_stays_out_of_repr() -> None:
    c = from_dict({"range": R, "etcd_host": "h:2379", "etcd_username": "u", "etcd_password": "s3cret"})
    assert c.store.etcd.password == "s3cret" and "s3cret" not in repr(c)


def test_merge_inline_wins_flat_fills() -> None:
    inline = {"range": R, "kubernetes": {}, "log_level": "", "enable_overlapping_ranges": True}
    flat = {
        "datastore": "kubernetes",
        "kubernetes": {"kubeconfig": "/etc/k"},
        "log_level": "error",
        "range": "198.18.0.0/24",
        "enable_overlapping_ranges": False,
    }
    m = merge(inline, flat)
    assert m["range"] == R and m["kubernetes"] == {"kubeconfig": "/etc/k"} and m["log_level"] == "error"
    assert m["enable_overlapping_ranges"] is True
    assert merge({"range": R}, {"enable_overlapping_ranges": False}).get("enable_overlapping_ranges") is None


def test_load_with_flat_file(tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.conf"
    flat.write_bytes(
        jsonio.dumps(
            {
                "datastore": "kubernetes",
                "configuration_path": str(tmp_path),
                "kubernetes": {"kubeconfig": "/etc/k"},
            }
        )
    )
    c = load({"range": R, "configuration_path": str(tmp_path)}, candidates=())
    assert c.store.datastore == "kubernetes" and c.store.kubernetes.kubeconfig == "/etc/k"
    c = load({"range": R, "configuration_path": str(flat), "datastore": "local"}, candidates=())
    assert c.store.datastore == "local"


def test_missing_flat_file_is_fine(tmp_path: Path) -> None:
    c = load({"range": R}, candidates=(str(tmp_path / "none.conf"),))
    assert c.store.datastore == "local"


def test_flat_file_from_candidates_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.conf", tmp_path / "b.conf"
    b.write_bytes(jsonio.dumps({"network_name": "from-b"}))
    assert load({"range": R}, candidates=(str(a), str(b))).network_name == "from-b"
    a.write_bytes(jsonio.dumps({"network_name": "from-a"}))
    assert load({"range": R}, candidates=(str(a), str(b))).network_name == "from-a"


def test_malformed_flat_file_is_code_7_naming_it(tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.conf"
    flat.write_text("{not json")
    with pytest.raises(ConfigError, match=r"flat file .*whereabouts\.conf"):
        load({"range": R, "configuration_path": str(flat)}, candidates=())
    flat.write_text("[1]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        load({"range": R, "configuration_path": str(flat)}, candidates=())


def test_error_from_merged_value_mentions_the_flat_file(tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.conf"
    flat.write_bytes(jsonio.dumps({"datastore": "consul"}))
    with pytest.raises(ConfigError) as e:
        load({"range": R, "configuration_path": str(flat)}, candidates=())
    assert e.value.msg.startswith("ipam.datastore:") and str(flat) in e.value.details
