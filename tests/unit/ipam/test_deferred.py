"""Deferred pool writes (the agent: ipam.batch `share(defer=...)`, ipam.engine on a store whose reservations
are authoritative): a call is answered once its address is reserved (ADD) or its entries found (DEL),
before the pool write, which then carries every call of the window; a retried write keeps the answered
addresses; CHECK waits for the write. The pool write is held at a gate the test opens, so nothing here
depends on how fast the threads run: the calls must return while the write cannot have happened."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ipam import batch
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate
from ipam.store.base import Conflict
from tests.memstore import Backend, MemoryStore, _Pool
from tests.unit.helpers import in_threads

RANGE = "198.51.100.0/24"
POOL = "198.51.100.0-24"
# seconds a batch keeps answering arrivals before its write, even without one for that long: calls
# released together reach the first batch well within it, however slowly the machine runs them
WINDOW = 2.0


class GateStore(MemoryStore):
    """Pool writes wait for `gate` (bounded: 30 s) and are recorded; `before_commit` runs first."""

    def __init__(self, backend: Backend, gate: threading.Event, writes: list[PoolUpdate],
                 before_commit: Any = None) -> None:  # fmt: skip
        super().__init__(backend)
        self.gate, self.writes, self.before_commit = gate, writes, before_commit

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.gate.wait(30)
        if self.before_commit is not None:
            self.before_commit(self, pool, update)
        self.writes.append(update)
        return super().commit_pool(pool, update)


class Setup:
    def __init__(self, tmp: Path, before_commit: Any = None) -> None:
        self.backend, self.gate, self.writes = Backend(), threading.Event(), []  # type: list[PoolUpdate]
        self.before_commit = before_commit
        self.conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp / "ipam.db"),
                               "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip

    def store(self) -> GateStore:
        return GateStore(self.backend, self.gate, self.writes, self.before_commit)

    def engine(self) -> Engine:
        return Engine(self.store(), self.conf, reopen=lambda: contextlib.nullcontext(self.store()))

    def settle(self) -> None:
        assert batch.settle_all(30)


@pytest.fixture
def deferring(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(batch, "IDLE", WINDOW)
    batch.share(True, pace=0.0, defer=WINDOW)
    yield
    assert batch.settle_all(30)
    batch.share(False)


def owner(i: int) -> Allocation:
    return Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1")


def test_calls_are_answered_before_their_one_write(deferring: None, tmp_path: Path) -> None:
    s = Setup(tmp_path)
    n = 6
    got = in_threads(n, lambda i: s.engine().add(owner(i))[0][1])
    # every call returned with the pool write still held at the gate: answered on its reservation
    assert s.writes == [] and POOL not in s.backend.pools
    assert len(set(got)) == n and batch._Registry.unwritten == n
    held = {r.owner.container_id: r.name for r in s.backend.reservations.values()}
    assert set(held) == {f"c{i}" for i in range(n)}
    s.gate.set()
    s.settle()
    pool = s.backend.pools[POOL]
    written = {k: a.container_id for k, a in pool.allocations.items()}
    assert written == {str(got[i]): f"c{i}" for i in range(n)}
    assert sum(len(w.put) for w in s.writes) == n and len(s.writes) <= 2  # the calls share the write
    assert batch._Registry.unwritten == 0

    # DEL: answered before the write too; each reservation released only after its entry is gone
    s.gate.clear()
    s.writes.clear()
    in_threads(n, lambda i: s.engine().delete(owner(i)))
    assert s.writes == [] and len(s.backend.pools[POOL].allocations) == n
    assert len(s.backend.reservations) == n
    s.gate.set()
    s.settle()
    assert s.backend.pools[POOL].allocations == {} and s.backend.reservations == {}


def test_a_call_after_an_answered_add_of_the_same_attachment(deferring: None, tmp_path: Path) -> None:
    """ADD again (a runtime's retry) and DEL of an attachment whose ADD is answered but not written:
    the same address, then nothing left."""
    s = Setup(tmp_path)
    e = s.engine()
    first = e.add(owner(1))[0][1]
    assert e.add(owner(1))[0][1] == first and s.writes == []
    e.delete(owner(1))
    s.gate.set()
    s.settle()
    assert s.backend.pools.get(POOL) is None or s.backend.pools[POOL].allocations == {}
    assert s.backend.reservations == {}


def _foreign(at: int) -> Any:
    """before_commit: once, another writer puts an entry at offset `at` and the write fails."""
    done: list[bool] = []

    def hook(store: GateStore, pool: Pool, update: PoolUpdate) -> None:
        if done:
            return
        done.append(True)
        b = store.backend
        with b.lock:
            cur = b.pools.get(POOL)
            allocations = dict(cur.allocations) if cur else {}
            allocations[str(at)] = Allocation("foreign", "ns/foreign", "net1")
            b.pools[POOL] = _Pool(RANGE, allocations, b.next_version())
        raise Conflict("pool changed")

    return hook


def test_a_retried_write_keeps_the_answered_addresses(deferring: None, tmp_path: Path) -> None:
    s = Setup(tmp_path, before_commit=_foreign(200))
    s.gate.set()
    got = [s.engine().add(owner(i))[0][1] for i in range(3)]
    s.settle()
    pool = s.backend.pools[POOL].allocations
    assert {str(o): pool[str(o)].container_id for o in got} == {str(got[i]): f"c{i}" for i in range(3)}
    assert pool["200"].container_id == "foreign"


def test_an_answered_address_another_writer_took_is_not_moved(deferring: None, tmp_path: Path) -> None:
    """A writer that ignores reservations put its entry at the answered address before the write: the
    answer stands (its reservation still holds the address) and nothing is written over the other
    entry (the agent's log says so)."""
    s = Setup(tmp_path, before_commit=_foreign(1))
    s.gate.set()
    got = s.engine().add(owner(7))[0][1]
    assert got == 1
    s.settle()
    assert s.backend.pools[POOL].allocations["1"].container_id == "foreign"
    assert [r.owner.container_id for r in s.backend.reservations.values()] == ["c7"]


def test_check_waits_for_the_write(deferring: None, tmp_path: Path) -> None:
    s = Setup(tmp_path)
    e = s.engine()
    e.add(owner(3))
    assert s.writes == []
    checked: list[BaseException | None] = []
    t = threading.Thread(target=lambda: checked.append(_check(s.engine(), owner(3))), daemon=True)
    t.start()
    t.join(0.3)
    assert not checked  # waiting for the write, which the gate holds
    s.gate.set()
    t.join(30)
    assert checked == [None]


def _check(e: Engine, who: Allocation) -> BaseException | None:
    try:
        e.check(who)
    except BaseException as err:
        return err
    return None


def test_without_deferring_a_call_waits_for_its_write(tmp_path: Path) -> None:
    batch.share(True, pace=0.0, defer=0.0)
    try:
        s = Setup(tmp_path)
        s.gate.set()
        got = s.engine().add(owner(4))[0][1]
        assert [w.put[str(got)].container_id for w in s.writes] == ["c4"]
    finally:
        batch.share(False)


def test_without_overlapping_ranges_a_call_waits_for_its_write(deferring: None, tmp_path: Path) -> None:
    """No reservation holds the address until the pool write lands: the call is answered after it."""
    s = Setup(tmp_path)
    s.conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp_path / "ipam.db"),
                        "enable_overlapping_ranges": False, "kubernetes": {"kubeconfig": "/nonexistent"}})
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(s.engine().add(owner(5))[0][1]), daemon=True)
    t.start()
    t.join(0.5)
    assert got == [] and t.is_alive()  # held with its write at the gate
    s.gate.set()
    t.join(30)
    assert got == [1] and s.backend.pools[POOL].allocations["1"].container_id == "c5"
    assert s.backend.reservations == {}


def test_the_window_follows_the_writes() -> None:
    """At least `defer`; after a slow write (a large pool, a busy server) WINDOW_PER_WRITE times as
    long as it took, at most DEFER_MAX."""
    comb = batch.Combiner(defer=0.5)
    assert comb.window() == 0.5
    comb.wrote(0.05)
    assert comb.window() == 0.5
    comb.wrote(0.4)
    assert comb.window() == pytest.approx(0.4 * batch.WINDOW_PER_WRITE)
    comb.wrote(60.0)
    assert comb.window() == batch.DEFER_MAX
