"""The agent's opt-in `answer_before_write` (ipam.batch): a call is answered once its ops are decided (an
ADD's address reserved), before its pool write, which its batch makes after; a write lost to another
writer keeps the answered address; one that can no longer have it is logged as an error and its
reservation stays. Without the agent (a plugin process) the option changes nothing. A pool write is held
at a gate the test opens (tests/unit/ipam/test_agent_batches.py), so nothing here depends on how fast the
threads run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni.errors import ConfigError
from ipam import combiner, plugin
from ipam.config import from_dict
from ipam.engine import Engine
from tests.unit.ipam.test_agent_batches import POOL, RANGE, Setup, _foreign, _start, owner


class Early(Setup):
    def __init__(self, tmp: Path, before_commit: Any = None) -> None:
        super().__init__(tmp, before_commit)
        self.conf = from_dict({**_conf(tmp), "answer_before_write": True})


def _conf(tmp: Path) -> dict[str, Any]:
    return {"range": RANGE, "datastore": "kubernetes", "local_db": str(tmp / "ipam.db"),
            "kubernetes": {"kubeconfig": "/nonexistent"}}  # fmt: skip


def test_an_add_and_a_del_are_answered_before_their_pool_write_which_follows(
    agent: None, tmp_path: Path
) -> None:
    s = Early(tmp_path)
    got: list[Any] = []
    t = _start(lambda: s.engine().add(owner(1))[0][1], got)
    t.join(30)  # returns with its write not made (the gate is closed)
    assert not t.is_alive() and got == [1] and POOL not in s.backend.pools
    # the answered address is reserved, and the write follows
    assert {r.name: r.owner.container_id for r in s.backend.reservations.values()} == {"198.51.100.1": "c1"}
    assert s.arrived.wait(30) and POOL not in s.backend.pools
    s.gate.set()
    assert combiner.settle_all(30)
    assert s.backend.pools[POOL].allocations["1"].container_id == "c1"

    s.gate.clear()
    s.arrived.clear()
    done: list[Any] = []
    t = _start(lambda: s.engine().delete(owner(1)), done)
    t.join(30)
    assert not t.is_alive() and done == [None]
    assert s.arrived.wait(30)
    assert s.backend.pools[POOL].allocations["1"].container_id == "c1"  # not written yet
    s.gate.set()
    assert combiner.settle_all(30)
    assert s.backend.pools[POOL].allocations == {} and s.backend.reservations == {}


class Counted(Early):
    """Counts reservation requests (POSTs and the refused ones)."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.posts: list[str] = []

    def store(self) -> Any:
        st = super().store()
        put = st.put_reservation

        def counted(res: Any) -> str:
            self.posts.append(res.name)
            return put(res)

        st.put_reservation = counted  # type: ignore[method-assign]
        return st


def test_calls_during_a_held_write_are_answered_without_waiting_for_it_and_share_the_next_write(
    agent: None, tmp_path: Path
) -> None:
    """The first call's write is held at the gate; the calls after it are decided on the pool plus the
    answered ops not yet written: each gets its own address at its first claim (no race lost to the
    first), returns before any write is made, and the n of them share the next write."""
    s = Counted(tmp_path)
    first: list[Any] = []
    _start(lambda: s.engine().add(owner(0))[0][1], first).join(30)
    assert first == [1] and s.arrived.wait(30)  # its write is at the gate
    n = 4
    rest: list[Any] = []
    for i in range(1, n + 1):
        _start(lambda i=i: s.engine().add(owner(i))[0][1], rest).join(30)  # type: ignore[misc]
    assert sorted(rest) == [2, 3, 4, 5] and s.writes == []  # answered, nothing written yet
    assert s.posts == [f"198.51.100.{i}" for i in range(1, n + 2)]  # one claim each, none refused
    # a DEL of an answered ADD not yet written: answered too, written after it
    gone: list[Any] = []
    _start(lambda: s.engine().delete(owner(n)), gone).join(30)
    assert gone == [None]
    s.gate.set()
    assert combiner.settle_all(30)
    assert [len(w.put) for w in s.writes] == [1, n - 1]  # the next write: the ADDs but the deleted one
    pool = s.backend.pools[POOL].allocations
    assert {k: a.container_id for k, a in pool.items()} == {str(i + 1): f"c{i}" for i in range(n)}
    reserved = sorted(r.owner.container_id for r in s.backend.reservations.values())
    assert reserved == [f"c{i}" for i in range(n)]


def test_a_write_lost_after_the_answer_keeps_the_answered_address(agent: None, tmp_path: Path) -> None:
    s = Early(tmp_path, before_commit=_foreign(2))  # another writer takes .2 and the first write fails
    s.gate.set()
    got = s.engine().add(owner(7))[0][1]
    assert combiner.settle_all(30)
    pool = s.backend.pools[POOL].allocations
    assert got == 1 and pool["1"].container_id == "c7" and pool["2"].container_id == "foreign"


def test_an_answered_add_that_cannot_be_written_is_logged_and_keeps_its_reservation(
    agent: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Another writer put an entry at the answered address without its reservation (a pool edited by
    hand): the batch cannot write it, the caller has gone; the error is logged and the reservation
    stays."""
    s = Early(tmp_path, before_commit=_foreign(1))
    s.gate.set()
    got = s.engine().add(owner(7))[0][1]
    assert combiner.settle_all(30)
    assert got == 1 and s.backend.pools[POOL].allocations["1"].container_id == "foreign"
    assert [r.owner.container_id for r in s.backend.reservations.values()] == ["c7"]
    err = capfd.readouterr().err
    assert "ADD c7 198.51.100.1: answered before its pool write, which then failed" in err


def test_without_the_agent_the_option_changes_nothing(tmp_path: Path) -> None:
    s = Early(tmp_path)
    got: list[Any] = []
    t = _start(lambda: Engine(s.store(), s.conf, execute=plugin.EXECUTE).add(owner(1))[0][1], got)
    assert s.arrived.wait(30)
    assert got == []  # a plugin process answers after its write
    s.gate.set()
    t.join(30)
    assert got == [1] and s.backend.pools[POOL].allocations["1"].container_id == "c1"


def test_the_option_needs_overlapping_ranges(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ipam\.answer_before_write: needs enable_overlapping_ranges"):
        from_dict({**_conf(tmp_path), "answer_before_write": True, "enable_overlapping_ranges": False})
    with pytest.raises(ConfigError, match=r"answer_before_write"):
        from_dict({**_conf(tmp_path), "answer_before_write": "yes"})

