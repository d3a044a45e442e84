"""The agent's pool batch thread never wedges a pool (issue 37): whatever raises in its bookkeeping (a
fault point at each step), every caller is answered (an address or code 11), the thread ends with its
flag cleared, the calls queued behind it get a new thread, and the pool serves the next calls. A caller
never waits without a bound. Ordering is by gates and the combiner's own counts, never by the clock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import faults
from cni.errors import CniError, Code
from ipam import batch, combiner, operation
from ipam.operation import Op
from tests.unit.helpers import written
from tests.unit.ipam.conftest import count_queued
from tests.unit.ipam.test_agent_batches import POOL, Setup, owner
from tests.waits import until

POINTS = ["batch-take", "batch-done"]


class Boom(RuntimeError):
    """The injected failure."""


class Once:
    """Raises Boom the first time `what` is reached, then never again."""

    def __init__(self, what: str) -> None:
        self.what, self.fired, self.lock = what, 0, threading.Lock()

    def __call__(self, what: str) -> None:
        with self.lock:
            if what != self.what or self.fired:
                return
            self.fired += 1
        raise Boom(what)


@pytest.fixture
def agent(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The agent's combiners, a batch of one call each."""
    batch.install()
    monkeypatch.setattr(combiner, "MAX_BATCH", 1)
    yield
    assert combiner.settle_all(30)
    batch.uninstall()


def _outcome(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except CniError as e:
        return e


def _start(call: Callable[[], Any], into: list[Any]) -> threading.Thread:
    t = threading.Thread(target=lambda: into.append(_outcome(call)), daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("point", POINTS)
def test_a_fault_in_the_batch_thread_answers_every_caller(
    point: str, agent: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    s = Setup(tmp_path)
    once = Once(point)
    e = s.engine()
    comb = combiner.combiner((e.identity, POOL))
    got_a: list[Any] = []
    a = _start(lambda: s.engine().add(owner(1))[0][1], got_a)
    # A's write is held at the gate; B and C queue behind its batch
    assert s.arrived.wait(30)
    monkeypatch.setattr(faults, "hook", once)
    queued = count_queued()
    got_b: list[Any] = []
    got_c: list[Any] = []
    b = _start(lambda: s.engine().add(owner(2))[0][1], got_b)
    until(lambda: queued["combiner-queued"] == 1, "one call pending")
    c = _start(lambda: s.engine().add(owner(3))[0][1], got_c)
    until(lambda: queued["combiner-queued"] == 2, "two calls pending")
    s.gate.set()
    for t in (a, b, c):
        t.join(60)
        assert not t.is_alive(), "a caller was never answered"
    assert once.fired == 1, f"{point} was never reached"
    outcomes = got_a + got_b + got_c
    for o in outcomes:  # an address, or code 11 (its batch failed before it was decided)
        assert isinstance(o, int) or (isinstance(o, CniError) and o.code == Code.TRY_AGAIN_LATER), o
    assert sum(isinstance(o, int) for o in outcomes) >= 2
    # the pool serves the next call, and settles: no thread left with its flag set
    assert isinstance(s.engine().add(owner(4))[0][1], int)
    assert comb.settle(30)
    pool = s.backend.pools[POOL].allocations
    held = {r.owner.container_id for r in s.backend.reservations.values()}
    for i, o in zip((1, 2, 3), outcomes, strict=True):
        mine = [k for k, al in pool.items() if al.container_id == f"c{i}"]
        if isinstance(o, int):
            assert mine == [str(o)] and f"c{i}" in held  # answered and written
        else:
            assert mine == [] and f"c{i}" not in held  # refused: nothing of it left
    assert "c4" in held and "c4" in {al.container_id for al in pool.values()}


def test_a_thread_that_cannot_start_its_batch_fails_what_it_took(
    agent: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fault at the very first step: the caller gets code 11, the next call a new thread."""
    s = Setup(tmp_path)
    s.gate.set()
    monkeypatch.setattr(faults, "hook", Once("batch-take"))
    first = _outcome(lambda: s.engine().add(owner(1)))
    assert isinstance(first, CniError) and first.code == Code.TRY_AGAIN_LATER and "Boom" in first.msg
    assert s.engine().add(owner(2))[0][1] == 1  # the address the refused call never took
    assert [r.owner.container_id for r in s.backend.reservations.values()] == ["c2"]


def test_a_caller_waits_with_a_bound(tmp_path: Path) -> None:
    """A batch under way that never ends (its execute held): a queued caller waits its budget, is
    withdrawn from the queue (never run later) and gets code 11; the held call finishes once released."""
    comb = combiner.Combiner()
    s = Setup(tmp_path)
    rng = s.conf.ranges[0]
    reached, release, ran = threading.Event(), threading.Event(), []

    def held(group: list[Op]) -> None:
        reached.set()
        assert release.wait(30)
        for op in group:
            ran.append(op.owner.container_id)
            written(op)

    first = Op("add", rng, owner(1), True)
    t = threading.Thread(target=lambda: comb.run([first], held, wait=60), daemon=True)
    t.start()
    assert reached.wait(30)
    late = Op("add", rng, owner(2), True)
    with pytest.raises(operation.Unanswered) as err:
        comb.run([late], held, wait=0.05)  # the held batch cannot end before the test releases it
    assert err.value.code == Code.TRY_AGAIN_LATER and not err.value.held
    release.set()
    t.join(30)
    assert first.state == operation.WRITTEN and ran == ["c1"]
    assert comb.settle(30) and ran == ["c1"] and late.state == operation.PENDING
