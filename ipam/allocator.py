"""Pure allocation: (range, pool snapshot, owner) -> the address and the pool update to commit.

Lowest free address in O(k log n) for k segments and n allocations: within a segment [lo, hi] the
taken offsets are sorted and distinct, so "taken[j] == lo + j" holds for a prefix of them and a binary
search finds where it first fails. Nothing ever walks the range address by address."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cni import log
from cni.errors import ExhaustedError
from ipam.ranges import IPRange, Segment
from ipam.store.base import Allocation, Pool, PoolUpdate


@dataclass(frozen=True)
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


def find(pool: Pool, owner: Allocation) -> tuple[str, Allocation] | None:
    """The allocation of this attachment (container id and ifname), lowest offset first."""
    hits = [(k, a) for k, a in pool.allocations.items() if a.same_attachment(owner)]
    return min(hits, key=lambda kv: (len(kv[0]), kv[0])) if hits else None


def find_takeover(pool: Pool, owner: Allocation) -> tuple[str, Allocation] | None:
    """An allocation of the same pod and ifname under another container id (kubelet re-ADD)."""
    if not owner.podref:
        return None
    hits = [(k, a) for k, a in pool.allocations.items() if a.same_pod_interface(owner)]
    return min(hits, key=lambda kv: (len(kv[0]), kv[0])) if hits else None


def segments_as_offsets(rng: IPRange) -> list[Segment]:
    return [(lo - rng.base, hi - rng.base) for lo, hi in rng.segments]


def allocate(rng: IPRange, pool: Pool, owner: Allocation, blocked: Iterable[int] = ()) -> Decision:
    """The owner's address in this pool. `blocked`: offsets held elsewhere (overlapping ranges)."""
    mine = find(pool, owner)
    if mine is not None:
        return Decision(int(mine[0]), "existing", PoolUpdate())
    old = find_takeover(pool, owner)
    if old is not None:
        log.info(
            "%s %s: taking over %s from container %s",
            owner.podref,
            owner.ifname,
            rng.address(int(old[0])),
            old[1].container_id,
        )
        return Decision(int(old[0]), "takeover", PoolUpdate(put={old[0]: owner}))
    taken = offsets(pool.allocations)
    extra = set(blocked)
    if extra:
        taken = sorted(set(taken) | extra)
    offset = lowest_free(segments_as_offsets(rng), taken)
    if offset is None:
        raise ExhaustedError(
            f"no free address in {rng.describe()}",
            f"{len(pool.allocations)} of {rng.size} allocated in pool {pool.name}",
        )
    return Decision(offset, "new", PoolUpdate(put={str(offset): owner}))


def release(pool: Pool, owner: Allocation) -> PoolUpdate:
    """Remove every allocation of this attachment (container id and ifname)."""
    return PoolUpdate(remove=frozenset(k for k, a in pool.allocations.items() if a.same_attachment(owner)))
