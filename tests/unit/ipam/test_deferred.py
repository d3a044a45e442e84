"""Deferred pool writes (the agent: ipam.batch `share(defer=...)`, ipam.engine on a store whose reservations
are authoritative): a call is answered once its address is reserved (ADD) or its entries found (DEL),
before the pool write, which then carries every call of the window; a retried write keeps the answered
addresses; CHECK waits for the write. The pool write is held at a gate the test opens, so nothing here
depends on how fast the threads run: the calls must return while the write cannot have happened. Where a
test needs the calls in one batch, the batch is closed by its size (batch.MAX_BATCH: the n-th call),
never by the clock; where it needs a thread to be waiting, it waits until the thread is there (the
combiner says so, or the write reached the gate)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import metrics
from ipam import batch
from ipam.attempt import Attempt, Memory
from ipam.batch import Op
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.exec_agent import Agent
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict
from ipam.store.names import reservation_name
from tests.memstore import Backend, MemoryStore, _Pool
from tests.unit.helpers import in_threads, until

RANGE = "198.51.100.0/24"
POOL = "198.51.100.0-24"
HANG = 60.0  # batches closed by their size: the window and the lull only guard against a hang


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
    def __init__(self, tmp: Path, before_commit: Any = None) -> None:
        self.backend, self.gate, self.writes = Backend(), threading.Event(), []  # type: list[PoolUpdate]
        self.before_commit, self.arrived = before_commit, threading.Event()
        self.conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp / "ipam.db"),
                               "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip

    def store(self) -> GateStore:
        return GateStore(self.backend, self.gate, self.writes, self.before_commit, self.arrived)

    def engine(self) -> Engine:
        return Engine(self.store(), self.conf, reopen=lambda: contextlib.nullcontext(self.store()))

    def settle(self) -> None:
        assert batch.settle_all(30)


class Unwritten(metrics.Sink):
    """The agent's gauge of calls answered ahead of their write, as it is reported."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def unwritten(self, n: int) -> None:
        self.values.append(n)


@pytest.fixture
def unwritten() -> Iterator[Unwritten]:
    sink = Unwritten()
    metrics.install(sink)
    yield sink
    metrics.install(None)


@pytest.fixture
def batches_of(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """batches_of(n): from then on every batch closes when it holds n calls, not before (its window and
    its lull are HANG seconds): which calls share a write does not depend on when they arrive."""
    batch.share(True, pace=0.0, defer=HANG, idle=HANG)
    yield lambda n: monkeypatch.setattr(batch, "MAX_BATCH", n)
    assert batch.settle_all(30)
    batch.share(False)


def owner(i: int) -> Allocation:
    return Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1")


def test_calls_are_answered_before_their_one_write(
    batches_of: Any, unwritten: Unwritten, tmp_path: Path
) -> None:
    s = Setup(tmp_path)
    n = 6
    batches_of(n)
    got = in_threads(n, lambda i: s.engine().add(owner(i))[0][1])
    # every call returned with the pool write still held at the gate: answered on its reservation
    assert s.writes == [] and POOL not in s.backend.pools
    assert len(set(got)) == n and unwritten.values[-1] == n
    held = {r.owner.container_id: r.name for r in s.backend.reservations.values()}
    assert set(held) == {f"c{i}" for i in range(n)}
    s.gate.set()
    s.settle()
    pool = s.backend.pools[POOL]
    written = {k: a.container_id for k, a in pool.allocations.items()}
    assert written == {str(got[i]): f"c{i}" for i in range(n)}
    assert [len(w.put) for w in s.writes] == [n]  # the calls share one write
    assert unwritten.values[-1] == 0

    # DEL: answered before the write too; each reservation released only after its entry is gone
    s.gate.clear()
    s.writes.clear()
    in_threads(n, lambda i: s.engine().delete(owner(i)))
    assert s.writes == [] and len(s.backend.pools[POOL].allocations) == n
    assert len(s.backend.reservations) == n and unwritten.values[-1] == n
    s.gate.set()
    s.settle()
    assert s.backend.pools[POOL].allocations == {} and s.backend.reservations == {}
    assert [len(w.remove) for w in s.writes] == [n] and unwritten.values[-1] == 0


def test_a_call_after_an_answered_add_of_the_same_attachment(batches_of: Any, tmp_path: Path) -> None:
    """ADD again (a runtime's retry) and DEL of an attachment whose ADD is answered but not written:
    the same address, then nothing left."""
    s = Setup(tmp_path)
    batches_of(3)  # the three calls in the batch of the first: its write waits for the third
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


def test_a_retried_write_keeps_the_answered_addresses(batches_of: Any, tmp_path: Path) -> None:
    s = Setup(tmp_path, before_commit=_foreign(200))
    s.gate.set()
    batches_of(3)  # all three answered before the write that fails
    got = [s.engine().add(owner(i))[0][1] for i in range(3)]
    s.settle()
    assert [len(w.put) for w in s.writes] == [3]  # the retry of the failed write carries all three
    pool = s.backend.pools[POOL].allocations
    assert {str(o): pool[str(o)].container_id for o in got} == {str(got[i]): f"c{i}" for i in range(3)}
    assert pool["200"].container_id == "foreign"


def test_an_answered_address_another_writer_took_is_not_moved(batches_of: Any, tmp_path: Path) -> None:
    """A writer that ignores reservations put its entry at the answered address before the write: the
    answer stands (its reservation still holds the address) and nothing is written over the other
    entry (the agent's log says so)."""
    s = Setup(tmp_path, before_commit=_foreign(1))
    s.gate.set()
    batches_of(1)
    got = s.engine().add(owner(7))[0][1]
    assert got == 1
    s.settle()
    assert s.backend.pools[POOL].allocations["1"].container_id == "foreign"
    assert [r.owner.container_id for r in s.backend.reservations.values()] == ["c7"]


def test_check_waits_for_the_write(batches_of: Any, tmp_path: Path) -> None:
    s = Setup(tmp_path)
    batches_of(1)
    e = s.engine()
    e.add(owner(3))
    comb = batch.combiner((e.identity, POOL))
    assert s.writes == [] and comb.settling() == 0
    checked: list[BaseException | None] = []
    t = threading.Thread(target=lambda: checked.append(_check(s.engine(), owner(3))), daemon=True)
    t.start()
    assert until(lambda: comb.settling() or checked)
    # the CHECK waits for the pool's write, which the gate holds: it cannot have read the pool yet
    assert comb.settling() == 1 and checked == [] and s.writes == []
    s.gate.set()
    t.join(30)
    assert checked == [None] and [len(w.put) for w in s.writes] == [1] and comb.settling() == 0


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


def test_without_overlapping_ranges_a_call_waits_for_its_write(
    batches_of: Any, unwritten: Unwritten, tmp_path: Path
) -> None:
    """No reservation holds the address until the pool write lands: the call is answered after it."""
    s = Setup(tmp_path)
    batches_of(1)
    s.conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp_path / "ipam.db"),
                        "enable_overlapping_ranges": False, "kubernetes": {"kubeconfig": "/nonexistent"}})
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(s.engine().add(owner(5))[0][1]), daemon=True)
    t.start()
    # the write reached the gate: the batch decided the call, and an answer would have come before it
    assert s.arrived.wait(30)
    assert unwritten.values == [] and got == []  # not answered: held with its write at the gate
    s.gate.set()
    t.join(30)
    assert got == [1] and s.backend.pools[POOL].allocations["1"].container_id == "c5"
    assert s.backend.reservations == {} and unwritten.values == []


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


def test_an_add_is_answered_once_its_address_is_reserved_not_when_its_pass_ends(tmp_path: Path) -> None:
    """A pass claims its ADDs' reservations one after another: the first call is answered while the
    second's request is still held, and a DEL of the pass only at its end."""
    conf = from_dict({"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp_path / "ipam.db"),
                      "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip
    rng = conf.ranges[0]
    backend, gate, reached = Backend(), threading.Event(), threading.Event()
    store = HeldClaim(backend, reservation_name(str(rng.address(2)), ""), gate, reached)
    e = Engine(store, conf, reopen=lambda: contextlib.nullcontext(store))
    comb = batch.Combiner(defer=HANG, idle=HANG)  # deferring: early answers
    ops = [Op("add", rng, owner(i), True) for i in range(3)]
    attempt = Attempt(e, e.pool_name(rng), ops, Agent(e, comb), Memory(kept=True))
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(attempt.decide_all(e.view(rng), ops, hot=False)))
    t.start()
    try:
        assert reached.wait(30)  # the second ADD's request is held
        assert ops[0].state == batch.ANSWERED and ops[0].offsets == [1]  # the first already answered
        assert ops[1].state == batch.PENDING and ops[2].state == batch.PENDING
    finally:
        gate.set()
        t.join(30)
    assert [op.state for op in ops] == [batch.ANSWERED] * 3 and [op.offsets for op in ops] == [[1], [2], [3]]
    assert got[0].decided == ops
