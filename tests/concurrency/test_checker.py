"""The storm's checker must be able to fail: each kind of inconsistency it claims to find, planted."""

from __future__ import annotations

from pathlib import Path

from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from tests.concurrency.harness import base_conf, check
from tests.memstore import MemoryStore

A = Allocation("ca", "ns/a", "net1", "", "netA")
B = Allocation("cb", "ns/b", "net1", "", "netB")


def setup(tmp_path: Path) -> tuple[MemoryStore, list[dict[str, object]]]:
    store = MemoryStore()
    confs = [
        base_conf("netA", {}, tmp_path, range="198.18.1.0/24"),
        base_conf("netB", {}, tmp_path, range="198.18.1.0/25"),
    ]
    store.commit_pool(Pool("198.18.1.0-24", "198.18.1.0/24"), PoolUpdate(put={"1": A}))
    store.put_reservation(Reservation("198.18.1.1", A))
    return store, confs


def test_consistent_state_passes(tmp_path: Path) -> None:
    store, confs = setup(tmp_path)
    problems, owners = check(store, confs)
    assert problems == [] and owners == {("netA", "ca", "net1"): ["198.18.1.1"]}


def test_same_ip_in_overlapping_pools(tmp_path: Path) -> None:
    store, confs = setup(tmp_path)
    store.commit_pool(Pool("198.18.1.0-25", "198.18.1.0/25"), PoolUpdate(put={"1": B}))
    problems, _ = check(store, confs)
    assert any("held twice" in p for p in problems) and any("reservation 198.18.1.1" in p for p in problems)


def test_missing_and_orphan_reservations(tmp_path: Path) -> None:
    store, confs = setup(tmp_path)
    res = store.get_reservation("198.18.1.1")
    assert res is not None
    store.delete_reservation(res)
    store.put_reservation(Reservation("198.18.1.9", B))
    problems, _ = check(store, confs)
    assert any("expected ('ca', 'net1'), found None" in p for p in problems)
    assert any("198.18.1.9" in p and "no allocation" in p for p in problems)


def test_two_addresses_for_one_attachment_and_unallocatable(tmp_path: Path) -> None:
    store, confs = setup(tmp_path)
    pool = store.get_pool("198.18.1.0-24")
    assert pool is not None
    store.commit_pool(pool, PoolUpdate(put={"2": A, "255": B}))
    problems, _ = check(store, confs)
    assert any("two addresses" in p for p in problems) and any("not allocatable" in p for p in problems)
