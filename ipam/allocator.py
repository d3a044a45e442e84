"""Pure allocation: (range, pool view, owner) -> the address and the pool update to commit.

A view is a store's direct answer (ipam.store.local) or `SnapshotView` over a loaded pool. In a
snapshot the lowest free address costs O(k log n) for k segments and n allocations: within a segment
[lo, hi] the taken offsets are sorted and distinct, so "taken[j] == lo + j" holds for a prefix of them
and a binary search finds where it first fails. Nothing ever walks the range address by address."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence, Set

from cni import log
from cni.errors import ExhaustedError
from cni.types.valueclass import valueclass
from ipam.model import Allocation, Pool, PoolUpdate, PoolView, Segment
from ipam.ranges import IPRange


@valueclass
class Decision:
    """`kind`: "existing" (same owner, nothing to write), "takeover" (same pod and ifname, new
    container id: rewritten in place) or "new"."""

    offset: int
    kind: str
    update: PoolUpdate


def offsets(allocations: Mapping[str, Allocation]) -> list[int]:
    """The taken offsets, sorted; keys that are not decimal integers are logged and skipped (they
    stay in the store untouched)."""
    out = set()
    for key in allocations:
        try:
            out.add(int(key))
        except ValueError:
            log.warning("pool allocation key %r is not a decimal offset; ignored", key)
    return sorted(out)


def lowest_free(segments: Iterable[Segment], taken: list[int]) -> int | None:
    """The lowest value in `segments` (ascending, inclusive) not in `taken` (sorted, distinct)."""
    for lo, hi in segments:
        i = bisect_left(taken, lo)
        a, b = i, bisect_right(taken, hi, lo=i)
        while a < b:
            m = (a + b) // 2
            if taken[m] == lo + (m - i):
                a = m + 1
            else:
                b = m
        candidate = lo + (a - i)
        if candidate <= hi:
            return candidate
    return None


class SnapshotView:
    """PoolView over a loaded Pool."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._taken: list[int] | None = None

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def range(self) -> str:
        return self.pool.range

    @property
    def version(self) -> str | None:
        return self.pool.version

    def count(self) -> int:
        return len(self.pool.allocations)

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        match = owner.same_pod_interface if by_pod else owner.same_attachment
        return sorted(((k, a) for k, a in self.pool.allocations.items() if match(a)), key=_numeric)

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        if self._taken is None:
            self._taken = offsets(self.pool.allocations)
        # skip blocked candidates one by one (few) instead of merging them into `taken` (large)
        segs = list(segments)
        while True:
            candidate = lowest_free(segs, self._taken)
            if candidate is None or candidate not in blocked:
                return candidate
            segs = [(max(lo, candidate + 1), hi) for lo, hi in segs if hi > candidate]


def _numeric(item: tuple[str, Allocation]) -> tuple[int, str]:
    return len(item[0]), item[0]


def _randrange(n: int) -> int:
    """random.randrange(n), the module imported on first use (a spread > 1: only after lost races);
    importing `random` would cost every plugin call."""
    import random

    return random.randrange(n)


def segments_as_offsets(rng: IPRange) -> list[Segment]:
    return [(lo - rng.base, hi - rng.base) for lo, hi in rng.segments]


def allocate(
    rng: IPRange,
    pool: PoolView | Pool,
    owner: Allocation,
    blocked: Set[int] = frozenset(),
    prefer: Sequence[int] = (),
    spread: int = 1,
    pick: Callable[[int], int] | None = None,
    start: int | None = None,
) -> Decision:
    """The owner's address in this pool. `blocked`: offsets held elsewhere (overlapping ranges).
    Under contention (ipam.engine): `prefer` offsets this call already reserved, if still free;
    `spread` > 1 picks at random among the lowest `spread` free offsets instead of the lowest, so
    racers that lost a candidate stop colliding on the next one; `start` (a pool other nodes write at
    the same time) takes the lowest free offset at or after `start`, wrapping around, so writers that
    start at different points of the range do not collide at all."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    mine = view.owned(owner)
    if mine:
        return Decision(int(mine[0][0]), "existing", PoolUpdate())
    old = view.owned(owner, by_pod=True) if owner.podref else []
    if old:
        key, prev = old[0]
        log.info(
            "%s %s: taking over %s from container %s",
            owner.podref,
            owner.ifname,
            rng.address(int(key)),
            prev.container_id,
        )
        return Decision(int(key), "takeover", PoolUpdate(put={key: owner}))
    segments = segments_as_offsets(rng)
    for want in prefer:
        free = want not in blocked and view.lowest_free([(want, want)], blocked) == want
        if free and _inside(segments, want):
            return Decision(want, "new", PoolUpdate(put={str(want): owner}))
    offset = None if start is None else view.lowest_free(_after(segments, start - 1), blocked)
    if offset is None:
        offset = view.lowest_free(segments, blocked)
    if offset is not None and spread > 1 and start is None:
        candidates = [offset]
        while len(candidates) < spread:
            nxt = view.lowest_free(_after(segments, candidates[-1]), blocked)
            if nxt is None:
                break
            candidates.append(nxt)
        offset = candidates[(pick or _randrange)(len(candidates))]
    if offset is None:
        raise ExhaustedError(
            f"no free address in {rng.describe()}",
            f"{view.count()} of {rng.size} allocated in pool {view.name}",
        )
    return Decision(offset, "new", PoolUpdate(put={str(offset): owner}))


def scatter(segments: Sequence[Segment], point: float) -> int:
    """The offset at fraction `point` (0 <= point < 1) of the segments' addresses taken together."""
    total = sum(hi - lo + 1 for lo, hi in segments)
    left = min(int(point * total), total - 1)
    for lo, hi in segments:
        if left <= hi - lo:
            return lo + left
        left -= hi - lo + 1
    return segments[0][0] if segments else 0


def _inside(segments: Sequence[Segment], offset: int) -> bool:
    return any(lo <= offset <= hi for lo, hi in segments)


def _after(segments: Sequence[Segment], offset: int) -> list[Segment]:
    """The segments trimmed to the offsets above `offset`."""
    return [(max(lo, offset + 1), hi) for lo, hi in segments if hi > offset]


def release(pool: PoolView | Pool, owner: Allocation) -> PoolUpdate:
    """Remove every allocation of this attachment (container id and ifname)."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    return PoolUpdate(remove=frozenset(k for k, _ in view.owned(owner)))


def find(pool: PoolView | Pool, owner: Allocation) -> tuple[str, Allocation] | None:
    """The allocation of this attachment, lowest offset first."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    mine = view.owned(owner)
    return mine[0] if mine else None
