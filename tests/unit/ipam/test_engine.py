"""The engine over the memory store: identity, idempotency, takeover, DEL in every range, exhaustion,
outage, conflicts under a deadline, overlapping-range reservations, CHECK and GC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni.errors import CheckError, CniError, Code, ExhaustedError, TryAgainError
from ipam.config import from_dict
from ipam.engine import Engine, Retry
from ipam.model import Allocation, Pool, PoolUpdate, Reservation, by_attachment, joined
from ipam.operation import Op
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable
from tests.memstore import Backend, MemoryStore

A = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")
B = Allocation("cb", "ns/b", "net1", "uid-b", "netA", "node1")
DUAL = {"ipRanges": [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/64"}]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s + 0.001


def make(
    ipam: dict[str, Any] | None = None,
    backend: Backend | None = None,
    store: Any = None,
    clock: Clock | None = None,
) -> Engine:
    conf = from_dict({"datastore": "local", **(ipam or {"range": "198.51.100.0/24"})})  # a memory store
    clock = clock or Clock()
    retry = Retry(clock=clock, sleep=clock.sleep, rand=lambda: 0.5)
    return Engine(store or MemoryStore(backend or Backend()), conf, retry)


def addrs(got: list[Any]) -> list[str]:
    return [str(r.address(o)) for r, o in got]


def test_add_is_idempotent_per_owner_without_writes() -> None:
    e = make()
    first = addrs(e.add(A))
    version = e.store.get_pool("198.51.100.0-24").version  # type: ignore[union-attr]
    assert addrs(e.add(A)) == first == ["198.51.100.1"]
    assert e.store.get_pool("198.51.100.0-24").version == version  # type: ignore[union-attr]
    assert addrs(e.add(B)) == ["198.51.100.2"]


def test_records_owner_with_uid_network_node() -> None:
    e = make()
    e.add(A)
    assert dict(e.store.get_pool("198.51.100.0-24").allocations) == {"1": A}  # type: ignore[union-attr]


def test_kubelet_re_add_takes_over_and_late_del_of_old_sandbox_is_harmless() -> None:
    e = make()
    e.add(A)
    newer = A._replace(container_id="ca2")
    assert addrs(e.add(newer)) == ["198.51.100.1"]
    e.delete(A)  # the old sandbox's DEL arrives late
    assert dict(e.store.get_pool("198.51.100.0-24").allocations) == {"1": newer}  # type: ignore[union-attr]
    res = e.store.get_reservation("198.51.100.1")
    assert res is not None and res.owner == newer


def test_delete_is_idempotent_and_unknown_owner_is_success() -> None:
    e = make(DUAL)
    e.add(A)
    e.delete(B)
    e.delete(A)
    e.delete(A)
    for name in ("198.51.100.0-24", "2001-db8---64"):
        assert dict(e.store.get_pool(name).allocations) == {}  # type: ignore[union-attr]
    assert list(e.store.iter_reservations()) == []


def test_delete_covers_every_range_even_if_the_first_is_gone() -> None:
    e = make(DUAL)
    e.add(A)
    pool = e.store.get_pool("198.51.100.0-24")
    assert pool is not None
    e.store.commit_pool(pool, PoolUpdate(remove=frozenset(pool.allocations)))
    e.delete(A)
    assert dict(e.store.get_pool("2001-db8---64").allocations) == {}  # type: ignore[union-attr]


def test_dual_stack_one_address_each() -> None:
    e = make({**DUAL, "gateway": "198.51.100.254"})
    assert addrs(e.add(A)) == ["198.51.100.1", "2001:db8::1"]


def test_exhausted_is_code_100_naming_the_range_and_rolls_back_other_ranges() -> None:
    e = make({"ipRanges": [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/126"}]})
    for i in range(3):
        e.add(Allocation(f"c{i}", f"ns/p{i}", "net1"))
    with pytest.raises(ExhaustedError, match="2001:db8::/126") as err:
        e.add(A)
    assert err.value.code == Code.POOL_EXHAUSTED
    v4 = e.store.get_pool("198.51.100.0-24")
    assert v4 is not None and all(a.container_id != "ca" for a in v4.allocations.values())
    assert e.store.get_reservation("198.51.100.4") is None


def test_a_failed_range_never_rolls_back_what_the_caller_holds_beyond_the_call() -> None:
    """`held` (range indexes whose address an IPAMClaim holds, ipam.claims): a later range's failure
    releases the other ranges only."""
    e = make({"ipRanges": [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/126"}]})
    claim = Allocation("ipamclaim/ns/vm.net/u1", "ns/launcher-1", "", "", "netA", "")
    for i in range(3):
        e.add(Allocation(f"c{i}", f"ns/p{i}", "net1"))  # the IPv6 range full
    with pytest.raises(ExhaustedError):
        e.add(claim, {0: 7}, held={0})
    v4 = e.store.get_pool("198.51.100.0-24")
    assert v4 is not None and v4.allocations["7"] == claim
    assert e.store.get_reservation("198.51.100.7") is not None
    with pytest.raises(ExhaustedError):
        e.add(claim, {0: 7})  # without `held`: released as before
    v4 = e.store.get_pool("198.51.100.0-24")
    assert v4 is not None and "7" not in v4.allocations
    assert e.store.get_reservation("198.51.100.7") is None


@pytest.mark.parametrize("op", ["add", "delete", "check"])
def test_unreachable_store_is_code_11(op: str) -> None:
    clock = Clock()
    e = make(backend=Backend(down=True), clock=clock)
    with pytest.raises(StoreUnavailable) as err:
        getattr(e, op)(A)
    assert err.value.code == Code.TRY_AGAIN_LATER
    if op != "check":
        assert clock.now >= Retry().outage and clock.now < Retry().outage + 1  # retried briefly, then 11


class Busy(MemoryStore):
    """An overloaded store: every pool read answers StoreBusy for the first `n` seconds of the clock."""

    def __init__(self, backend: Backend, clock: Clock, until: float) -> None:
        super().__init__(backend)
        self.clock, self.until = clock, until

    def get_pool(self, name: str) -> Pool | None:
        if self.clock.now < self.until:
            raise StoreBusy("kubernetes: get ippools: 504 Timeout")
        return super().get_pool(name)


def test_a_busy_store_is_retried_past_the_outage_grace_within_the_limit() -> None:
    clock = Clock()
    e = make(store=Busy(Backend(), clock, until=Retry().outage * 3), clock=clock)
    assert addrs(e.add(A)) == ["198.51.100.1"]  # still busy after the outage grace: retried, then done
    assert clock.now >= Retry().outage * 3
    clock2 = Clock()
    never = make(store=Busy(Backend(), clock2, until=1e9), clock=clock2)
    with pytest.raises(StoreBusy):
        never.add(A)
    assert Retry().limit <= clock2.now < Retry().limit + 2  # bounded like conflicts: then code 11


class Flaky(MemoryStore):
    """Raises Conflict on the first `n` pool commits (as if another writer won each race)."""

    def __init__(self, backend: Backend, n: int, meddle: Any = None) -> None:
        super().__init__(backend)
        self.n, self.commits, self.meddle = n, 0, meddle

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.commits += 1
        if self.commits <= self.n:
            if self.meddle:
                self.meddle(self)
            raise Conflict("injected")
        return super().commit_pool(pool, update)


def test_conflicts_are_retried_with_jittered_growing_backoff() -> None:
    clock = Clock()
    e = make(store=Flaky(Backend(), 5), clock=clock)
    assert addrs(e.add(A)) == ["198.51.100.1"]
    assert len(clock.sleeps) == 5 and clock.sleeps == sorted(clock.sleeps)
    assert all(s <= Retry().cap for s in clock.sleeps)


def test_endless_conflicts_give_up_with_code_11_after_the_limit() -> None:
    """Conflicts are progress elsewhere (retried past `deadline`), but never past `limit`."""
    clock = Clock()
    e = make(store=Flaky(Backend(), 10**9), clock=clock)
    with pytest.raises(TryAgainError, match="gave up after") as err:
        e.add(A)
    assert err.value.code == Code.TRY_AGAIN_LATER
    assert Retry().deadline < Retry().limit < clock.now < Retry().limit + 1


def test_candidate_lost_to_a_writer_drops_the_reservation_it_made() -> None:
    def intruder(store: MemoryStore) -> None:
        pool = MemoryStore.get_pool(store, "198.51.100.0-24") or Pool("198.51.100.0-24", "198.51.100.0/24")
        MemoryStore.commit_pool(store, pool, PoolUpdate(put={"1": B}))

    e = make(store=Flaky(Backend(), 1, intruder))
    assert addrs(e.add(A)) == ["198.51.100.2"]
    assert e.store.get_reservation("198.51.100.1") is None
    res = e.store.get_reservation("198.51.100.2")
    assert res is not None and res.owner == A


def test_overlapping_ranges_never_share_an_address() -> None:
    backend = Backend()
    wide = make({"range": "198.51.100.0/24"}, backend)
    narrow = make({"range": "198.51.100.0/28"}, backend)
    assert addrs(wide.add(A)) == ["198.51.100.1"]
    # .1 is wide's: a race lost, then the lowest free after the retry's point (0.5 of .1-.14)
    assert addrs(narrow.add(B)) == ["198.51.100.8"]
    assert addrs(wide.add(A._replace(container_id="c3", podref="ns/c"))) == ["198.51.100.2"]


def test_overlapping_off_means_pools_are_independent_and_no_reservations() -> None:
    backend = Backend()
    wide = make({"range": "198.51.100.0/24", "enable_overlapping_ranges": False}, backend)
    narrow = make({"range": "198.51.100.0/28", "enable_overlapping_ranges": False}, backend)
    assert addrs(wide.add(A)) == addrs(narrow.add(B)) == ["198.51.100.1"]
    assert list(MemoryStore(backend).iter_reservations()) == []


def test_network_name_prefixes_pools_and_reservations() -> None:
    e = make({"range": "2001:db8::/64", "network_name": "blue"})
    e.add(A)
    assert e.store.get_pool("blue-2001-db8---64") is not None
    assert e.store.get_reservation("blue-2001-db8--1") is not None
    other = make({"range": "2001:db8::/64"}, e.store.backend)  # type: ignore[attr-defined]
    assert addrs(other.add(B)) == ["2001:db8::1"]  # another network: independent


def test_reservation_without_pool_entry_is_reused_by_its_owner() -> None:
    e = make()
    e.store.put_reservation(Reservation("198.51.100.1", A))  # a crash after the claim, before the pool
    assert addrs(e.add(A)) == ["198.51.100.1"]
    assert addrs(e.add(B)) == ["198.51.100.2"]


def test_upstream_reservation_of_the_same_pod_is_taken_over() -> None:
    e = make()
    e.store.put_reservation(Reservation("198.51.100.1", Allocation("", "ns/a", "")))
    assert addrs(e.add(A)) == ["198.51.100.1"]
    res = e.store.get_reservation("198.51.100.1")
    assert res is not None and res.owner == A


def test_pool_whose_range_has_host_bits_is_the_same_pool() -> None:
    e = make()
    e.store.commit_pool(Pool("198.51.100.0-24", "198.51.100.7/24"), PoolUpdate(put={"1": B}))
    assert addrs(e.add(A)) == ["198.51.100.2"]


def test_pool_holding_another_range_is_refused() -> None:
    e = make()
    e.store.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/25"), PoolUpdate())
    with pytest.raises(CniError, match="holds range") as err:
        e.add(A)
    assert err.value.code == Code.INVALID_CONFIG


def test_check() -> None:
    e = make(DUAL)
    e.add(A)
    e.check(A)
    with pytest.raises(CheckError, match="no allocation"):
        e.check(B)
    res = e.store.get_reservation("2001-db8--1")
    assert res is not None
    e.store.delete_reservation(res)
    with pytest.raises(CheckError, match="reservation"):
        e.check(A)


def lean_engine(tmp_path: Path, ipam: dict[str, Any]) -> Engine:
    """An engine configured for the Kubernetes store (lean pools with overlapping ranges) on a memory
    store, its node locks in tmp_path."""
    conf = from_dict({**ipam, "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "state" / "ipam.db")})  # fmt: skip
    clock = Clock()
    return Engine(MemoryStore(Backend()), conf, Retry(clock=clock, sleep=clock.sleep, rand=lambda: 0.5))


@pytest.mark.parametrize("lean", [False, True], ids=["extras-in-pool", "lean-pool"])
def test_gc_releases_only_its_networks_stale_attachments_on_this_node(lean: bool, tmp_path: Path) -> None:
    """Lean pools (the Kubernetes store with overlapping ranges): the entries carry no extras, GC judges
    them by their reservations'."""
    e = lean_engine(tmp_path, DUAL) if lean else make(DUAL)
    keep = A
    stale = B
    other_net = B._replace(container_id="co", podref="ns/o", network="netB")
    other_node = B._replace(container_id="cn", podref="ns/n", node="node2")
    legacy = Allocation("cl", "ns/l", "net1")
    for who in (keep, stale, other_net, other_node, legacy):
        e.add(who)
    for name in ("198.51.100.0-24", "2001-db8---64"):
        pool = e.store.get_pool(name)
        assert pool is not None and len(pool.allocations) == 5
        assert lean == (not any(a.has_extras() for a in pool.allocations.values()))
    e.gc("netA", "node1", {("ca", "net1")})
    for name in ("198.51.100.0-24", "2001-db8---64"):
        pool = e.store.get_pool(name)
        assert pool is not None
        assert {a.container_id for a in pool.allocations.values()} == {"ca", "co", "cn", "cl"}
    assert {r.owner.container_id for r in e.store.iter_reservations()} == {"ca", "co", "cn", "cl"}


def test_an_entry_without_extras_takes_those_of_its_attachments_reservation() -> None:
    """ipam.model.joined: only an entry with no extras of its own, only from a reservation of the same
    attachment (container id and ifname) that has extras; upstream's reservations name no container."""
    upstream = Allocation("", "ns/b", "net1")  # an upstream reservation: no container id, no extras
    extras = by_attachment([A, upstream, Allocation("cc", "ns/c", "net1")])
    assert list(extras) == [("ca", "net1")]
    assert joined(A.bare(), extras) == A
    assert joined(A.bare()._replace(podref="ns/renamed"), extras) == A._replace(podref="ns/renamed")
    assert joined(B.bare(), extras) == B.bare()  # no reservation of its attachment
    assert joined(A._replace(container_id="cx"), extras).container_id == "cx"  # extras of its own: as is
    assert joined(Allocation("ca", "ns/a", "net2"), extras) == Allocation("ca", "ns/a", "net2")


def test_pools_are_lean_only_on_the_kubernetes_store_with_overlapping_ranges(tmp_path: Path) -> None:
    def lean(e: Engine) -> bool:  # (the ops of one engine's config)
        return e.lean_for(Op("add", e.conf.ranges[0], A, e.conf.overlapping))

    assert lean(lean_engine(tmp_path, {"range": "198.51.100.0/24"}))
    assert not lean(lean_engine(tmp_path, {"range": "198.51.100.0/24", "enable_overlapping_ranges": False}))
    slices = {"range": "198.18.0.0/16", "node_slice_size": "/24", "network_name": "rdma"}
    assert lean(lean_engine(tmp_path, slices))
    assert not lean(make({"range": "198.51.100.0/24"}))  # the local store: nothing to save
