"""The batch state machine of an IPAM operation (ipam.operation.Op.to): pending -> decided -> written |
failed, every other move refused."""

from __future__ import annotations

import itertools

import pytest

from cni.errors import CniError, Code
from ipam.config import from_dict
from ipam.model import Allocation
from ipam.operation import DECIDED, FAILED, FINAL, PENDING, TRANSITIONS, WRITTEN, IllegalTransition, Op

STATES = (PENDING, DECIDED, WRITTEN, FAILED)
LEGAL = {
    (PENDING, DECIDED), (PENDING, FAILED),
    (DECIDED, WRITTEN), (DECIDED, FAILED), (DECIDED, PENDING),
    (FAILED, PENDING),
}  # fmt: skip
PATH = {  # a legal way from pending to each state
    PENDING: (), DECIDED: (DECIDED,), WRITTEN: (DECIDED, WRITTEN), FAILED: (FAILED,),
}  # fmt: skip
ERR = CniError("pool full", code=Code.POOL_EXHAUSTED)


def op_in(state: str) -> Op:
    rng = from_dict({"datastore": "local", "range": "198.51.100.0/24"}).ranges[0]
    op = Op("add", rng, Allocation("c1", "ns/p1", "net1"), False)
    for step in PATH[state]:
        op.to(step, ERR if step == FAILED else None)
    return op


def test_the_table_is_exactly_the_designed_one() -> None:
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
    assert set(TRANSITIONS) == set(STATES) and set(FINAL) == {WRITTEN, FAILED}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(STATES, STATES)))
def test_every_move_the_table_lists_is_taken_and_every_other_refused(old: str, new: str) -> None:
    op = op_in(old)
    error = ERR if new == FAILED else None
    if (old, new) in LEGAL:
        op.to(new, error)
        assert op.state == new and op.error is error and op.done == (new in FINAL)
    else:
        with pytest.raises(IllegalTransition, match=f"{old} -> {new}"):
            op.to(new, error)
        assert op.state == old  # refused: nothing changed


def test_failed_takes_an_error_and_every_other_state_clears_it() -> None:
    op = op_in(PENDING)
    with pytest.raises(IllegalTransition):
        op.to(FAILED)  # a failure without its error
    with pytest.raises(IllegalTransition):
        op.to(DECIDED, ERR)
    op.to(FAILED, ERR)
    assert op.done and op.error is ERR
    op.to(PENDING)  # taken back (a failure met on a stale view)
    assert not op.done and op.error is None
