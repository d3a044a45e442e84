"""The local store beyond the contract: its indexed PoolView agrees with a snapshot under random
histories (hints included), exclusive() is atomic, a busy database is contention (not an outage),
the file is private and in WAL mode, and many processes can create it at once (a BUSY answer while
creating it is retried)."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ipam.allocator import SnapshotView
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict
from ipam.store.local import LocalStore
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO

A = Allocation("ca", "ns/a", "net1")


def owner(i: int) -> Allocation:
    return Allocation(f"c{i}", f"ns/p{i % 50}", f"net{i % 3}")


@pytest.mark.parametrize("base", [0, 2**63 - 40, 2**64 - 300, 2**100])
def test_view_agrees_with_snapshot_over_a_random_history(tmp_path: Path, base: int) -> None:
    rnd = random.Random(base % 1000 + 7)
    store = LocalStore(str(tmp_path / "db"))
    name = "2001-db8---32"
    store.commit_pool(Pool(name, "2001:db8::/32"), PoolUpdate())
    segment_sets = [
        [(base + 1, base + 200)],
        [(base + 5, base + 30), (base + 60, base + 250)],
        [(base + 100, base + 100), (base + 150, base + 400)],
    ]
    for step in range(200):
        pool = store.get_pool(name)
        assert pool is not None
        snap = SnapshotView(pool)
        segments = rnd.choice(segment_sets)
        blocked = frozenset(rnd.sample(range(base, base + 260), rnd.randint(0, 4)))
        with store.exclusive():
            view = store.view_pool(name)
            assert view is not None
            got = view.lowest_free(segments, blocked)
            assert got == snap.lowest_free(segments, blocked), (step, segments, blocked)
            who = owner(rnd.randint(0, 400))
            assert view.owned(who) == snap.owned(who)
            assert view.owned(who, by_pod=True) == snap.owned(who, by_pod=True)
            assert view.count() == snap.count()
        keys = list(pool.allocations)
        if keys and rnd.random() < 0.4:
            store.commit_pool(
                pool, PoolUpdate(remove=frozenset(rnd.sample(keys, min(len(keys), rnd.randint(1, 5)))))
            )
        elif got is not None:
            store.commit_pool(pool, PoolUpdate(put={str(got): owner(step)}))
    store.close()


def test_view_only_inside_exclusive(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "db"))
    with pytest.raises(RuntimeError):
        store.view_pool("x")
    with store.exclusive():
        assert store.view_pool("x") is None
    store.close()


def test_exclusive_is_atomic(tmp_path: Path) -> None:
    store = LocalStore(str(tmp_path / "db"))
    with pytest.raises(ValueError), store.exclusive():
        store.put_reservation(Reservation("r1", A))
        store.commit_pool(Pool("p", "198.51.100.0/24"), PoolUpdate(put={"1": A}))
        raise ValueError("boom")
    assert store.get_reservation("r1") is None and store.get_pool("p") is None
    with store.exclusive():
        store.put_reservation(Reservation("r1", A))
        store.commit_pool(Pool("p", "198.51.100.0/24"), PoolUpdate(put={"1": A}))
    assert store.get_reservation("r1") is not None and store.get_pool("p") is not None
    store.close()


def test_busy_database_is_a_conflict_not_an_outage(tmp_path: Path) -> None:
    path = str(tmp_path / "db")
    holder, waiter = LocalStore(path), LocalStore(path, busy_timeout=0.2)
    holder.ping()
    with holder.exclusive():
        holder.put_reservation(Reservation("r1", A))
        with pytest.raises(Conflict, match="busy"):
            waiter.put_reservation(Reservation("r2", A))
        with pytest.raises(Conflict, match="busy"), waiter.exclusive():
            pass
        assert waiter.get_reservation("r1") is None  # readers are not blocked (WAL), see the last commit
    holder.close()
    waiter.close()


def test_file_is_private_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "state" / "db"
    store = LocalStore(str(path))
    store.ping()
    store.close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_many_processes_create_the_database_at_once(tmp_path: Path) -> None:
    path = str(tmp_path / "new" / "db")
    code = (
        "import sys; from ipam.store.local import LocalStore; "
        "from ipam.model import Allocation, Reservation; "
        "s = LocalStore(sys.argv[1]); s.put_reservation(Reservation('r' + sys.argv[2], "
        "Allocation('c', 'ns/p', 'net1'))); s.close()"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, path, str(i)],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": PYTHONPATH},
            stderr=subprocess.PIPE,
        )
        for i in range(12)
    ]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert all(p.returncode == 0 for p in procs), errors
    store = LocalStore(path)
    assert len(list(store.iter_reservations())) == 12
    store.close()


def busy_error() -> sqlite3.OperationalError:
    e = sqlite3.OperationalError("database is locked")
    e.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
    return e


def test_a_busy_answer_while_creating_the_database_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Concurrent first users switching a new database to WAL: SQLite can answer BUSY there without
    waiting for its busy timeout. That is retried (within the timeout), then contention, never an
    outage (which the CI once saw as 'database is locked' in the concurrent-create contract test)."""
    from ipam.store import local

    real, calls = local._initialise, []

    def flaky(conn: sqlite3.Connection) -> None:
        calls.append(1)
        if len(calls) <= 3:
            raise busy_error()
        real(conn)

    monkeypatch.setattr(local, "_initialise", flaky)
    store = LocalStore(str(tmp_path / "db"))
    store.put_reservation(Reservation("r1", A))
    assert len(calls) == 4 and store.get_reservation("r1") is not None
    store.close()

    monkeypatch.setattr(local, "_initialise", lambda conn: (_ for _ in ()).throw(busy_error()))
    stuck = LocalStore(str(tmp_path / "db2"), busy_timeout=0.1)
    with pytest.raises(Conflict, match="busy"):
        stuck.ping()


def test_view_queries_use_their_indexes(tmp_path: Path) -> None:
    from ipam.store.localview import SCAN_SQL, owned_sql

    store = LocalStore(str(tmp_path / "db"))
    store.ping()
    store.close()
    conn = sqlite3.connect(tmp_path / "db")
    plans = {
        sql: " ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, ("p", "a", "b")))
        for sql in (owned_sql(False), owned_sql(True))
    }
    plans[SCAN_SQL] = " ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + SCAN_SQL, ("p", "1", "2")))
    assert "INDEX allocations_owner (pool=? AND container_id=? AND ifname=?)" in plans[owned_sql(False)]
    assert "INDEX allocations_pod (pool=? AND podref=? AND ifname=?)" in plans[owned_sql(True)]
    assert "COVERING INDEX allocations_num (pool=? AND num>? AND num<?)" in plans[SCAN_SQL]
