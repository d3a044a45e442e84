"""Engine: after lost races a call picks among the lowest free candidates at random (ipam.engine._spread),
so hundreds of writers starting together on a cluster store do not queue for one address at a time."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ipam.config import from_dict
from ipam.engine import SPREAD, Engine
from ipam.retry import Retry
from ipam.store.base import Allocation, Reservation
from ipam.store.memory import MemoryStore

A = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")


class Exclusive(MemoryStore):
    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield


def add_with_claims_in_flight(store: MemoryStore, held: int, rand: float) -> str:
    """`held` lowest addresses claimed by other writers that have not committed their pool yet."""
    for i in range(1, held + 1):
        store.put_reservation(Reservation(f"198.51.100.{i}", Allocation(f"other{i}", f"ns/o{i}", "net1")))
    engine = Engine(store, from_dict({"range": "198.51.100.0/24"}), Retry(rand=lambda: rand))
    [(rng, offset)] = engine.add(A)
    return str(rng.address(offset))


def test_one_lost_race_still_takes_the_lowest() -> None:
    assert add_with_claims_in_flight(MemoryStore(), 1, 0.99) == "198.51.100.2"


def test_two_lost_races_spread_over_a_window_that_doubles() -> None:
    assert add_with_claims_in_flight(MemoryStore(), 2, 0.0) == "198.51.100.3"  # the window's first
    assert add_with_claims_in_flight(MemoryStore(), 2, 0.99) == "198.51.100.4"  # window 2 after 2 losses
    last = int(add_with_claims_in_flight(MemoryStore(), 100, 0.99).rsplit(".", 1)[1])
    assert 101 <= last <= 100 + SPREAD  # past the claims, never further than the widest window


def test_stores_that_serialise_writers_never_spread() -> None:
    assert add_with_claims_in_flight(Exclusive(), 3, 0.99) == "198.51.100.4"
