"""Node slices, pure parts (ipam.slices, ipam.store.nodeslices, the config): the size as upstream parses
it, the slices in upstream's order and text, first-free assignment, pool names as upstream's
IPPoolName, exclude/range_start/range_end/gateway cut to the slice, and the size bound that keeps every
object of a 65,536-address network far below 256 KiB."""

from __future__ import annotations

import ipaddress
import json
from typing import Any

import jsonschema
import pytest

from cni.errors import CniError, Code, ConfigError
from ipam import slices
from ipam.config import from_dict
from ipam.model import Allocation, Pool
from ipam.store import crd, nodeslices
from tests.unit.ipam.test_crd_schema import directories, schemas

KUBE = {"kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}
NET = ipaddress.ip_network("198.18.0.0/16")


def conf(**ipam: Any) -> Any:
    return from_dict({**KUBE, **ipam})


@pytest.mark.parametrize(("text", "size"), [("/24", 24), ("24", 24), ("/16", 16), ("/30", 30), ("/22", 22)])
def test_sizes_parse_as_upstream(text: str, size: int) -> None:
    assert slices.parse_size(text, NET, "ipam.node_slice_size") == size


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("/15", "larger than the range"),
        ("/31", "no usable address (at most /30)"),
        ("/32", "no usable address"),
        ("24/", "not a prefix length"),
        ("//24", "not a prefix length"),
        ("/-24", "not a prefix length"),
        ("/٢٤", "not a prefix length"),  # non-ASCII digits: int() would take them, Go's Atoi does not
        ("/0x18", "not a prefix length"),
        ("/1000", "not a prefix length"),
        (24, "must be a string"),
    ],
)
def test_bad_sizes_are_code_7_naming_the_field(value: object, text: str) -> None:
    with pytest.raises(ConfigError) as e:
        conf(range="198.18.0.0/16", node_slice_size=value)
    assert e.value.code == Code.INVALID_CONFIG
    assert e.value.msg.startswith("ipam.node_slice_size:") and text in e.value.msg, e.value.msg


def test_too_many_slices_is_refused_and_ipv6_counts_too() -> None:
    with pytest.raises(ConfigError, match=r"^ipam.node_slice_size: /25 cuts 198.0.0.0/8 into 131072 slices"):
        conf(range="198.0.0.0/8", node_slice_size="/25")
    assert conf(range="198.0.0.0/8", node_slice_size="/22").node_slice_size == "/22"  # upstream's example
    with pytest.raises(ConfigError, match="more than 16384"):
        conf(range="2001:db8::/64", node_slice_size="/120")
    assert conf(range="2001:db8::/64", node_slice_size="/78").node_slice_size == "/78"


def test_slice_mode_needs_the_kubernetes_store_and_one_range() -> None:
    for store in ({"datastore": "local", "local_db": "/tmp/x.db"}, {"etcd_host": "198.51.100.10"}):
        with pytest.raises(ConfigError, match=r"^ipam.node_slice_size: .*kubernetes datastore"):
            from_dict({"range": "198.18.0.0/16", "node_slice_size": "/24", **store})
    with pytest.raises(ConfigError, match=r"^ipam.node_slice_size: .*exactly one range, this config has 2"):
        conf(range="198.18.0.0/16", ipRanges=[{"range": "2001:db8::/64"}], node_slice_size="/24")
    assert conf(range="198.18.0.0/16", node_slice_size="").node_slice_size == ""
    assert conf(ipRanges=[{"range": "198.18.0.0/16"}], node_slice_size="24").node_slice_size == "24"


def test_slices_are_upstreams_in_order_and_text() -> None:
    assert list(slices.slices(ipaddress.ip_network("198.51.100.0/24"), 26)) == [
        "198.51.100.0/26", "198.51.100.64/26", "198.51.100.128/26", "198.51.100.192/26",
    ]  # fmt: skip
    cuts = list(slices.slices(NET, 24))
    assert len(cuts) == 256 and cuts[0] == "198.18.0.0/24" and cuts[-1] == "198.18.255.0/24"
    assert list(slices.slices(ipaddress.ip_network("2001:db8::/64"), 66))[1] == "2001:db8:0:0:4000::/66"


def test_first_free_keeps_a_nodes_slice_else_takes_the_first_empty_one() -> None:
    held = [("a", "s0"), ("", "s1"), ("c", "s2"), ("", "s3")]
    assert slices.first_free(held, "c") == 2
    assert slices.first_free(held, "new") == 1
    assert slices.slice_of(held, "c") == "s2" and slices.slice_of(held, "new") is None
    assert slices.first_free([("a", "s0"), ("b", "s1")], "new") is None


def test_pool_names_are_upstreams() -> None:
    # upstream's IPPoolName with NodeName: <node>-<normalized> or <network>-<node>-<normalized>
    assert slices.slice_pool_name("198.18.3.0/24", "node-a") == "node-a-198.18.3.0-24"
    assert slices.slice_pool_name("198.18.3.0/24", "node-a", "rdma") == "rdma-node-a-198.18.3.0-24"
    assert slices.slice_pool_name("2001:db8::/66", "n1") == "n1-2001-db8---66"


def test_exclude_range_start_end_and_gateway_are_cut_to_the_slice() -> None:
    c = conf(range="198.18.0.0/16", node_slice_size="/24", range_start="198.18.1.100",
             range_end="198.18.2.20", exclude=["198.18.1.128/25", "198.18.2.0/29"], gateway="198.18.2.9")
    rng = c.ranges[0]
    one = slices.in_slice(rng, ipaddress.ip_network("198.18.1.0/24"), "n", "")
    base = int(ipaddress.ip_address("198.18.1.0"))
    assert [(lo - base, hi - base) for lo, hi in one.segments] == [(100, 127)]
    two = slices.in_slice(rng, ipaddress.ip_network("198.18.2.0/24"), "n", "net")
    base = int(ipaddress.ip_address("198.18.2.0"))
    assert [(lo - base, hi - base) for lo, hi in two.segments] == [(8, 8), (10, 20)]  # .9 the gateway
    assert two.cidr == "198.18.2.0/24" and two.pool == "net-n-198.18.2.0-24"
    assert str(two.interface(10)) == "198.18.2.10/16"  # the whole range's prefix in results
    assert two.offset(ipaddress.ip_address("198.18.2.10")) == 10  # offsets count from the slice
    with pytest.raises(CniError) as e:
        slices.in_slice(rng, ipaddress.ip_network("198.18.7.0/24"), "node-z", "")
    assert e.value.code == Code.SLICE_FULL and "node-z" in e.value.msg and "198.18.7.0/24" in e.value.msg


def test_a_slice_must_fit_the_configured_range() -> None:
    rng = conf(range="198.18.0.0/16", node_slice_size="/24").ranges[0]
    assert slices.fits("198.18.4.0/24", rng, 24) == ipaddress.ip_network("198.18.4.0/24")
    for other in ("198.19.4.0/24", "198.18.4.0/25", "198.18.4.1/24", "2001:db8::/24", "junk"):
        assert slices.fits(other, rng, 24) is None


def test_the_nodeslicepool_object_is_valid_and_survives_pruning() -> None:
    from tests.kubeapi.emulator import validate

    cuts = list(slices.slices(NET, 24))
    obj = nodeslices.assigned(nodeslices.new_object("rdma", "ns", "198.18.0.0/16", "/24", cuts), 3, "node-a")
    assert nodeslices.allocations(obj)[3] == ("node-a", "198.18.3.0/24")
    assert nodeslices.allocations(obj)[0] == ("", "198.18.0.0/24")
    assert nodeslices.spec(obj) == ("198.18.0.0/16", "/24")
    for directory in directories():
        schema = schemas(directory)["NodeSlicePool"]
        jsonschema.validate(obj, schema)
        body = {k: v for k, v in obj.items() if k != "metadata"}
        assert validate(body, schema, "") == body


def test_every_object_of_a_65536_address_network_stays_far_below_256_kib() -> None:
    """The computed bound (the real-server test fills one slice for real): 198.18.0.0/15 in /24 slices
    holds 512 x 254 = 130,048 addresses; the biggest objects are the NodeSlicePool with all 512 slices
    assigned to nodes with 63-character names, and one slice's IPPool with all 254 addresses held by
    64-hex container ids, long pod references and pycni's per-entry annotation."""
    net = ipaddress.ip_network("198.18.0.0/15")
    size = slices.parse_size("/24", net, "x")
    cuts = list(slices.slices(net, size))
    per_slice = slices.in_slice(conf(range=str(net), node_slice_size="/24").ranges[0],
                                ipaddress.ip_network(cuts[0]), "n", "").size  # fmt: skip
    assert len(cuts) * per_slice >= 65536
    nsp = nodeslices.new_object("n" * 63, "pycni-system", str(net), "/24", cuts)
    nsp["status"]["allocations"] = [{"nodeName": f"{i:03d}".ljust(63, "x"), "sliceRange": s}
                                    for i, s in enumerate(cuts)]  # fmt: skip
    owner = Allocation("f" * 64, f"{'p' * 63}/{'q' * 200}", "net1", "5a1c1b9e-6c42-4b4e-9a52-0d1c3b6d7a11",
                       "r" * 63, "n" * 63)  # fmt: skip
    pool = Pool("r" * 63 + "-" + "n" * 63 + "-198.18.0.0-24", cuts[0], {str(o): owner for o in range(1, 255)})
    sizes = {"NodeSlicePool": len(json.dumps(nsp)), "IPPool": len(json.dumps(crd.pool_to_object(pool, "ns")))}
    assert all(n < 160 * 1024 for n in sizes.values()), sizes
