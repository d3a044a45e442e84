"""A reservation create (POST) that the store applied but never answered (a read timeout or a 504:
StoreBusy; a connection lost: StoreUnavailable) is recorded as maybe created (ipam.operation
Claims.maybe): the retry keeps it as its own when it picks that address again, and the ADD's end deletes
it when the retry went elsewhere or the ADD failed; each attempt notes it in the pool's node lock. A
create that was answered costs nothing more. On the memory store, in a plugin process' mode and the
agent's (ipam.batch.install); the real kube-apiserver: tests/kubeapi/test_unanswered_reservation.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cni import jsonio
from ipam import batch, combiner, nodelock, plugin
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.retry import Retry
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable
from tests.memstore import Backend, MemoryStore
from tests.unit.ipam.test_engine import Clock

A = Allocation("ca", "ns/a", "net1", "uid-a", "blue", "node1")
B = Allocation("cb", "ns/b", "net1", "uid-b", "blue", "node2")
POOL = "198.51.100.0-24"
Hook = Callable[["Unanswered"], None]


class Unanswered(MemoryStore):
    """The next `stall` reservation creates are applied and then answered StoreBusy (`hook` runs in
    between, as whatever the rest of the cluster does meanwhile); the next `lose` are not applied and
    answered StoreUnavailable; the next `conflicts` pool writes fail as a race lost (`hook` first), the
    next `busy` are not applied and answered StoreBusy. Every request is counted."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self.stall = self.lose = self.conflicts = self.busy = 0
        self.hook: Hook | None = None
        self.calls: list[str] = []

    def _meddle(self) -> None:
        if self.hook is not None:
            self.hook(self)

    def get_reservation(self, name: str) -> Reservation | None:
        self.calls.append(f"GET {name}")
        return super().get_reservation(name)

    def put_reservation(self, res: Reservation) -> str:
        self.calls.append(f"{'POST' if res.version is None else 'PUT'} {res.name}")
        if res.version is None and self.lose:
            self.lose -= 1
            raise StoreUnavailable("memory store: injected: connection reset, not applied")
        version = super().put_reservation(res)
        if res.version is None and self.stall:
            self.stall -= 1
            self._meddle()
            raise StoreBusy("memory store: injected: applied, no answer within the read timeout")
        return version

    def delete_reservation(self, res: Reservation) -> None:
        self.calls.append(f"DELETE {res.name}")
        super().delete_reservation(res)

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.calls.append(f"COMMIT {pool.name}")
        if self.conflicts:
            self.conflicts -= 1
            self._meddle()
            raise Conflict("memory store: injected: a race lost")
        if self.busy:
            self.busy -= 1
            raise StoreBusy("memory store: injected: a pool write not applied, 504")
        return super().commit_pool(pool, update)


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.backend = Backend()
        self.store = Unanswered(self.backend)
        self.conf = from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes",
                               "kubernetes": {"kubeconfig": "/nonexistent"},
                               "local_db": str(tmp / "state" / "whereabouts.db")})  # fmt: skip
        self.clock = Clock()
        self.retry = Retry(clock=self.clock, sleep=self.clock.sleep, rand=lambda: 0.5)  # (no race lost here)
        e = self.engine()
        self.lock = nodelock.path_for(e.lock_dir, e.identity, A.node, POOL)

    def engine(self) -> Engine:
        """An engine as the plugin builds it, in this process' execution mode (`mode`)."""
        return Engine(self.store, self.conf, self.retry, reopen=lambda: contextlib.nullcontext(self.store),
                      execute=plugin.EXECUTE)  # fmt: skip

    def held(self) -> tuple[dict[str, str], dict[str, str]]:
        """(pool entry offset -> container id, reservation name -> container id)."""
        pool = self.backend.pools.get(POOL)
        entries = {k: a.container_id for k, a in pool.allocations.items()} if pool else {}
        return entries, {n: r.owner.container_id for n, r in self.backend.reservations.items()}

    def other_holds_1(self) -> None:
        """B (another node) holds .1: its pool entry and its reservation."""
        MemoryStore(self.backend).put_reservation(Reservation("198.51.100.1", B))
        MemoryStore(self.backend).commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"1": B}))


def free_1(store: MemoryStore) -> None:
    """B's DEL on its node: its entry at .1 and then its reservation gone."""
    plain = MemoryStore(store.backend)
    pool = plain.get_pool(POOL)
    assert pool is not None and "1" in pool.allocations
    plain.commit_pool(pool, PoolUpdate(remove=frozenset({"1"})))
    res = plain.get_reservation("198.51.100.1")
    assert res is not None
    plain.delete_reservation(res)


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """A plugin process' execution mode, or the agent's (its pool batches): for the engines built inside
    (ipam.plugin.EXECUTE)."""
    if name == "plugin":
        yield
        return
    batch.install()
    try:
        yield
        assert combiner.count() > 0, "no op went through the agent's combiners"
    finally:
        assert combiner.settle_all(30)
        batch.uninstall()


MODES = ["plugin", "agent"]


@pytest.mark.parametrize("how", MODES)
def test_an_unanswered_create_the_retry_does_not_pick_again_is_deleted(tmp_path: Path, how: str) -> None:
    """A's POST of .2 is applied unanswered; meanwhile .1 is freed, so the retry takes .1: the ADD ends
    with .1 alone reserved for A (.2's reservation, naming A, deleted), and A's DEL leaves nothing."""
    s = Setup(tmp_path)
    s.other_holds_1()
    s.store.stall, s.store.hook = 1, free_1
    with mode(how):
        assert s.engine().add(A) == [(s.conf.ranges[0], 1)]
    assert s.store.stall == 0  # the fault happened
    assert s.held() == ({"1": "ca"}, {"198.51.100.1": "ca"})
    with mode(how):
        s.engine().delete(A)
    assert s.held() == ({}, {})


@pytest.mark.parametrize("how", MODES)
def test_an_unanswered_create_picked_again_is_the_ops_own(tmp_path: Path, how: str) -> None:
    """A's POST of .1 is applied unanswered; the retry picks .1 again and finds it naming A: this op's
    (created). Its pool write then loses to B, who took .1 meanwhile: the next attempt goes elsewhere (the
    agent, its pool now hot, after a random point) and the ADD's end deletes .1's reservation as any it
    created and did not keep."""
    s = Setup(tmp_path)

    def take_1(store: MemoryStore) -> None:  # B's entry written in the pool (its reservation aside)
        plain = MemoryStore(store.backend)
        plain.commit_pool(plain.get_pool(POOL) or Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"1": B}))

    s.store.stall, s.store.conflicts = 1, 1
    s.store.hook = lambda store: take_1(store) if store.stall == 0 and store.conflicts == 0 else None
    with mode(how):
        [(_, offset)] = s.engine().add(A)
    assert s.store.conflicts == 0 and offset != 1
    assert s.held() == ({"1": "cb", str(offset): "ca"}, {f"198.51.100.{offset}": "ca"})
    # the retry's claim of .1: the create refused (it exists), read, kept: no other request for it
    assert [c for c in s.store.calls if c.endswith("198.51.100.1")] == [
        "POST 198.51.100.1", "POST 198.51.100.1", "GET 198.51.100.1",  # the unanswered one; the retry
        "GET 198.51.100.1", "DELETE 198.51.100.1",  # dropped at the ADD's end (its version checked)
    ]


@pytest.mark.parametrize("how", MODES)
def test_an_add_that_fails_after_an_unanswered_create_leaves_no_reservation(
    tmp_path: Path, how: str
) -> None:
    """A's POST of .1 is applied unanswered, and the server stays too busy to write the pool: the ADD
    gives up (code 11), and the reservation it may have created (found on the retry: its own) is
    deleted."""
    s = Setup(tmp_path)
    s.store.stall, s.store.busy = 1, 10**9
    with mode(how), pytest.raises(StoreBusy):
        s.engine().add(A)
    assert s.held() == ({}, {})


def test_a_create_lost_before_it_was_applied_is_made_again_and_not_read(tmp_path: Path) -> None:
    """A create refused with no answer that was not applied: the retry's create is answered, and the
    reservation is this op's as usual (nothing read, nothing deleted)."""
    s = Setup(tmp_path)
    s.store.lose = 1
    assert s.engine().add(A) == [(s.conf.ranges[0], 1)]
    assert s.held() == ({"1": "ca"}, {"198.51.100.1": "ca"})
    assert s.store.calls == ["POST 198.51.100.1", "POST 198.51.100.1", f"COMMIT {POOL}"]


def test_an_answered_create_costs_no_other_request(tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.engine().add(A)
    assert s.store.calls == ["POST 198.51.100.1", f"COMMIT {POOL}"]


def test_each_attempt_notes_an_unanswered_create_in_the_node_lock(tmp_path: Path) -> None:
    """The retry that goes elsewhere still notes the unanswered create (.2) in the pool's node lock
    while it holds it: killed there, the next holder frees that reservation too (ipam.reservations
    free_left)."""
    s = Setup(tmp_path)
    s.other_holds_1()
    noted: list[list[str]] = []

    def at_claim(store: Unanswered) -> None:
        if store.stall == 0:  # the retry's claim of .1: what the lock holds now
            with open(s.lock, "rb") as f:
                notes = f.read()[8:].splitlines()
            noted.append([str(jsonio.loads(n, "note")["name"]) for n in notes])

    class Watching(Unanswered):
        def put_reservation(self, res: Reservation) -> str:
            if self.stall == 0 and res.name == "198.51.100.1":
                at_claim(self)
            return super().put_reservation(res)

    s.store = Watching(s.backend)
    s.store.stall, s.store.hook = 1, free_1
    assert s.engine().add(A) == [(s.conf.ranges[0], 1)]
    assert noted == [["198.51.100.2", "198.51.100.1"]]
    assert s.held() == ({"1": "ca"}, {"198.51.100.1": "ca"})
