"""The reference store (tests only, not part of the product nor the bundle): the protocol's semantics
with nothing else, in memory. Used by unit tests and as the model the contract suite checks the real
stores against. Handles share one `Backend`; each handle may be used from its own thread."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store.base import Conflict, Store, StoreUnavailable

PAGE = 50  # pools per page while iterating: small, so tests exercise paging


@dataclass
class _Pool:
    range: str
    allocations: dict[str, Allocation]
    version: str


@dataclass
class Backend:
    """The shared state. `down` makes every handle raise StoreUnavailable (outage tests)."""

    pools: dict[str, _Pool] = field(default_factory=dict)
    reservations: dict[str, Reservation] = field(default_factory=dict)
    down: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    _counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_version(self) -> str:
        """Versions are never reused, so an old snapshot can never match again (no ABA)."""
        return str(next(self._counter))


class MemoryStore(Store):
    def __init__(self, backend: Backend | None = None) -> None:
        self.backend = backend or Backend()

    def _up(self) -> Backend:
        if self.backend.down:
            raise StoreUnavailable("memory store: down")
        return self.backend

    def get_pool(self, name: str) -> Pool | None:
        b = self._up()
        with b.lock:
            p = b.pools.get(name)
            return None if p is None else Pool(name, p.range, dict(p.allocations), p.version)

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        b = self._up()
        with b.lock:
            current = b.pools.get(pool.name)
            if (current.version if current else None) != pool.version:
                raise Conflict(f"pool {pool.name}: changed since version {pool.version}")
            base = current.allocations if current else {}
            version = b.next_version()
            b.pools[pool.name] = _Pool(current.range if current else pool.range, update.apply(base), version)
            return version

    def iter_pools(self) -> Iterator[Pool]:
        with self._up().lock:
            names = sorted(self.backend.pools)
        for start in range(0, len(names), PAGE):
            for name in names[start : start + PAGE]:
                pool = self.get_pool(name)
                if pool is not None:
                    yield pool

    def get_reservation(self, name: str) -> Reservation | None:
        b = self._up()
        with b.lock:
            return b.reservations.get(name)

    def put_reservation(self, res: Reservation) -> str:
        b = self._up()
        with b.lock:
            current = b.reservations.get(res.name)
            if (current.version if current else None) != res.version:
                raise Conflict(f"reservation {res.name}: changed since version {res.version}")
            version = b.next_version()
            b.reservations[res.name] = Reservation(res.name, res.owner, version)
            return version

    def delete_reservation(self, res: Reservation) -> None:
        b = self._up()
        with b.lock:
            current = b.reservations.get(res.name)
            if current is None:
                return
            if current.version != res.version:
                raise Conflict(f"reservation {res.name}: changed since version {res.version}")
            del b.reservations[res.name]

    def iter_reservations(self) -> Iterator[Reservation]:
        with self._up().lock:
            names = sorted(self.backend.reservations)
        for name in names:
            res = self.get_reservation(name)
            if res is not None:
                yield res

    def ping(self) -> None:
        self._up()

    def close(self) -> None:
        pass
