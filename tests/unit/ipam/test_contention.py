"""What the engine does under contention on a cluster store: after losing candidates to racers on the
same network it takes the lowest free address after a random point of the range (so 200 racers stop
colliding on the next one), it keeps a reservation it already made, and conflicts count as progress
(ipam.retry)."""

from __future__ import annotations

from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, Reservation
from ipam.retry import Retry
from tests.memstore import Backend, MemoryStore
from tests.unit.helpers import decided

OWNER = Allocation("c1", "ns/p", "net1", "u", "blue", "n")
OTHER = Allocation("c2", "ns/q", "net1", "v", "blue", "n")


def test_the_lowest_free_skips_taken_blocked_and_excluded_addresses() -> None:
    r = from_dict({"datastore": "local", "range": "198.51.100.0/24", "exclude": ["198.51.100.3"]}).ranges[0]
    pool = Pool("p", r.cidr, {"1": OTHER})
    assert decided(r, pool, OWNER, blocked=frozenset({2})).offset == 4  # 1 taken, 2 blocked, 3 excluded


def test_a_reservation_already_made_is_preferred_while_free() -> None:
    r = from_dict({"datastore": "local", "range": "198.51.100.0/24"}).ranges[0]
    pool = Pool("p", r.cidr, {})
    assert decided(r, pool, OWNER, reserved=(9,), start=5).offset == 9
    taken = Pool("p", r.cidr, {"9": OTHER})
    assert decided(r, taken, OWNER, reserved=(9,)).offset == 1


def test_racers_reservations_spread_the_next_pick() -> None:
    backend = Backend()
    store = MemoryStore(backend)
    for i in range(1, 6):  # five racers of this network hold reservations, not yet in the pool
        store.put_reservation(
            Reservation(f"198.51.100.{i}", OTHER._replace(container_id=f"r{i}", podref=f"ns/r{i}"))
        )
    e = Engine(store, from_dict({"datastore": "local", "range": "198.51.100.0/24"}), Retry())
    (got,) = e.add(OWNER)
    assert got[1] >= 6
    res = store.get_reservation(f"198.51.100.{got[1]}")
    assert res is not None and res.owner == OWNER


def test_conflicts_keep_an_operation_going_past_the_deadline_but_not_the_limit() -> None:
    from ipam.retry import retrying
    from ipam.store.base import Conflict

    now = [0.0]
    policy = Retry(deadline=1.0, limit=5.0, clock=lambda: now[0], sleep=lambda s: None, rand=lambda: 0.5)
    calls = []

    def attempt() -> str:
        now[0] += 0.5
        calls.append(now[0])
        if now[0] < 3.0:
            raise Conflict("raced")
        return "done"

    assert retrying(policy, "x", attempt) == "done" and calls[-1] == 3.0
