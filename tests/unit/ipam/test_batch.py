"""Batched pool writes (ipam.batch, ipam.engine): Changes' bookkeeping, the agent's combiner sharing one
write between concurrent threads of one process (the agent), and the node-local pool lock
(ipam.nodelock) queueing writers of one node."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cni import procs
from cni.errors import CniError, Code, TryAgainError
from ipam import batch, combiner, nodelock, operation, plugin
from ipam.agentreads import Memory
from ipam.allocator import SnapshotView
from ipam.attempt import Stored
from ipam.combiner import Combiner
from ipam.config import IpamConfig, from_dict
from ipam.decide import Changes
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.operation import Op
from ipam.ranges import IPRange
from tests.memstore import Backend, MemoryStore
from tests.unit.helpers import Counted, decided, in_threads, written
from tests.unit.ipam.conftest import count_queued
from tests.waits import until

A = Allocation("ca", "ns/a", "net1", "", "n", "node1")
B = Allocation("cb", "ns/b", "net1", "", "n", "node1")
C = Allocation("cc", "ns/c", "net1", "", "n", "node1")
RANGE = "198.51.100.0/24"


def rng() -> IPRange:
    return from_dict({"datastore": "local", "range": RANGE}).ranges[0]


def test_batch_view_hides_removed_and_shows_decided_entries() -> None:
    view = Changes(SnapshotView(Pool("p", RANGE, {"1": A, "2": B})))
    r = rng()
    first = decided(r, view, C)
    assert (first.offset, first.kind) == (3, "new")
    view.apply(PoolUpdate(put={"3": C}))
    view.apply(PoolUpdate(remove=frozenset({"1"})))
    assert view.owned(C) == [("3", C)] and view.owned(A) == []
    # a freed offset is not handed out again by the same write; the next free one is
    assert decided(r, view, Allocation("cd", "ns/d", "net1")).offset == 4
    assert view.update() == PoolUpdate(put={"3": C}, remove=frozenset({"1"}))


class CountingStore(MemoryStore):
    """A memory store that counts pool writes and makes each one slow enough for others to queue."""

    def __init__(self, backend: Backend, writes: list[int], pause: float) -> None:
        super().__init__(backend)
        self.writes, self.pause = writes, pause

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        self.writes.append(len(update.put) + len(update.remove))
        time.sleep(self.pause)
        return super().commit_pool(pool, update)


def _engine(backend: Backend, writes: list[int], pause: float = 0.02, **ipam: Any) -> Engine:
    conf = from_dict({"range": RANGE, "datastore": "kubernetes",
                      "kubernetes": {"kubeconfig": "/nonexistent"}, **ipam})  # fmt: skip
    store = CountingStore(backend, writes, pause)
    return Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=plugin.EXECUTE)


@pytest.fixture
def shared() -> Any:
    batch.install()
    yield
    batch.uninstall()


@pytest.fixture
def kept() -> Any:
    """The agent's sharing: the pool's memory kept with its combiner (ipam.agentreads.Memory)."""
    batch.install()
    yield
    batch.uninstall()


class GatedStore(CountingStore):
    """The first pool write of a phase waits until all `n` calls of the phase are queued on the pool's
    combiner (`queued`: counted since the phase began; bounded: 30 s), so the test does not depend on
    the threads keeping pace with each other."""

    def __init__(self, backend: Backend, writes: list[int], queued: Counted, n: int,
                 arrived: threading.Event | None = None) -> None:  # fmt: skip
        super().__init__(backend, writes, 0.0)
        self.queued, self.n = queued, n
        self.arrived = arrived or threading.Event()  # set when the first write begins

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        if not self.writes:
            self.arrived.set()
            until(lambda: self.queued["combiner-queued"] >= self.n, "the other calls queued")
        return super().commit_pool(pool, update)


def _gated(store: GatedStore, conf: IpamConfig) -> Engine:
    """An engine on `store` (the agent's, as the plugin builds it)."""
    return Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=plugin.EXECUTE)


def test_concurrent_calls_in_one_process_share_writes(shared: None, tmp_path: Path) -> None:
    backend = Backend()
    n = 24
    owners = [Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1") for i in range(n)]
    conf = from_dict({"range": RANGE, "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "db")})  # fmt: skip

    def engine(writes: list[int]) -> Engine:
        return _gated(GatedStore(backend, writes, queued, n), conf)

    writes: list[int] = []
    queued = count_queued()

    def add(i: int) -> str:
        r, offset = engine(writes).add(owners[i])[0]
        return str(r.address(offset))

    got = in_threads(n, add)
    assert len(set(got)) == n  # every call its own address
    pool = backend.pools["198.51.100.0-24"]
    assert sorted(pool.allocations) == sorted(str(i) for i in range(1, n + 1))
    assert sum(writes) == n and len(writes) <= 2  # every op written once: the first batch and the rest
    # and the reservations agree with the pool, one per address
    assert {r.owner.container_id for r in backend.reservations.values()} == {o.container_id for o in owners}

    removed: list[int] = []
    queued = count_queued()  # the DELs' phase counted alone
    in_threads(n, lambda i: engine(removed).delete(owners[i]))
    assert backend.pools["198.51.100.0-24"].allocations == {} and backend.reservations == {}
    assert sum(removed) == n and len(removed) <= 2


def test_without_sharing_or_a_node_queue_each_call_writes_alone(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")  # local_db's directory is a file: no node lock, no node queue
    backend, writes = Backend(), []
    owners = [Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1") for i in range(6)]
    db = str(tmp_path / "state" / "db")
    in_threads(6, lambda i: _engine(backend, writes, 0.0, local_db=db).add(owners[i]))
    assert set(writes) == {1} and len(writes) >= 6  # one entry per write (lost races are retried)
    assert len(backend.pools["198.51.100.0-24"].allocations) == 6


def test_an_op_failing_alone_does_not_fail_its_batch(shared: None, tmp_path: Path) -> None:
    """A /30 has two addresses. The first ADD takes one, and its write waits until two more ADDs are
    queued behind it; those two run as one batch: one is told the pool is exhausted (code 100), the
    other is written by that batch."""
    from concurrent.futures import ThreadPoolExecutor

    backend, writes, arrived = Backend(), [], threading.Event()
    owners = [Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1") for i in range(3)]
    conf = from_dict({"range": "198.51.100.0/30", "datastore": "kubernetes", "local_db": str(tmp_path / "db"),
                      "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip

    queued = count_queued()

    def add(i: int) -> int | str:
        e = _gated(GatedStore(backend, writes, queued, 3, arrived), conf)
        try:
            return e.add(owners[i])[0][1]
        except CniError as err:  # the exhausted one
            return f"{type(err).__name__}:{err.code}"

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(add, 0)
        assert arrived.wait(30)  # its write began: its batch holds it alone
        rest = [pool.submit(add, i) for i in (1, 2)]
        got = [first.result(60), *(f.result(60) for f in rest)]
    assert got[0] == 1 and sorted(got[1:], key=str) == [2, "ExhaustedError:100"]
    assert writes == [1, 1]  # the second batch wrote the one it could place


def test_combiner_runs_queued_ops_of_other_threads() -> None:
    comb = Combiner()
    ran: list[list[str]] = []
    inside = threading.Event()
    release = threading.Event()
    r = rng()
    ops = {k: Op("add", r, Allocation(k, "", "net1"), False) for k in "abc"}

    def execute(group: list[Op]) -> None:
        ran.append([op.owner.container_id for op in group])
        if len(ran) == 1:
            inside.set()
            assert release.wait(30)
        for op in group:
            written(op)

    first = threading.Thread(target=comb.run, args=([ops["a"]], execute))
    first.start()
    assert inside.wait(30)
    queued = count_queued()
    others = [threading.Thread(target=comb.run, args=([ops[k]], execute)) for k in "bc"]
    for t in others:
        t.start()
    until(lambda: queued["combiner-queued"] == 2, "both queued behind the running batch")
    release.set()
    for t in (first, *others):
        t.join(30)
    assert ran[0] == ["a"] and sorted(ran[1]) == ["b", "c"] and len(ran) == 2


def test_combiner_error_reaches_every_op_of_the_batch() -> None:
    comb = Combiner()
    ops = [Op("del", rng(), Allocation(k, "", "net1"), False) for k in "ab"]

    def execute(group: list[Op]) -> None:
        raise TryAgainError("store down")

    comb.run(ops, execute)
    assert all(op.done and isinstance(op.error, TryAgainError) for op in ops)


def test_node_lock_queues_holders_and_bounds_the_wait(tmp_path: Path) -> None:
    path = nodelock.path_for(str(tmp_path / "locks"), "store", "node1", "pool")
    assert nodelock.path_for(str(tmp_path / "locks"), "store", "node2", "pool") != path
    with nodelock.held(path):
        assert (os.stat(path).st_mode & 0o777) == 0o600
        # another holder (another open file description) waits, here past its bound
        with pytest.raises(TryAgainError, match="without progress"), nodelock.held(path, patience=0.05):
            pass
    with nodelock.held(path, patience=0.05):  # released: free again
        pass


def lock_holder(path: str) -> subprocess.Popen[bytes]:
    """Another process holding the lock at `path` until its stdin closes (it said so on stdout)."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"held\n"
    return p


def test_node_lock_held_by_a_stopped_process_is_not_waited_for(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Issue 28: an agent frozen (SIGSTOP) while it holds a pool's lock. A live holder without progress
    is waited for up to `patience` (code 11 naming its pid); a stopped one not at all: the waiter runs
    without the lock (None, as with an unusable lock directory; the compare-and-swap still decides),
    in a plugin process (main thread: blocking flock) and in the agent's threads (polling)."""
    path = nodelock.path_for(str(tmp_path / "locks"), "store", "node1", "pool")
    with nodelock.held(path):
        pass  # the lock file exists
    holder = lock_holder(path)
    try:
        with pytest.raises(TryAgainError, match=f"held by pid {holder.pid} without progress"), \
                nodelock.held(path, patience=0.05):  # fmt: skip
            pass
        holder.send_signal(signal.SIGSTOP)
        until(lambda: procs.stopped(holder.pid), "the holder stopped (SIGSTOP)")
        with nodelock.held(path) as lock:  # the default patience: a wait would end in TryAgainError
            assert lock is None
        assert f"held by pid {holder.pid}, which is stopped: running without it" in capfd.readouterr().err
        assert in_threads(1, lambda _: _held_is_none(path)) == [True]
        holder.send_signal(signal.SIGCONT)
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()
    with nodelock.held(path) as lock:  # released by its holder's end: held as usual
        assert lock is not None


def _held_is_none(path: str) -> bool:
    with nodelock.held(path) as lock:
        return lock is None


def test_node_lock_directory_unusable_runs_without_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with nodelock.held(str(blocker / "locks" / "x.lock")) as lock:  # a parent that is a file
        assert lock is None  # no lock, no error
    # a cluster store's call whose lock directory (beside local_db) is unusable: done without the lock
    backend, writes = Backend(), []
    e = _engine(backend, writes, 0.0, local_db=str(blocker / "ipam.db"))
    assert e.add(A)[0][1] == 1 and writes == [1]
    assert backend.pools["198.51.100.0-24"].allocations["1"].container_id == "ca"
    assert sorted(os.listdir(tmp_path)) == ["file"] and blocker.read_text() == ""


class ProbingStore(CountingStore):
    """At each pool write, tries the node lock at `lock` through an open file description of its own:
    records whether someone holds it (the try fails) at that moment."""

    def __init__(self, backend: Backend, writes: list[int]) -> None:
        super().__init__(backend, writes, 0.0)
        self.lock = ""
        self.held: list[bool] = []

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        fd = os.open(self.lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.held.append(False)
        except BlockingIOError:
            self.held.append(True)
        finally:
            os.close(fd)
        return super().commit_pool(pool, update)


def test_cluster_store_attempts_hold_the_node_lock(tmp_path: Path) -> None:
    """Each read-modify-write of a cluster store's pool holds the node's lock for that pool (a flock:
    any other holder, in this process or another, waits), and the lock file is beside local_db."""
    conf = from_dict({"range": RANGE, "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "state" / "ipam.db")})  # fmt: skip
    backend, writes = Backend(), []
    store = ProbingStore(backend, writes)
    e = Engine(store, conf, execute=plugin.EXECUTE)
    lock = nodelock.path_for(str(tmp_path / "state" / "pool-locks"), e.identity, "node1", "198.51.100.0-24")
    store.lock = lock
    e.add(A)
    e.add(B)
    e.delete(A)
    assert store.held == [True, True, True] and writes == [1, 1, 1]
    assert set(backend.pools["198.51.100.0-24"].allocations) == {"2"}
    with nodelock.held(lock) as held:  # each of the three writes counted as a holder's progress
        assert held is not None and held.count == 4


def test_a_race_lost_to_another_writer_heats_the_pool_and_the_next_call_scatters(
    kept: None, tmp_path: Path
) -> None:
    """The agent: node 2 finds the lowest free address reserved by a call in flight elsewhere (a
    reservation newer than the pool it read): its next candidate is the lowest free address after a
    random point of the range (not the next lowest, which the other nodes' writers go for too), and it
    marks the pool hot in its memory of the pool, so its next call starts at a random point at once."""
    from ipam.model import Reservation

    backend = Backend()
    e1 = _engine(backend, [], 0.0, local_db=str(tmp_path / "n1" / "db"))
    e1.add(A)  # the pool exists (version 1.., holding .1)
    racer = Allocation("cx", "ns/x", "net1", "", "n", "node9")
    MemoryStore(backend).put_reservation(Reservation("198.51.100.2", racer))  # in flight on node9
    picks: list[int] = []
    e2 = _engine(backend, [], 0.0, local_db=str(tmp_path / "n2" / "db"))
    e2.retry = type(e2.retry)(rand=lambda: picks.append(1) or 0.99)
    owner_b = Allocation("cb", "ns/b", "net1", "", "n", "node2")
    assert e2.add(owner_b)[0][1] == 252 and len(picks) == 1  # 99% into .1-.254: .252
    assert batch.memory(combiner.combiner((e2.identity, "198.51.100.0-24"))).hot()
    got = e2.add(Allocation("cc", "ns/c", "net1", "", "n", "node2"))[0][1]
    assert len(picks) == 2 and got == 253  # hot: scattered from the first candidate (.252 is taken)


def test_the_agents_memory_of_a_pool_serves_only_while_no_other_holder_wrote(tmp_path: Path) -> None:
    """ipam.agentreads.Memory: the pool as this process' last write left it is offered to its next batch
    only while the node lock's counter moved by exactly one since (no other holder in between); a
    plugin process' read policy (ipam.attempt.Stored) knows nothing of the pool's heat."""
    path = str(tmp_path / "locks" / "p.lock")
    pool = Pool("p", RANGE, {"1": A}, "7")
    memory = Memory()
    with nodelock.held(path) as first:
        assert memory.view(first) is None  # nothing kept yet
        memory.wrote(first, pool, "7")
    with nodelock.held(path) as second:
        assert memory.view(second) is pool and memory.floor == "7"
    with nodelock.held(path) as third:  # another holder (the second) came in between
        assert memory.view(third) is None
        memory.wrote(third, pool, "8")
    with nodelock.held(path) as fourth:
        assert memory.view(fourth) is pool
    assert memory.view(None) is None  # without the lock: no way to tell
    assert Stored().hot() is None
    assert sorted(os.listdir(tmp_path / "locks")) == ["p.lock"] and os.stat(path).st_size == 8


def _op() -> operation.Op:
    return operation.Op("add", rng(), A, False)


def test_the_agents_del_batch_releases_its_reservations_before_it_ends(shared: None, tmp_path: Path) -> None:
    """In the agent a batch of DELs deletes the freed entries' reservations itself, after its write and
    before its callers return (so they return together): every release is made by a batch runner, not
    by each caller after the batch. One release failing is that call's error alone."""
    backend = Backend()
    n = 8
    owners = [Allocation(f"c{i}", f"ns/p{i}", "net1", "", "n", "node1") for i in range(n)]
    conf = from_dict({"range": RANGE, "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "db")})  # fmt: skip
    releasers: set[int] = set()

    class Releasing(GatedStore):
        def delete_reservation(self, res: Reservation) -> None:
            releasers.add(threading.get_ident())
            if res.owner.container_id == "c3":
                raise CniError("refused", code=Code.INTERNAL)
            super().delete_reservation(res)

    def engine(writes: list[int]) -> Engine:
        return _gated(Releasing(backend, writes, queued, n), conf)

    added: list[int] = []  # one list per phase: only the phase's first write waits for the others
    queued = count_queued()
    in_threads(n, lambda i: engine(added).add(owners[i]))
    queued = count_queued()
    removed: list[int] = []
    failed: list[str] = []

    def delete(i: int) -> None:
        try:
            engine(removed).delete(owners[i])
        except CniError as e:
            failed.append(f"{owners[i].container_id}: {e.msg}")

    in_threads(n, delete)
    assert backend.pools["198.51.100.0-24"].allocations == {} and len(removed) <= 2
    assert failed == ["c3: refused"]
    assert [r.owner.container_id for r in backend.reservations.values()] == ["c3"]
    assert len(releasers) <= 2  # the batch runners (the first write, then the rest), not every caller


class LaggingStore(MemoryStore):
    """A memory store with a cache that may lag: `recent_pool` answers `lagged` while the test sets one
    (the pool as it was a moment ago), else the pool as stored. Records which read served each call."""

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        self.lagged: Pool | None = None
        self.reads: list[tuple[str, str]] = []

    def get_pool(self, name: str) -> Pool | None:
        self.reads.append(("stored", ""))
        return super().get_pool(name)

    def recent_pool(self, name: str, version: str) -> Pool | None:
        self.reads.append(("recent", version))
        return self.lagged if self.lagged is not None else MemoryStore.get_pool(self, name)


def _lagging(backend: Backend, tmp_path: Path) -> tuple[Engine, LaggingStore]:
    conf = from_dict({"range": RANGE, "datastore": "kubernetes", "kubernetes": {"kubeconfig": "/nonexistent"},
                      "local_db": str(tmp_path / "state" / "ipam.db")})  # fmt: skip
    store = LaggingStore(backend)
    return Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=plugin.EXECUTE), store


def test_a_read_without_a_snapshot_asks_for_the_pool_no_older_than_this_nodes_last_write(
    kept: None, tmp_path: Path,
) -> None:
    """The agent keeps the pool's version after its write (its floor: ipam.agentreads.Memory): a later
    batch that must read the pool lets the store answer from a cache at least that new."""
    backend = Backend()
    e, store = _lagging(backend, tmp_path)
    e.add(A)
    floor = backend.pools["198.51.100.0-24"].version
    store.reads.clear()
    assert e.add(B)[0][1] == 2
    assert store.reads == [("recent", floor)]
    memory = batch.memory(combiner.combiner((e.identity, "198.51.100.0-24")))
    assert memory.floor == backend.pools["198.51.100.0-24"].version


def test_a_del_that_finds_nothing_in_a_cached_read_reads_the_pool_as_stored(
    kept: None, tmp_path: Path
) -> None:
    """B's entry was written outside this node's lock after its last write, and the cache does not
    hold it yet: the DEL does not conclude there is nothing to free before reading the stored pool."""
    backend = Backend()
    e, store = _lagging(backend, tmp_path)
    e.add(A)
    store.lagged = MemoryStore(backend).get_pool("198.51.100.0-24")  # the cache stays here
    other = MemoryStore(backend)
    pool = other.get_pool("198.51.100.0-24")
    assert pool is not None
    other.commit_pool(pool, PoolUpdate(put={"9": B}))
    store.reads.clear()
    e.delete(B)
    assert [kind for kind, _ in store.reads] == ["recent", "stored"]
    assert set(backend.pools["198.51.100.0-24"].allocations) == {"1"}


def test_after_a_failed_write_the_next_attempt_reads_the_pool_as_stored(kept: None, tmp_path: Path) -> None:
    """A write decided on a cached read that no longer fits fails; the retry does not ask the cache
    again (it may still lack what the write met) but reads the pool as stored."""
    backend = Backend()
    e, store = _lagging(backend, tmp_path)
    e.add(A)
    store.lagged = MemoryStore(backend).get_pool("198.51.100.0-24")
    other = MemoryStore(backend)
    pool = other.get_pool("198.51.100.0-24")
    assert pool is not None
    other.commit_pool(pool, PoolUpdate(put={"2": C}))  # the version the cache answers is gone
    store.reads.clear()
    assert e.add(B)[0][1] not in (1, 2)  # (the lost write heated the pool: a scattered candidate)
    kinds = [kind for kind, _ in store.reads]
    assert kinds[0] == "recent" and kinds[1:] and set(kinds[1:]) == {"stored"}
    assert len(backend.pools["198.51.100.0-24"].allocations) == 3


def test_idle_combiners_are_dropped_with_what_they_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 45: the agent kept one combiner per pool it ever wrote, each holding its memory of the pool
    (up to a 1.5 MB object), for its whole life. A combiner idle for IDLE_SECONDS (0 here) is dropped at
    a later lookup: 1,000 networks, each used once, leave at most LOOK_EVERY combiners, and what the early
    ones kept is gone (not only unreachable from the registry)."""
    import gc
    import weakref

    monkeypatch.setattr(combiner, "IDLE_SECONDS", 0.0)
    monkeypatch.setattr(combiner, "LOOK_EVERY", 16)
    backend = Backend()
    store = MemoryStore(backend)
    kept: list[weakref.ref[Any]] = []
    batch.install()
    try:
        for i in range(1000):
            conf = from_dict({"range": RANGE, "network_name": f"net{i}", "datastore": "kubernetes",
                              "kubernetes": {"kubeconfig": "/nonexistent"},
                              "local_db": str(tmp_path / "db")})  # fmt: skip
            e = Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=batch.run)
            e.add(A)
            if i < 10:
                comb = combiner.combiner((e.identity, e.pool_name(conf.ranges[0])))
                kept.append(weakref.ref(batch.memory(comb)))
                del comb
            assert combiner.count() <= 16 + 1
        assert combiner.settle_all(30)
    finally:
        batch.uninstall()
    gc.collect()
    assert all(ref() is None for ref in kept), "an early network's memory is still held"
    assert len(backend.pools) == 1000  # (every network was written)
