"""An ADD's outcome from the pure decision core (ipam.decide) as the executor acts on it (ipam.attempt):
the address and the pool update to commit, or the CNI error (pool exhausted, a requested address taken)."""

from __future__ import annotations

from cni import log
from cni.errors import AddressTakenError, ConfigError, ExhaustedError
from cni.types.valueclass import valueclass
from ipam import decide
from ipam.decide import SnapshotView
from ipam.model import Allocation, PoolView, Segment
from ipam.ranges import IPRange

__all__ = ["Decision", "SnapshotView", "decision", "find", "segments_as_offsets", "taken"]


@valueclass
class Decision:
    """`kind`: "existing" (same owner, nothing to write), "takeover" (same pod and ifname, new
    container id: rewritten in place) or "new"."""

    offset: int
    kind: str


def segments_as_offsets(rng: IPRange) -> list[Segment]:
    return [(lo - rng.base, hi - rng.base) for lo, hi in rng.segments]


def decision(rng: IPRange, view: PoolView, owner: Allocation, outcome: decide.Outcome) -> Decision:
    """An Add's outcome as the executor acts on it: pool full is ExhaustedError (code 100 with the pool's
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
        return Decision(outcome.offset, "existing")
    if outcome.previous is not None:
        log.info("%s %s: taking over %s from container %s", owner.podref, owner.ifname,
                 rng.address(outcome.offset), outcome.previous.container_id)  # fmt: skip
    return Decision(outcome.offset, outcome.kind)


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


def find(view: PoolView, owner: Allocation) -> tuple[str, Allocation] | None:
    """The allocation of this attachment, lowest offset first."""
    mine = view.owned(owner)
    return mine[0] if mine else None
