"""One IPAM operation: one attachment's ADD or DEL in one range, with what it has claimed so far and where
it is in its batch (ipam.attempt runs batches; ipam.exec_plain and ipam.batch hand them over).

`state` is one of pending -> decided -> written | failed, changed only by `Op.to`, which refuses a
transition TRANSITIONS does not list. `done` once written or failed."""

from __future__ import annotations

from cni.errors import TryAgainError
from cni.types.valueclass import field, valueclass
from ipam.model import Allocation
from ipam.ranges import IPRange

PENDING, DECIDED, WRITTEN, FAILED = "pending", "decided", "written", "failed"
FINAL = (WRITTEN, FAILED)
TRANSITIONS: dict[str, tuple[str, ...]] = {
    PENDING: (DECIDED, FAILED),  # decided on the batch's view; or its own error (pool full, ...)
    # written; its batch failed (or a DEL's reservation release); or its decision dropped (a stale
    # view, a write lost to a racer): decided again
    DECIDED: (WRITTEN, FAILED, PENDING),
    WRITTEN: (),
    FAILED: (PENDING,),  # a failure met on a view found stale: decided again on the pool as stored
}


class Unanswered(TryAgainError):
    """The caller of an op waited its whole budget for the agent's batch (ipam.combiner): code 11. `held`:
    an op of the call is still in a batch under way, which owns it (and its claims) until that batch
    ends."""

    def __init__(self, msg: str, held: bool) -> None:
        super().__init__(msg)
        self.held = held


class IllegalTransition(RuntimeError):
    """An op moved between states TRANSITIONS does not connect: a bug in the batch's executor."""


@valueclass(frozen=False)
class Claims:
    blocked: set[int] = field(default_factory=set)
    created: dict[str, str] = field(default_factory=dict)  # reservations made by this op: name -> version
    mine: dict[str, int] = field(default_factory=dict)  # their offsets: name -> offset
    # reservations whose create got no answer (a read timeout, a 504, the connection lost: the server may
    # have applied it), not found since: name -> offset (ipam.reservations: adopted or dropped)
    maybe: dict[str, int] = field(default_factory=dict)
    lost: int = 0  # candidates found reserved by someone else on this network
    holders: dict[int, Allocation] = field(default_factory=dict)  # blocked offsets: who reserved them


@valueclass(frozen=False)
class Op:
    kind: str  # "add" | "del"
    rng: IPRange
    owner: Allocation
    overlapping: bool
    claims: Claims = field(default_factory=Claims)
    offsets: list[int] = field(default_factory=list)  # add: [the address]
    want: int | None = None  # add: the requested address (ipam.requested): exactly it, or an error
    freed: list[tuple[int, Allocation]] = field(default_factory=list)  # del: offsets and entries freed
    # del: entries a write whose answer was lost (it may have been applied) freed: released after the
    # batch's write like `freed`, though the retry may no longer find them in the pool
    sent: list[tuple[int, Allocation]] = field(default_factory=list)
    begun: float = 0.0  # when the op started
    started: float = 0.0  # when it last saw progress (its start, or a race lost to another writer)
    error: BaseException | None = None  # set with FAILED (Op.to), cleared when taken back
    state: str = "pending"  # PENDING ... FAILED: changed by `to` alone

    @property
    def done(self) -> bool:
        """Written, or failed with its own error."""
        return self.state in FINAL

    def to(self, state: str, error: BaseException | None = None) -> None:
        """The one place an op changes state: refuses a transition TRANSITIONS does not list. FAILED
        takes the op's error; any other state clears it."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.kind} {self.owner.container_id}: {self.state} -> {state}")
        if (error is None) == (state == FAILED):
            raise IllegalTransition(f"{self.kind} {self.owner.container_id}: {state} with error {error!r}")
        self.state, self.error = state, error
