"""PoolView answered by SQLite directly (ipam.store.local), so an ADD into a pool of 100,000 costs a
few indexed queries instead of loading the pool.

Offsets are also kept as `num`, zero-padded to 40 digits (2**128 has 39), so text order is numeric
order for any IPv6 offset. `hints` remember, per pool and segment start `lo`, an offset `next` such
that every offset in [lo, next) is allocated: the search for the lowest free offset starts there.
A hint is only ever a lower bound (removals lower it, see LocalStore.commit_pool), so a stale hint can
cost a longer scan, never a wrong answer: the scan checks the rows themselves."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence, Set

from ipam.model import Allocation, Segment

OWNER = "container_id, podref, ifname, pod_uid, network, node"


def pad(n: int) -> str:
    return f"{n:040d}"


def num_of(key: str) -> str | None:
    return pad(int(key)) if key.isdigit() else None


SCAN_SQL = "SELECT num FROM allocations WHERE pool = ? AND num >= ? AND num <= ? ORDER BY num"


def owned_sql(by_pod: bool) -> str:
    """INDEXED BY: without statistics SQLite prefers scanning the pool's primary-key range."""
    index, column = ("allocations_pod", "podref") if by_pod else ("allocations_owner", "container_id")
    return (
        f"SELECT offset, {OWNER} FROM allocations INDEXED BY {index} "
        f"WHERE pool = ? AND {column} = ? AND ifname = ?"
    )


class LocalView:
    def __init__(self, conn: sqlite3.Connection, name: str, rng: str, version: str) -> None:
        self.conn, self.name, self.range = conn, name, rng
        self.version: str | None = version

    def count(self) -> int:
        return int(
            self.conn.execute("SELECT count(*) FROM allocations WHERE pool = ?", (self.name,)).fetchone()[0]
        )

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        value = owner.podref if by_pod else owner.container_id
        rows = self.conn.execute(owned_sql(by_pod), (self.name, value, owner.ifname))
        return sorted(((r[0], Allocation._make(r[1:])) for r in rows), key=lambda kv: (len(kv[0]), kv[0]))

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        for lo, hi in segments:
            row = self.conn.execute(
                "SELECT next FROM hints WHERE pool = ? AND lo = ?", (self.name, pad(lo))
            ).fetchone()
            start = max(lo, int(row[0])) if row else lo
            free, untaken = self._scan(start, hi, blocked)
            if untaken != start or row is None:
                self.conn.execute(
                    "INSERT OR REPLACE INTO hints (pool, lo, next) VALUES (?, ?, ?)",
                    (self.name, pad(lo), pad(untaken)),
                )
            if free is not None:
                return free
        return None

    def holder(self, offset: int) -> Allocation | None:
        row = self.conn.execute(
            f"SELECT {OWNER} FROM allocations WHERE pool = ? AND num = ?", (self.name, pad(offset))
        ).fetchone()
        return None if row is None else Allocation._make(row)

    def _scan(self, start: int, hi: int, blocked: Set[int]) -> tuple[int | None, int]:
        """(lowest free offset in [start, hi] not blocked, lowest offset >= start not allocated)."""
        expected, untaken = start, None
        rows = self.conn.execute(SCAN_SQL, (self.name, pad(start), pad(hi)))
        for (num,) in rows:
            n = int(num)
            while expected < n:
                untaken = expected if untaken is None else untaken
                if expected not in blocked:
                    return expected, untaken
                expected += 1
            expected = n + 1
        while expected <= hi:
            untaken = expected if untaken is None else untaken
            if expected not in blocked:
                return expected, untaken
            expected += 1
        return None, hi + 1 if untaken is None else untaken
