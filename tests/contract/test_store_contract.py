"""The store contract (ipam/store/base.py), run over every factory in tests/contract/factories.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from cni.errors import Code
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict, Store, StoreUnavailable
from tests.contract.factories import Factory
from tests.skips import NO_EXCLUSIVE, NO_VIEW_POOL

CID = "3f" * 32  # a 64-hex container id, as runtimes make them
A = Allocation(CID, "default/pod-a", "net1", "5a1c1b9e-6c42-4b4e-9a52-0d1c3b6d7a11", "rdma-a", "node-1")
B = Allocation("b" * 64, "default/pod-b", "net2")  # as upstream writes it: no pycni extras
C = Allocation("c" * 64, "ns-c/pod-c", "net1", "uid-c")


def create(
    store: Store,
    name: str = "198.51.100.0-24",
    rng: str = "198.51.100.0/24",
    put: dict[str, Allocation] | None = None,
) -> str:
    return store.commit_pool(Pool(name, rng), PoolUpdate(put=put or {}))


def race(n: int, factory: Factory, fn: Callable[[Store, int], Any]) -> list[Any]:
    """Run fn(handle, i) in n threads released together; return results (exceptions as values)."""
    handles = [factory.open() for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(handles[i], i)
        except Exception as e:
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for h in handles:
        h.close()
    assert not [t for t in threads if t.is_alive()], "a call did not return within 60 s"
    return results


# ---- pools ----------------------------------------------------------------------------------------


def test_missing_pool_is_none(store: Store) -> None:
    assert store.get_pool("198.51.100.0-24") is None


def test_create_and_read_back_exactly(store: Store) -> None:
    version = create(store, put={"1": A, "2": B, "254": C})
    pool = store.get_pool("198.51.100.0-24")
    assert pool is not None
    assert (pool.name, pool.range, pool.version) == ("198.51.100.0-24", "198.51.100.0/24", version)
    assert dict(pool.allocations) == {"1": A, "2": B, "254": C}
    assert all(type(a) is Allocation for a in pool.allocations.values())


def test_create_empty_pool(store: Store) -> None:
    create(store)
    pool = store.get_pool("198.51.100.0-24")
    assert pool is not None and dict(pool.allocations) == {} and pool.version is not None


def test_other_handles_see_writes(factory: Factory, store: Store) -> None:
    create(store, put={"7": A})
    other = factory.open()
    try:
        pool = other.get_pool("198.51.100.0-24")
        assert pool is not None and dict(pool.allocations) == {"7": A}
    finally:
        other.close()


def test_create_when_it_exists_conflicts(store: Store) -> None:
    create(store, put={"1": A})
    with pytest.raises(Conflict) as e:
        create(store, put={"1": B})
    assert e.value.code == Code.TRY_AGAIN_LATER
    pool = store.get_pool("198.51.100.0-24")
    assert pool is not None and dict(pool.allocations) == {"1": A}


def merges(store: Store) -> bool:
    """A store that applies a commit to the pool as it is now, guarded entry by entry (ipam.store.base:
    `merges`), instead of only to the version it was computed from."""
    return store.merges


def test_stale_version_conflicts_and_changes_nothing(store: Store) -> None:
    create(store, put={"1": A})
    snap = store.get_pool("198.51.100.0-24")
    assert snap is not None
    v2 = store.commit_pool(snap, PoolUpdate(put={"2": B}))
    if merges(store):  # the stale snapshot's change to other entries goes through, merged ...
        store.commit_pool(snap, PoolUpdate(put={"3": C}, remove=frozenset({"1"})))
        now = store.get_pool("198.51.100.0-24")
        assert now is not None and dict(now.allocations) == {"2": B, "3": C}
        # ... but an entry changed since the snapshot conflicts and nothing of the commit is applied
        with pytest.raises(Conflict):
            store.commit_pool(snap, PoolUpdate(put={"2": C, "4": A}))
        after = store.get_pool("198.51.100.0-24")
        assert after is not None and after.version == now.version
        assert dict(after.allocations) == {"2": B, "3": C}
        return
    with pytest.raises(Conflict):
        store.commit_pool(snap, PoolUpdate(put={"3": C}, remove=frozenset({"1"})))
    now = store.get_pool("198.51.100.0-24")
    assert now is not None and now.version == v2 and dict(now.allocations) == {"1": A, "2": B}


def test_put_replaces_and_remove_removes(store: Store) -> None:
    create(store, put={"1": A, "2": B})
    snap = store.get_pool("198.51.100.0-24")
    assert snap is not None
    moved = A._replace(container_id="d" * 64)
    store.commit_pool(snap, PoolUpdate(put={"1": moved, "3": C}, remove=frozenset({"2", "99"})))
    now = store.get_pool("198.51.100.0-24")
    assert now is not None and dict(now.allocations) == {"1": moved, "3": C}


def test_removing_everything_keeps_an_empty_pool(store: Store) -> None:
    create(store, put={"1": A, "2": B})
    snap = store.get_pool("198.51.100.0-24")
    assert snap is not None
    store.commit_pool(snap, PoolUpdate(remove=frozenset({"1", "2"})))
    now = store.get_pool("198.51.100.0-24")
    assert now is not None and dict(now.allocations) == {}


def test_range_is_set_on_create_only(store: Store) -> None:
    create(store)
    snap = store.get_pool("198.51.100.0-24")
    assert snap is not None
    other_range = Pool(snap.name, "198.51.100.0/25", snap.allocations, snap.version)
    store.commit_pool(other_range, PoolUpdate(put={"1": A}))
    now = store.get_pool("198.51.100.0-24")
    assert now is not None and now.range == "198.51.100.0/24"


def test_versions_never_come_back(store: Store) -> None:
    """No ABA: after changes that restore the same content, an old snapshot still conflicts."""
    create(store, put={"1": A})
    first = store.get_pool("198.51.100.0-24")
    assert first is not None
    seen = {first.version}
    snap = first
    for update in (PoolUpdate(put={"2": B}), PoolUpdate(remove=frozenset({"2"}))):
        version = store.commit_pool(snap, update)
        assert version not in seen
        seen.add(version)
        snap = store.get_pool("198.51.100.0-24")  # type: ignore[assignment]
    assert dict(snap.allocations) == dict(first.allocations)
    if merges(store):  # guarded per entry: entry 3 is still absent, so it merges, at a new version
        assert store.commit_pool(first, PoolUpdate(put={"3": C})) not in seen
        return
    with pytest.raises(Conflict):
        store.commit_pool(first, PoolUpdate(put={"3": C}))


def test_ipv6_offsets_of_any_size(store: Store) -> None:
    keys = ["1", str(2**63 - 1), str(2**63), str(2**64 - 2), str(2**100 + 7)]
    put = {k: Allocation(f"c{i}", f"ns/p{i}", "net1") for i, k in enumerate(keys)}
    create(store, "2001-db8---32", "2001:db8::/32", put)
    pool = store.get_pool("2001-db8---32")
    assert pool is not None and dict(pool.allocations) == put


def test_many_allocations_round_trip(store: Store) -> None:
    put = {str(i): Allocation(f"{i:064x}", f"ns/pod-{i}", "net1") for i in range(1, 3001)}
    for i in range(1, 3001, 6):
        put[str(i)] = put[str(i)]._replace(pod_uid=f"uid-{i}", network="big", node="node-7")
    create(store, "198.18.0.0-15", "198.18.0.0/15", put)
    pool = store.get_pool("198.18.0.0-15")
    assert pool is not None and dict(pool.allocations) == put


def test_iter_pools_is_lazy_and_complete(store: Store) -> None:
    expected = {}
    for i in range(120):
        rng = f"198.18.{i}.0/24"
        name = f"net{i % 3}-198.18.{i}.0-24"
        put = {str(i + 1): Allocation(f"c{i}", f"ns/p{i}", "net1", f"uid-{i}")}
        create(store, name, rng, put)
        expected[name] = (rng, put)
    it = store.iter_pools()
    assert iter(it) is it  # a generator/iterator, not a list
    got = {}
    for pool in it:
        assert pool.version is not None
        got[pool.name] = (pool.range, dict(pool.allocations))
    assert got == expected


def test_concurrent_commits_on_one_snapshot_one_wins(factory: Factory, store: Store) -> None:
    """Eight writers of one snapshot: a compare-and-swap store lets one win; on a merging store eight
    writers of different entries all get in."""
    create(store)
    snap = store.get_pool("198.51.100.0-24")
    assert snap is not None
    if merges(store):  # each writer commits what it read itself: different entries all go in
        results = race(8, factory, lambda h, i: h.commit_pool(
            h.get_pool("198.51.100.0-24"), PoolUpdate(put={str(i + 1): A})))  # fmt: skip
        assert all(isinstance(r, str) for r in results), results
        now = store.get_pool("198.51.100.0-24")
        assert now is not None and dict(now.allocations) == {str(i + 1): A for i in range(8)}
        return
    results = race(8, factory, lambda h, i: h.commit_pool(snap, PoolUpdate(put={str(i + 1): A})))
    wins = [i for i, r in enumerate(results) if isinstance(r, str)]
    now = store.get_pool("198.51.100.0-24")
    assert now is not None
    assert len(wins) == 1, results
    assert all(isinstance(r, Conflict) for i, r in enumerate(results) if i not in wins), results
    assert dict(now.allocations) == {str(wins[0] + 1): A}


def test_concurrent_creates_one_wins(factory: Factory, store: Store) -> None:
    results = race(8, factory, lambda h, i: create(h, put={str(i + 1): A}))
    wins = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert len(wins) == 1 and all(isinstance(r, Conflict) for r in results if not isinstance(r, str)), results
    now = store.get_pool("198.51.100.0-24")
    assert now is not None and dict(now.allocations) == {str(wins[0] + 1): A}


# ---- reservations ---------------------------------------------------------------------------------

NAME = "2001-db8--5"


def test_reservation_lifecycle(store: Store) -> None:
    assert store.get_reservation(NAME) is None
    v1 = store.put_reservation(Reservation(NAME, A))
    got = store.get_reservation(NAME)
    assert got == Reservation(NAME, A, v1)
    v2 = store.put_reservation(Reservation(NAME, C, v1))
    assert v2 != v1
    assert store.get_reservation(NAME) == Reservation(NAME, C, v2)
    store.delete_reservation(Reservation(NAME, C, v2))
    assert store.get_reservation(NAME) is None
    store.delete_reservation(Reservation(NAME, C, v2))  # already gone: success


def test_reservation_create_when_exists_conflicts(store: Store) -> None:
    v1 = store.put_reservation(Reservation(NAME, A))
    with pytest.raises(Conflict):
        store.put_reservation(Reservation(NAME, B))
    assert store.get_reservation(NAME) == Reservation(NAME, A, v1)


def test_reservation_stale_writes_conflict(store: Store) -> None:
    v1 = store.put_reservation(Reservation(NAME, A))
    v2 = store.put_reservation(Reservation(NAME, B, v1))
    with pytest.raises(Conflict):
        store.put_reservation(Reservation(NAME, C, v1))
    with pytest.raises(Conflict):
        store.delete_reservation(Reservation(NAME, A, v1))
    assert store.get_reservation(NAME) == Reservation(NAME, B, v2)


def test_reservation_update_of_a_deleted_one_conflicts(store: Store) -> None:
    v1 = store.put_reservation(Reservation(NAME, A))
    store.delete_reservation(Reservation(NAME, A, v1))
    with pytest.raises(Conflict):
        store.put_reservation(Reservation(NAME, B, v1))
    assert store.get_reservation(NAME) is None


def test_reservation_owner_without_extras_round_trips(store: Store) -> None:
    v = store.put_reservation(Reservation("198.51.100.9", B))
    assert store.get_reservation("198.51.100.9") == Reservation("198.51.100.9", B, v)


def test_iter_reservations(store: Store) -> None:
    expected = {}
    for i in range(70):
        name = f"net-198.51.100.{i}"
        owner = Allocation(f"c{i}", f"ns/p{i}", "net1", f"uid-{i}", "net", "node-1")
        expected[name] = (owner, store.put_reservation(Reservation(name, owner)))
    it = store.iter_reservations()
    assert iter(it) is it
    assert {r.name: (r.owner, r.version) for r in it} == expected


def test_concurrent_reservation_creates_one_wins(factory: Factory, store: Store) -> None:
    results = race(8, factory, lambda h, i: h.put_reservation(Reservation(NAME, A._replace(ifname=f"n{i}"))))
    wins = [i for i, r in enumerate(results) if isinstance(r, str)]
    assert len(wins) == 1 and all(isinstance(r, Conflict) for r in results if not isinstance(r, str)), results
    got = store.get_reservation(NAME)
    assert got is not None and got.owner.ifname == f"n{wins[0]}"


# ---- optional fast paths (ipam/store/base.py): tested where a store offers them ---------------


def test_exclusive_is_atomic_when_offered(store: Store) -> None:
    if not store.serial:
        pytest.skip(NO_EXCLUSIVE)
    unit = store.exclusive()
    assert unit is not None
    with pytest.raises(ValueError), unit:
        store.put_reservation(Reservation(NAME, A))
        create(store, put={"1": A})
        raise ValueError("rolled back")
    assert store.get_reservation(NAME) is None and store.get_pool("198.51.100.0-24") is None


def test_view_pool_answers_like_a_snapshot_when_offered(store: Store) -> None:
    from ipam.allocator import SnapshotView

    if not store.serial or type(store).view_pool is Store.view_pool:
        pytest.skip(NO_VIEW_POOL)
    viewer, exclusive = store.view_pool, store.exclusive
    create(store, put={"1": A, "2": B, "4": C, "5": A._replace(ifname="net9")})
    pool = store.get_pool("198.51.100.0-24")
    assert pool is not None
    snap = SnapshotView(pool)
    unit = exclusive()
    assert unit is not None
    with unit:
        view = viewer("198.51.100.0-24")
        assert view is not None
        assert (view.name, view.range, view.version, view.count()) == (pool.name, pool.range, pool.version, 4)
        for segments, blocked in (
            ([(1, 254)], frozenset()),
            ([(1, 254)], frozenset({3})),
            ([(4, 5)], frozenset()),
        ):
            assert view.lowest_free(segments, blocked) == snap.lowest_free(segments, blocked)
        for who in (A, B, C._replace(container_id="zz")):
            assert view.owned(who) == snap.owned(who) and view.owned(who, True) == snap.owned(who, True)
        assert viewer("missing") is None


# ---- health ---------------------------------------------------------------------------------------


def test_ping(store: Store) -> None:
    store.ping()


CALLS: dict[str, Callable[[Store], Any]] = {
    "ping": lambda s: s.ping(),
    "get_pool": lambda s: s.get_pool("198.51.100.0-24"),
    "commit_pool": lambda s: create(s, put={"1": A}),
    "iter_pools": lambda s: next(iter(s.iter_pools()), None),
    "get_reservation": lambda s: s.get_reservation(NAME),
    "put_reservation": lambda s: s.put_reservation(Reservation(NAME, A)),
    "delete_reservation": lambda s: s.delete_reservation(Reservation(NAME, A, "1")),
    "iter_reservations": lambda s: next(iter(s.iter_reservations()), None),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_unreachable_store_says_try_again(factory: Factory, call: str) -> None:
    store = factory.unreachable()
    try:
        with pytest.raises(StoreUnavailable) as e:
            CALLS[call](store)
        assert e.value.code == Code.TRY_AGAIN_LATER
        assert e.value.msg
    finally:
        store.close()
