"""Allocation for one attachment in one range, the one-call form of the pure decision core (ipam.decide):
the address and the pool update to commit, or ExhaustedError. The engine batches through ipam.decide."""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set

from cni import log
from cni.errors import AddressTakenError, ConfigError, ExhaustedError
from cni.types.valueclass import valueclass
from ipam import decide
from ipam.decide import SnapshotView, lowest_free, scatter
from ipam.model import Allocation, Pool, PoolUpdate, PoolView, Segment
from ipam.ranges import IPRange

__all__ = ["Decision", "SnapshotView", "allocate", "find", "lowest_free", "release", "scatter"]


@valueclass
class Decision:
    """`kind`: "existing" (same owner, nothing to write), "takeover" (same pod and ifname, new
    container id: rewritten in place) or "new"."""

    offset: int
    kind: str
    update: PoolUpdate


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
    want: int | None = None,
) -> Decision:
    """The owner's address in this pool (ipam.decide.add): `blocked` offsets are held elsewhere,
    `prefer` offsets this call already reserved (kept while free), `spread` > 1 picks with `pick(n)`
    among the lowest `spread` free offsets, `start` takes the lowest free offset at or after it,
    wrapping around. `want` (a requested address, ipam.requested): exactly that offset, or code 109
    naming its holder (the same attachment holding another address in the pool: code 7)."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    segments = segments_as_offsets(rng)
    op = decide.Add(owner, reserved=tuple(prefer), blocked=frozenset(blocked), start=start, want=want)
    outcome = decide.add(view, op, segments)
    new = isinstance(outcome, decide.Took) and outcome.kind == "new" and outcome.offset not in prefer
    if new and spread > 1 and start is None and want is None:
        assert isinstance(outcome, decide.Took)
        found = decide.candidates(view, segments, op.blocked, outcome.offset, spread)
        outcome = decide.Took(found[(pick or _randrange)(len(found))], "new")
    return decision(rng, view, owner, outcome)


def decision(rng: IPRange, view: PoolView, owner: Allocation, outcome: decide.Outcome) -> Decision:
    """An Add's outcome as the executor acts on it: pool full is ExhaustedError (code 2 with the pool's
    count), a requested offset held by another AddressTakenError (code 109 naming the holder), a request
    from an attachment holding another address ConfigError, a takeover is logged."""
    if isinstance(outcome, decide.Taken):
        raise taken(rng, outcome.offset, outcome.holder, f"pool {view.name}")
    if isinstance(outcome, decide.Elsewhere):
        raise ConfigError(
            f"{rng.address(outcome.want)}: container {owner.container_id} {owner.ifname} already holds "
            f"{rng.address(outcome.offset)} in pool {view.name} (DEL it first)"
        )
    if isinstance(outcome, decide.Full):
        raise ExhaustedError(
            f"no free address in {rng.describe()}",
            f"{outcome.count} of {rng.size} allocated in pool {view.name}",
        )
    if not isinstance(outcome, decide.Took):
        raise TypeError(f"not an address: {outcome!r}")
    if outcome.kind == "existing":
        return Decision(outcome.offset, "existing", PoolUpdate())
    if outcome.previous is not None:
        log.info("%s %s: taking over %s from container %s", owner.podref, owner.ifname,
                 rng.address(outcome.offset), outcome.previous.container_id)  # fmt: skip
    return Decision(outcome.offset, outcome.kind, PoolUpdate(put={str(outcome.offset): owner}))


def taken(rng: IPRange, offset: int, holder: Allocation | None, where: str) -> AddressTakenError:
    """Code 109: the requested address at `offset` is held by `holder` (`where`: its pool or reservation)."""
    if holder is None:
        who = "another attachment"
    else:
        pod = f"pod {holder.podref}" if holder.podref else "no pod"
        who = f"{pod} (container {holder.container_id or '?'} {holder.ifname or '?'})"
    return AddressTakenError(
        f"requested address {rng.address(offset)} is held by {who}", f"{where}; nothing allocated"
    )


def _randrange(n: int) -> int:
    """random.randrange(n), the module imported on first use (a spread > 1: only after lost races);
    importing `random` would cost every plugin call."""
    import random

    return random.randrange(n)


def release(pool: PoolView | Pool, owner: Allocation) -> PoolUpdate:
    """Remove every allocation of this attachment (container id and ifname)."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    return PoolUpdate(remove=frozenset(k for k, _ in view.owned(owner)))


def find(pool: PoolView | Pool, owner: Allocation) -> tuple[str, Allocation] | None:
    """The allocation of this attachment, lowest offset first."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    mine = view.owned(owner)
    return mine[0] if mine else None
