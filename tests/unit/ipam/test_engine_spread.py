"""Engine: a call takes the lowest free address; after a race lost (a candidate another writer of its
network reserved first) it takes the lowest free after a random point of the range (ipam.attempt
Attempt._wanted), so hundreds of writers starting together on a cluster store do not queue for one
address at a time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.retry import Retry
from ipam.store.base import Conflict
from tests.memstore import MemoryStore

A = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")


class Exclusive(MemoryStore):
    serial = True

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield


def add_with_claims_in_flight(
    store: MemoryStore, held: int, rand: float, *more: float, network: str = "netA"
) -> str:
    """`held` lowest addresses claimed by other writers (of `network`) not yet in the pool."""
    for i in range(1, held + 1):
        other = Allocation(f"other{i}", f"ns/o{i}", "net1", "", network)
        store.put_reservation(Reservation(f"198.51.100.{i}", other))
    rands = iter([rand, *more])
    conf = from_dict({"datastore": "local", "range": "198.51.100.0/24"})
    engine = Engine(store, conf, Retry(rand=lambda: next(rands, rand)))
    [(rng, offset)] = engine.add(A)
    return str(rng.address(offset))


def test_without_a_lost_race_the_lowest_free() -> None:
    assert add_with_claims_in_flight(MemoryStore(), 0, 0.99) == "198.51.100.1"


def test_a_lost_race_takes_the_lowest_free_after_a_random_point() -> None:
    # .1 reserved by a racer: the next candidate is the lowest free at or after the point's offset
    # (198.51.100.0/24: offsets 1-254; 0.5 -> offset 1 + 127)
    assert add_with_claims_in_flight(MemoryStore(), 1, 0.5) == "198.51.100.128"
    assert add_with_claims_in_flight(MemoryStore(), 1, 0.99) == "198.51.100.252"
    assert add_with_claims_in_flight(MemoryStore(), 1, 0.0) == "198.51.100.2"  # the point at the start


def test_each_race_lost_draws_again_and_the_walk_ends_past_the_claims() -> None:
    assert add_with_claims_in_flight(MemoryStore(), 100, 0.0) == "198.51.100.101"
    assert add_with_claims_in_flight(MemoryStore(), 100, 0.99) == "198.51.100.252"


def test_addresses_of_other_networks_are_no_lost_race() -> None:
    """An overlapping range of another network holds them: walk past them to the lowest free one."""
    assert add_with_claims_in_flight(MemoryStore(), 5, 0.99, network="netB") == "198.51.100.6"


def test_stores_that_serialise_writers_never_spread() -> None:
    assert add_with_claims_in_flight(Exclusive(), 3, 0.99) == "198.51.100.4"


class LosesFirstCommit(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.commits = 0

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.commits += 1
        if self.commits == 1:
            raise Conflict("another writer committed the pool first")
        return super().commit_pool(pool, update)


def test_a_lost_pool_commit_keeps_the_address_this_call_reserved() -> None:
    """Scattered to .252 after losing .1, lose the pool commit: the retry stays on .252 (its reservation)
    instead of hopping to .2 and leaving a stray reservation in other writers' way."""
    store = LosesFirstCommit()
    assert add_with_claims_in_flight(store, 2, 0.99, 0.0, 0.0) == "198.51.100.252"  # 0.0: would pick .2
    assert store.commits == 2
    names = sorted(r.name for r in store.iter_reservations())
    assert names == ["198.51.100.1", "198.51.100.2", "198.51.100.252"]


def test_del_frees_a_reservation_left_without_a_pool_entry() -> None:
    """An ADD killed between claiming the address and writing the pool: the DEL of that attachment
    (which finds nothing in the pool) still frees the reservation; others' reservations stay."""
    store = MemoryStore()
    store.put_reservation(Reservation("198.51.100.7", A))
    store.put_reservation(Reservation("198.51.100.8", Allocation("other", "ns/o", "net1", "", "netA")))
    engine = Engine(store, from_dict({"datastore": "local", "range": "198.51.100.0/24"}))
    engine.delete(A)
    assert [r.name for r in store.iter_reservations()] == ["198.51.100.8"]
    engine.delete(A)  # idempotent
    assert [r.name for r in store.iter_reservations()] == ["198.51.100.8"]


def test_stores_that_serialise_writers_do_not_sweep() -> None:
    store = Exclusive()
    store.put_reservation(Reservation("198.51.100.7", A))  # cannot happen there: one transaction
    Engine(store, from_dict({"datastore": "local", "range": "198.51.100.0/24"})).delete(A)
    assert [r.name for r in store.iter_reservations()] == ["198.51.100.7"]


class SlowServer(MemoryStore):
    """Each reservation request takes a second of the injected clock (a loaded API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def put_reservation(self, res: Reservation) -> str:
        self.now += 1.0
        return super().put_reservation(res)

    def get_reservation(self, name: str) -> Reservation | None:
        self.now += 1.0
        return super().get_reservation(name)


def test_walking_past_many_addresses_of_other_networks_is_progress_on_a_slow_server() -> None:
    """40 addresses held by another network's reservations cost two requests each to step over: on a
    server that answers in a second, longer than the retry's deadline without progress (30 s). Each
    address found steadily held is progress (the walk is bounded by the range), so the ADD gets the
    41st; only the absolute limit (120 s) bounds it."""
    store = SlowServer()
    for i in range(1, 41):
        other = Allocation(f"other{i}", f"ns/o{i}", "net1", "", "netB")
        store.put_reservation(Reservation(f"198.51.100.{i}", other))
    store.now = 0.0
    conf = from_dict({"datastore": "local", "range": "198.51.100.0/24"})
    engine = Engine(store, conf, Retry(clock=store.clock, sleep=lambda s: None, rand=lambda: 0.5))
    [(rng, offset)] = engine.add(A)
    assert str(rng.address(offset)) == "198.51.100.41"
    assert store.now > Retry().deadline  # the walk did take longer than the deadline
