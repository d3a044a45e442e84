"""The agent's pool batches (ipam.batch: its Combiner and run): the calls that arrive while a pool
write is in flight share the next write, and every call returns only once its pool write is done: an
answered ADD's entry is in the pool, an answered DEL's entry and reservation are gone. A pool write is
held at a gate the test opens, so nothing here depends on how fast the threads run: a call that returned
while the gate was closed would have been answered before its write; where a test needs calls queued
behind a write, it waits until the combiner says they are."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipam import plugin
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict
from tests.memstore import Backend, MemoryStore, _Pool
from tests.unit.ipam.conftest import count_queued
from tests.waits import until

RANGE = "198.51.100.0/24"
POOL = "198.51.100.0-24"


class GateStore(MemoryStore):
    """Pool writes set `arrived`, wait for `gate` (bounded: 30 s, then the write fails) and are
    recorded; `before_commit` runs first."""

    def __init__(self, backend: Backend, gate: threading.Event, writes: list[PoolUpdate],
                 before_commit: Any = None, arrived: threading.Event | None = None) -> None:  # fmt: skip
        super().__init__(backend)
        self.gate, self.writes, self.before_commit = gate, writes, before_commit
        self.arrived = arrived or threading.Event()

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.arrived.set()
        assert self.gate.wait(30), "the test never opened the gate"
        if self.before_commit is not None:
            self.before_commit(self, pool, update)
        self.writes.append(update)
        return super().commit_pool(pool, update)


class Setup:
    def __init__(self, tmp: Path, before_commit: Any = None, overlapping: bool = True) -> None:
        self.backend, self.gate, self.writes = Backend(), threading.Event(), []  # type: list[PoolUpdate]
        self.before_commit, self.arrived = before_commit, threading.Event()
        self.conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp / "ipam.db"),
                               "enable_overlapping_ranges": overlapping,
                               "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip

    def store(self) -> GateStore:
        return GateStore(self.backend, self.gate, self.writes, self.before_commit, self.arrived)

    def engine(self) -> Engine:
        return Engine(self.store(), self.conf, reopen=lambda: contextlib.nullcontext(self.store()),
                      execute=plugin.EXECUTE)


def owner(i: int) -> Allocation:
    return Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1")


def _start(call: Callable[[], Any], into: list[Any]) -> threading.Thread:
    t = threading.Thread(target=lambda: into.append(call()), daemon=True)
    t.start()
    return t


def test_calls_that_arrive_during_a_write_share_the_next_and_return_after_it(
    agent: None, tmp_path: Path
) -> None:
    s = Setup(tmp_path)
    seen: dict[str, Any] = {}

    def add(i: int) -> int:
        offset = s.engine().add(owner(i))[0][1]
        stored = s.backend.pools[POOL].allocations.get(str(offset))  # as the call returns
        seen[f"c{i}"] = stored.container_id if stored else None
        return offset

    first: list[Any] = []
    threads = [_start(lambda: add(0), first)]
    assert s.arrived.wait(30)  # the first call's write is at the gate
    queued = count_queued()
    n = 5
    rest: list[Any] = []
    for i in range(1, n + 1):
        threads.append(_start(lambda i=i: add(i), rest))  # type: ignore[misc]
        until(lambda i=i: queued["combiner-queued"] == i, f"{i} calls pending")  # type: ignore[misc]
    assert first == [] and rest == []  # nobody answered while the pool write is held
    s.gate.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert [len(w.put) for w in s.writes] == [1, n]  # the n calls that queued meanwhile: one write
    assert seen == {f"c{i}": f"c{i}" for i in range(n + 1)}  # each entry stored when its call returned
    assert len(set(first + rest)) == n + 1

    # DEL: answered once the entry is gone from the pool and its reservation deleted
    s.gate.clear()
    s.arrived.clear()
    s.writes.clear()
    gone: dict[str, tuple[bool, bool]] = {}

    def delete(i: int) -> None:
        s.engine().delete(owner(i))
        entries = {a.container_id for a in s.backend.pools[POOL].allocations.values()}
        reserved = {r.owner.container_id for r in s.backend.reservations.values()}
        gone[f"c{i}"] = (f"c{i}" not in entries, f"c{i}" not in reserved)

    done: list[Any] = []
    threads = [_start(lambda: delete(0), done)]
    assert s.arrived.wait(30)
    queued = count_queued()  # the DELs counted alone
    for i in range(1, n + 1):
        threads.append(_start(lambda i=i: delete(i), done))  # type: ignore[misc]
        until(lambda i=i: queued["combiner-queued"] == i, f"{i} calls pending")  # type: ignore[misc]
    assert done == []
    s.gate.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert gone == {f"c{i}": (True, True) for i in range(n + 1)}
    assert [len(w.remove) for w in s.writes] == [1, n]
    assert s.backend.pools[POOL].allocations == {} and s.backend.reservations == {}


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


def test_a_write_lost_to_another_writer_is_decided_again(agent: None, tmp_path: Path) -> None:
    """The other writer took the address the batch had decided: the retry decides on the pool as stored
    and the call is answered with an address the pool gives it."""
    s = Setup(tmp_path, before_commit=_foreign(1))
    s.gate.set()
    got = s.engine().add(owner(7))[0][1]
    pool = s.backend.pools[POOL].allocations
    assert got != 1 and pool["1"].container_id == "foreign" and pool[str(got)].container_id == "c7"
    assert [r.owner.container_id for r in s.backend.reservations.values()] == ["c7"]


def test_check_after_an_add_reads_its_entry(agent: None, tmp_path: Path) -> None:
    s = Setup(tmp_path)
    s.gate.set()
    e = s.engine()
    e.add(owner(3))
    e.check(owner(3))


def test_two_configurations_of_one_pool_keep_their_own_entries(agent: None, tmp_path: Path) -> None:
    """Two NADs on one pool that differ in enable_overlapping_ranges, their calls in one batch (the
    second queued while the first's write is held): the overlapping one's entry is lean (its extras on
    its reservation), the other's keeps its extras (it has no reservation to carry them), whichever
    call's configuration the batch runs with."""
    lean, full = Setup(tmp_path), Setup(tmp_path, overlapping=False)
    full.backend = lean.backend
    full.gate, full.arrived, full.writes = lean.gate, lean.arrived, lean.writes
    a = Allocation("ca", "ns/a", "net1", "uid-a", "n", "node1")
    b = Allocation("cb", "ns/b", "net1", "uid-b", "n", "node1")
    got: list[Any] = []
    warm = _start(lambda: lean.engine().add(Allocation("c0", "ns/c0", "net1", "uid-0", "n", "node1")), got)
    assert lean.arrived.wait(30)
    queued = count_queued()
    t1 = _start(lambda: lean.engine().add(a), got)
    until(lambda: queued["combiner-queued"] == 1, "one call pending")
    t2 = _start(lambda: full.engine().add(b), got)  # the latest caller: non-overlapping
    until(lambda: queued["combiner-queued"] == 2, "two calls pending")
    lean.gate.set()
    for t in (warm, t1, t2):
        t.join(30)
    by_id = {al.container_id: al for al in lean.backend.pools[POOL].allocations.values()}
    assert not by_id["ca"].has_extras() and by_id["cb"].has_extras() and by_id["cb"].pod_uid == "uid-b"
    assert {r.owner.container_id for r in lean.backend.reservations.values()} == {"c0", "ca"}


class HeldClaim(MemoryStore):
    """The reservation named `held` is created only once `gate` opens (bounded: 30 s); `reached` is set
    when its request arrives."""

    def __init__(self, backend: Backend, held: str, gate: threading.Event, reached: threading.Event) -> None:
        super().__init__(backend)
        self.held, self.gate, self.reached = held, gate, reached

    def put_reservation(self, res: Reservation) -> str:
        if res.name == self.held:
            self.reached.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().put_reservation(res)
