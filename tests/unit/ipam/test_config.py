"""Configuration: every whereabouts field, errors naming the field (code 7), the flat-file merge."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import Code, ConfigError
from cni.types import fields
from ipam import config
from ipam.config import from_dict, load, merge
from tests.skips import OWN_FLAT_FILE


def bad(d: dict[str, Any], field: str, text: str = "") -> None:
    with pytest.raises(ConfigError) as e:
        from_dict(d)
    assert e.value.code == Code.INVALID_CONFIG
    assert e.value.msg.startswith(field + ":"), e.value.msg
    assert text in e.value.msg, e.value.msg


R = "198.51.100.0/24"
LOCAL = {"datastore": "local"}


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
        ({"range": R, "node_slice_size": "/22", **LOCAL}, "ipam.node_slice_size", "larger than the range"),
        ({"range": R, "node_slice_size": "/26", **LOCAL}, "ipam.node_slice_size", "kubernetes datastore"),
        ({"range": R, "datastore": "consul"}, "ipam.datastore", "unknown value"),
        ({"range": R, "datastore": "kubernetes"}, "ipam.kubernetes.kubeconfig", "required"),
        ({"range": R, "datastore": "etcd"}, "ipam.etcd_host", "required"),
        ({"range": R, "datastore": "local", "local_db": "relative/x.db"}, "ipam.local_db", "absolute"),
        ({"range": R}, "ipam.datastore", "no store configured"),
        ({"range": R, "local_db": "/tmp/x.db"}, "ipam.datastore", 'add "datastore": "local"'),
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
            "datastore": "local",
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
    c = from_dict({"range": R, "datastore": "local"})
    assert c.overlapping is True and c.network_name == ""
    assert c.store.datastore == "local" and c.store.local_db == config.DEFAULT_LOCAL_DB


@pytest.mark.parametrize(
    ("d", "store"),
    [
        ({"kubernetes": {"kubeconfig": "/etc/k"}}, "kubernetes"),
        ({"etcd_host": "127.0.0.1:2379"}, "etcd"),
        ({"datastore": "local", "kubernetes": {"kubeconfig": "/etc/k"}}, "local"),
        ({"datastore": "local"}, "local"),
        ({"datastore": "etcd", "etcd_host": "h:2379", "kubernetes": {"kubeconfig": "/etc/k"}}, "etcd"),
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


NETOP = {"type": "whereabouts", "range": R, "exclude": ["198.51.100.0/28"]}  # as the Network Operator renders


def flat_file(path: Path, doc: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(jsonio.dumps(doc))
    return str(path)


def no_store(ipam: dict[str, Any], candidates: tuple[str, ...]) -> config.NoStoreError:
    """load and load_store both refuse `ipam`, with the same code 7 error; returned for its text."""
    with pytest.raises(config.NoStoreError) as e:
        load(ipam, candidates=candidates)
    with pytest.raises(config.NoStoreError) as s:
        config.load_store(ipam, candidates=candidates)
    assert (e.value.code, str(e.value)) == (Code.INVALID_CONFIG, str(s.value))
    return e.value


def test_the_local_store_chosen_inline_needs_no_flat_file(tmp_path: Path) -> None:
    c = load({**NETOP, "datastore": "local"}, candidates=(str(tmp_path / "none.conf"),))
    assert c.store.datastore == "local" and c.store.local_db == config.DEFAULT_LOCAL_DB


def test_a_flat_file_choosing_the_local_store_serves_a_nad_without_one(tmp_path: Path) -> None:
    flat = flat_file(tmp_path / "whereabouts.conf", {"datastore": "local", "local_db": "/tmp/l.db"})
    assert load(NETOP, candidates=(flat,)).store == config.StoreConfig("local", "/tmp/l.db")


def test_no_flat_file_and_no_store_is_code_7_naming_every_path_tried(tmp_path: Path) -> None:
    paths = (str(tmp_path / "a" / "whereabouts.conf"), str(tmp_path / "b" / "whereabouts.conf"))
    err = no_store(NETOP, paths)
    assert err.msg.startswith("ipam.datastore: no store configured"), err.msg
    assert "kubernetes.kubeconfig" in err.msg and "etcd_host" in err.msg
    assert f"no flat file at {paths[0]}, {paths[1]}" in err.details, err.details
    assert '"datastore": "local"' in err.details


def test_the_default_flat_file_locations_are_the_ones_named() -> None:
    """The plugin's own candidates, as upstream's."""
    there = [p for p in config.FLAT_FILES if os.path.lexists(p)]
    if there:
        pytest.skip(f"{OWN_FLAT_FILE} of its own: {there}")
    err = no_store(NETOP, config.FLAT_FILES)
    assert "no flat file at " + ", ".join(config.FLAT_FILES) in err.details
    assert "/etc/cni/net.d/whereabouts.d/whereabouts.conf" in config.FLAT_FILES


def test_a_flat_file_with_a_kubeconfig_serves_a_nad_without_a_store(tmp_path: Path) -> None:
    flat = flat_file(
        tmp_path / "whereabouts.d" / "whereabouts.conf",
        {"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/etc/k"}},
    )
    c = load(NETOP, candidates=(str(tmp_path / "first.conf"), flat))
    assert c.store.datastore == "kubernetes" and c.store.kubernetes.kubeconfig == "/etc/k"
    # the kubeconfig alone implies the store (upstream's flat file always has it)
    flat_file(Path(flat), {"kubernetes": {"kubeconfig": "/etc/k"}})
    assert config.load_store(NETOP, candidates=(flat,)).datastore == "kubernetes"


def test_a_flat_file_that_names_no_store_is_named_in_the_error(tmp_path: Path) -> None:
    flat = flat_file(tmp_path / "whereabouts.conf", {"log_level": "debug"})
    err = no_store(NETOP, (flat,))
    assert f"merged with flat file {flat}" in err.details and '"datastore": "local"' in err.details


def test_a_configuration_path_typo_is_named_first_and_the_defaults_still_apply(tmp_path: Path) -> None:
    typo = str(tmp_path / "wherabouts.d")
    default = str(tmp_path / "whereabouts.d" / "whereabouts.conf")
    err = no_store({**NETOP, "configuration_path": typo}, (default,))
    assert f"no flat file at {typo}, {default}" in err.details, err.details
    # (the value as error messages show one: cut at 80 characters, which a temp dir's path can reach)
    assert f"configuration_path {fields.show(typo)}" in err.details
    # as upstream: configuration_path is only tried first; a default flat file still serves the call
    flat_file(Path(default), {"kubernetes": {"kubeconfig": "/etc/k"}})
    assert load({**NETOP, "configuration_path": typo}, candidates=(default,)).store.datastore == "kubernetes"


def test_configuration_path_as_a_directory_names_its_whereabouts_conf(tmp_path: Path) -> None:
    err = no_store({**NETOP, "configuration_path": str(tmp_path)}, ())
    assert f"no flat file at {tmp_path / 'whereabouts.conf'}" in err.details, err.details


@pytest.mark.parametrize(
    ("inline", "flat"),
    [
        ({"etcd_host": "h:2379"}, None),
        ({}, {"etcd_host": "h:2379", "etcd_username": "u"}),
        ({"datastore": "etcd"}, {"etcd_host": "h:2379"}),
    ],
)
def test_etcd_settings_select_etcd(
    tmp_path: Path, inline: dict[str, Any], flat: dict[str, Any] | None
) -> None:
    path = tmp_path / "whereabouts.conf"
    if flat is not None:
        flat_file(path, flat)
    assert load({**NETOP, **inline}, candidates=(str(path),)).store.etcd.host == "h:2379"
    assert config.load_store({**NETOP, **inline}, candidates=(str(path),)).datastore == "etcd"


@pytest.mark.parametrize(
    ("inline", "flat", "field"),
    [
        ({"datastore": "kubernetes"}, None, "ipam.kubernetes.kubeconfig"),
        ({}, {"datastore": "kubernetes"}, "ipam.kubernetes.kubeconfig"),
        ({}, {"datastore": "etcd"}, "ipam.etcd_host"),
    ],
)
def test_a_cluster_store_without_its_settings_names_the_missing_field(
    tmp_path: Path, inline: dict[str, Any], flat: dict[str, Any] | None, field: str
) -> None:
    path = tmp_path / "whereabouts.conf"
    if flat is not None:
        flat_file(path, flat)
    err = no_store({**NETOP, **inline}, (str(path),))
    assert err.msg.startswith(f"{field}: required"), err.msg
    where = f"merged with flat file {path}" if flat is not None else f"no flat file at {path}"
    assert where in err.details, err.details


@pytest.mark.parametrize(
    ("inline", "flat", "store"),
    [
        # a NAD's own kubeconfig is never served from the local store a node's flat file names
        ({"kubernetes": {"kubeconfig": "/etc/nad"}}, {"datastore": "local"}, "kubernetes"),
        ({"etcd_host": "h:2379"}, {"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/k"}}, "etcd"),
        # an explicit inline choice wins over what the flat file names or implies
        ({"datastore": "local"}, {"datastore": "kubernetes", "kubernetes": {"kubeconfig": "/k"}}, "local"),
        # nothing inline: the flat file decides
        ({}, {"datastore": "local", "kubernetes": {"kubeconfig": "/k"}}, "local"),
    ],
)
def test_the_inline_config_decides_the_store_before_the_flat_file(
    tmp_path: Path, inline: dict[str, Any], flat: dict[str, Any], store: str
) -> None:
    path = flat_file(tmp_path / "whereabouts.conf", flat)
    assert load({**NETOP, **inline}, candidates=(path,)).store.datastore == store


def test_flat_file_from_candidates_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a.conf", tmp_path / "b.conf"
    b.write_bytes(jsonio.dumps({"network_name": "from-b", "datastore": "local"}))
    assert load({"range": R}, candidates=(str(a), str(b))).network_name == "from-b"
    a.write_bytes(jsonio.dumps({"network_name": "from-a", "datastore": "local"}))
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
