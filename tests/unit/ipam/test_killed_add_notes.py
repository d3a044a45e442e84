"""What an ADD killed between its reservation and its pool write left (ipam.reservations): the node lock's
notes (ipam.nodelock) are taken off by the lock's release, whatever ends the holder's body, and stay
when the holder dies (a child process that exits without unwinding); the next holder frees the
reservation a note names unless the pool holds its address or it names another attachment now."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from ipam import nodelock, reservations
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.retry import Retry
from ipam.store.base import StoreUnavailable
from tests.memstore import Backend, MemoryStore
from tests.nsutil import REPO

A = Allocation("ca", "ns/a", "net1", "uid-a", "n", "node1")
A2 = Allocation("ca2", "ns/a", "net1", "uid-a", "n", "node1")  # a new sandbox of the same pod
B = Allocation("cb", "ns/b", "net1", "uid-b", "n", "node1")
POOL = "198.51.100.0-24"


def _die_holding(path: Path, *notes: tuple[str, int, Allocation]) -> None:
    """A process that takes the lock, notes `notes` and dies without unwinding (as under SIGKILL)."""
    lines = ", ".join(f"({n!r}, {o}, Allocation(*{list(a)!r}))" for n, o, a in notes)
    code = ("import os\nfrom ipam import nodelock, reservations\nfrom ipam.model import Allocation\n"
            f"with nodelock.held({str(path)!r}) as lock:\n"
            f"    for n, o, a in [{lines}]:\n        reservations.note_claim(lock, n, o, a)\n"
            "    os._exit(0)\n")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_notes_are_taken_off_at_the_release_and_stay_when_the_holder_dies(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "p.lock"
    with nodelock.held(str(path)) as lock:
        assert lock is not None and lock.left == []
        reservations.note_claim(lock, "198.51.100.2", 2, A)
    assert path.stat().st_size == 8  # the counter alone
    with contextlib.suppress(RuntimeError), nodelock.held(str(path)) as lock:
        reservations.note_claim(lock, "198.51.100.2", 2, A)
        raise RuntimeError("the attempt failed")
    assert path.stat().st_size == 8
    _die_holding(path, ("198.51.100.2", 2, A), ("198.51.100.3", 3, B))
    with nodelock.held(str(path)) as lock:
        assert lock is not None and len(lock.left) == 2 and lock.count == 4
        del lock.left[0]  # dealt with; the other one not yet
        reservations.note_claim(lock, "198.51.100.4", 4, A2)  # this holder's own: taken off at the release
    with nodelock.held(str(path)) as lock:
        assert lock is not None and [b'"198.51.100.3"' in x for x in lock.left] == [True]
        lock.left.clear()
    with nodelock.held(str(path)) as lock:
        assert lock is not None and lock.left == []
    assert path.stat().st_size == 8


class FlakyStore(MemoryStore):
    """Reservation deletions fail while `down` is set."""

    down = False

    def delete_reservation(self, res: Reservation) -> None:
        if self.down:
            raise StoreUnavailable("reservations: down")
        super().delete_reservation(res)


def _engine(tmp: Path) -> tuple[Engine, FlakyStore, Path]:
    conf = from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes", "network_name": "",
                      "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp / "state" / "whereabouts.db")})  # fmt: skip
    store = FlakyStore(Backend())
    e = Engine(store, conf, Retry(outage=0.0, sleep=lambda s: None, rand=lambda: 0.0))  # lost: the next
    return e, store, Path(nodelock.path_for(e.lock_dir, e.identity, "node1", POOL))


def test_the_next_holder_frees_what_a_dead_holder_reserved_and_never_wrote(tmp_path: Path) -> None:
    """A's ADD died after reserving .1: whoever holds the pool's lock next (here B's ADD) frees it and
    allocates as usual; A's retry with a new sandbox then gets an address with nothing left of A."""
    e, store, path = _engine(tmp_path)
    store.put_reservation(Reservation("198.51.100.1", A))
    _die_holding(path, ("198.51.100.1", 1, A))
    assert e.add(B) == [(e.conf.ranges[0], 1)]
    assert {n: r.owner for n, r in store.backend.reservations.items()} == {"198.51.100.1": B}
    assert [off for _, off in e.add(A2)] == [2]
    assert {n: r.owner.container_id for n, r in store.backend.reservations.items()} == {
        "198.51.100.1": "cb", "198.51.100.2": "ca2"}


def test_a_noted_address_the_pool_holds_or_another_attachment_reserved_stays(tmp_path: Path) -> None:
    """Died after its pool write (.1 held), or the reservation names another attachment now (.2, taken
    over since): the next holder frees neither."""
    e, store, path = _engine(tmp_path)
    store.put_reservation(Reservation("198.51.100.1", A))
    store.commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"1": A}))
    store.put_reservation(Reservation("198.51.100.2", A2))
    _die_holding(path, ("198.51.100.1", 1, A), ("198.51.100.2", 2, A))
    assert [off for _, off in e.add(B)] == [3]
    assert {n: r.owner.container_id for n, r in store.backend.reservations.items()} == {
        "198.51.100.1": "ca", "198.51.100.2": "ca2", "198.51.100.3": "cb"}
    with nodelock.held(str(path)) as lock:
        assert lock is not None and lock.left == []


def test_a_note_the_store_cannot_judge_now_stays_for_the_next_holder(tmp_path: Path) -> None:
    e, store, path = _engine(tmp_path)
    store.put_reservation(Reservation("198.51.100.1", A))
    _die_holding(path, ("198.51.100.1", 1, A))
    store.down = True
    assert [off for _, off in e.add(B)] == [2]  # allocated all the same (.1 still reserved)
    assert set(store.backend.reservations) == {"198.51.100.1", "198.51.100.2"}
    with nodelock.held(str(path)) as lock:
        assert lock is not None and len(lock.left) == 1 and b"198.51.100.1" in lock.left[0]
    store.down = False
    e.delete(B)  # the next holder: B's DEL
    assert set(store.backend.reservations) == set()


@pytest.mark.parametrize("line", [b"{}", b"[1]", b'{"name": "x", "offset": "y", "owner": []}', b"\xff"])
def test_a_note_not_understood_is_dropped(tmp_path: Path, line: bytes) -> None:
    e, _, path = _engine(tmp_path)
    lock = nodelock.Held(0, str(path), 1, [line])
    reservations.free_left(e.reservations, lambda: e.view(e.conf.ranges[0]), lock)
    assert lock.left == []


class OutageStore(FlakyStore):
    """Pool writes and reservation deletions fail while `down` is set (the API server away)."""

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        if self.down:
            raise StoreUnavailable("pools: down")
        return super().commit_pool(pool, update)


def test_a_claim_the_failed_add_cannot_drop_is_left_to_the_next_holder(tmp_path: Path) -> None:
    """The store goes away between A's reservation and its pool write: A's ADD fails (code 11) and cannot
    delete the reservation it claimed either. The claim is left in the pool's node lock as a dead
    holder's note: the next call on the pool on this node (B's ADD) frees it, and A's retry finds nothing
    of the failed ADD (issue 44: nothing left after a server outage)."""
    conf = from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes", "network_name": "",
                      "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "state" / "whereabouts.db")})  # fmt: skip
    store = OutageStore(Backend())
    e = Engine(store, conf, Retry(outage=0.0, sleep=lambda s: None, rand=lambda: 0.0))
    store.commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"9": B}))  # the pool exists
    put = store.put_reservation

    def then_down(res: Reservation) -> str:  # A's claim made, then the outage
        version = put(res)
        store.down = True
        return version

    store.put_reservation = then_down  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        e.add(A)
    store.put_reservation = put  # type: ignore[method-assign]
    assert {n: r.owner.container_id for n, r in store.backend.reservations.items()} == {"198.51.100.1": "ca"}
    path = Path(nodelock.path_for(e.lock_dir, e.identity, "node1", POOL))
    assert path.stat().st_size > 8, "the claim left in the node lock"
    store.down = False
    assert [off for _, off in e.add(B._replace(container_id="cb2", podref="ns/b2"))] == [1]
    assert {n: r.owner.container_id for n, r in store.backend.reservations.items()} == {"198.51.100.1": "cb2"}
    assert path.stat().st_size == 8
