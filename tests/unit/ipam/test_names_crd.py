"""Object names as upstream builds them, and the model <-> CRD object mapping."""

from __future__ import annotations

import ipaddress

import pytest

from ipam.model import Allocation, Pool, Reservation
from ipam.store import crd
from ipam.store.names import pool_name, reservation_name


@pytest.mark.parametrize(
    ("rng", "net", "name"),
    [
        ("198.18.0.0/15", "", "198.18.0.0-15"),
        ("198.18.0.0/15", "test", "test-198.18.0.0-15"),
        ("2001:db8::/64", "", "2001-db8---64"),
        ("2001:db8:0:10::/64", "", "2001-db8-0-10---64"),
        ("2001:db8::/32", "rdma", "rdma-2001-db8---32"),
    ],
)
def test_pool_names(rng: str, net: str, name: str) -> None:
    assert pool_name(str(ipaddress.ip_network(rng)), net) == name


@pytest.mark.parametrize(
    ("ip", "net", "name"),
    [
        ("198.51.100.7", "", "198.51.100.7"),
        ("2001:db8::1", "", "2001-db8--1"),
        ("2001:db8::", "", "2001-db8--0"),
        ("2001:db8::1", "blue", "blue-2001-db8--1"),
        ("::1", "", "--1"),
    ],
)
def test_reservation_names(ip: str, net: str, name: str) -> None:
    assert reservation_name(str(ipaddress.ip_address(ip)), net) == name


A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "rdma", "node-1")
B = Allocation("b" * 64, "ns/b", "net2")


def test_pool_object_shape_and_round_trip() -> None:
    pool = Pool("198.51.100.0-24", "198.51.100.0/24", {"1": A, "2": B}, "42")
    obj = crd.pool_to_object(pool, "kube-system")
    assert obj["apiVersion"] == "whereabouts.cni.cncf.io/v1alpha1" and obj["kind"] == "IPPool"
    assert obj["metadata"]["resourceVersion"] == "42"
    assert obj["spec"] == {
        "range": "198.51.100.0/24",
        "allocations": {
            "1": {"id": "a" * 64, "podref": "ns/a", "ifname": "net1"},
            "2": {"id": "b" * 64, "podref": "ns/b", "ifname": "net2"},
        },
    }
    stamp = crd.fingerprint(A)
    assert obj["metadata"]["annotations"] == {"pycni.io/o-1": f'["{stamp}","uid-a","rdma","node-1"]'}
    assert crd.pool_from_object(obj) == pool
    assert crd.pool_from_object(obj, version="7").version == "7"


def test_upstream_pool_without_annotations() -> None:
    obj = {
        "metadata": {"name": "x", "resourceVersion": "3"},
        "spec": {"range": "198.51.100.0/24", "allocations": {"5": {"id": "c", "podref": "ns/p"}}},
    }
    pool = crd.pool_from_object(obj)
    assert pool.allocations == {"5": Allocation("c", "ns/p", "")}


def test_mangled_owners_annotation_costs_only_the_extras() -> None:
    obj = crd.pool_to_object(Pool("x", "198.51.100.0/24", {"1": A}), "ns")
    obj["metadata"]["annotations"][crd.owner_key("1")] = "{not json"
    assert crd.pool_from_object(obj).allocations == {"1": A._replace(pod_uid="", network="", node="")}


def test_owners_annotation_stays_within_budget() -> None:
    allocs = {
        str(i): Allocation(
            f"{i:064x}",
            f"ns/p{i}",
            "net1",
            f"{i:08x}-6c42-4b4e-9a52-0d1c3b6d7a11",
            "a-long-network-name",
            "a-long-node-name.example",
        )
        for i in range(20000)
    }
    notes = crd.encode_owners(allocs)
    assert sum(len(k) + len(v) for k, v in notes.items()) <= crd.OWNERS_BUDGET
    kept = crd.decode_owners(notes)
    assert 1000 < len(kept) < 20000 and "0" in kept


def test_reservation_object_round_trip() -> None:
    res = Reservation("rdma-2001-db8--1", A, "9")
    obj = crd.reservation_to_object(res, "kube-system")
    assert obj["kind"] == "OverlappingRangeIPReservation"
    assert obj["spec"] == {"containerid": "a" * 64, "podref": "ns/a", "ifname": "net1"}
    assert crd.reservation_from_object(obj) == res
    plain = Reservation("198.51.100.1", B, None)
    obj = crd.reservation_to_object(plain, "kube-system")
    assert "annotations" not in obj["metadata"] and "resourceVersion" not in obj["metadata"]
    assert crd.reservation_from_object(obj) == plain
