"""ipam.nodequeue without a store: requests and outcomes round-trip through the queue directory, a dead
caller's request is dropped, a withdrawn one is never taken, and the files are private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cni.errors import CniError, Code
from ipam import nodequeue
from ipam.batch import DECIDED, FAILED, WRITTEN, Op
from ipam.config import from_dict
from ipam.model import Allocation

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
B = Allocation("b" * 64, "ns/b", "net1", "uid-b", "blue", "node-1")


def ranges() -> list[Op]:
    conf = from_dict({"datastore": "local", "ipRanges": [
        {"range": "198.51.100.0/24", "range_start": "198.51.100.10", "exclude": ["198.51.100.32/28"]},
        {"range": "2001:db8::/120"}]})  # fmt: skip
    return [Op("add", conf.ranges[0], A, True, want=11), Op("del", conf.ranges[1], A, False)]


def test_a_request_round_trips_and_its_outcome_comes_back(tmp_path: Path) -> None:
    lock = str(tmp_path / "x.lock")
    theirs = nodequeue.publish(lock, ranges())
    mine = nodequeue.publish(lock, [Op("add", ranges()[0].rng, B, True)])
    assert theirs is not None and mine is not None
    taken = nodequeue.take(mine, 128)
    assert [(op.kind, op.rng, op.owner, op.overlapping, op.want) for op in taken.ops] == [
        (op.kind, op.rng, op.owner, op.overlapping, op.want) for op in theirs.ops
    ]
    assert [op.want for op in taken.ops] == [11, None]  # a requested address (ipam.requested) travels
    add, rel = taken.ops
    created, mine_ = {"198.51.100.11": "7"}, {"198.51.100.11": 11}
    add.offsets, add.claims.created, add.claims.mine = [11], dict(created), dict(mine_)
    add.to(DECIDED)
    add.to(WRITTEN)
    rel.freed, rel.known = [(5, A)], {"2001:db8::5": "9"}
    rel.to(FAILED, CniError("pool full", "details", code=Code.POOL_EXHAUSTED))
    assert not theirs.answered()
    taken.answer()
    assert theirs.answered()
    a, r = theirs.ops
    assert (a.offsets, a.claims.created, a.claims.mine, a.error) == ([11], created, mine_, None)
    assert (r.freed, r.known) == ([(5, A)], {"2001:db8::5": "9"})
    assert isinstance(r.error, CniError) and r.error.code == Code.POOL_EXHAUSTED
    assert r.error.msg == "pool full"
    assert nodequeue.take(mine, 128).ops == []  # answered: no one takes it again
    for path in tmp_path.joinpath("x.lock.q").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(tmp_path.joinpath("x.lock.q").stat().st_mode) == 0o700
    theirs.close()
    mine.close()
    assert list(tmp_path.joinpath("x.lock.q").iterdir()) == []


def test_a_dead_callers_request_is_dropped_and_a_withdrawn_one_is_not_taken(tmp_path: Path) -> None:
    lock = str(tmp_path / "x.lock")
    dead = nodequeue.publish(lock, ranges()[:1])
    gone = nodequeue.publish(lock, ranges()[:1])
    mine = nodequeue.publish(lock, ranges()[:1])
    assert dead is not None and gone is not None and mine is not None
    os.close(dead.fd)  # the process died: the kernel dropped its flock, the file stays
    gone.close()
    assert nodequeue.take(mine, 128).ops == []
    assert not os.path.exists(dead.path)
    mine.close()


def test_room_bounds_what_is_taken(tmp_path: Path) -> None:
    lock = str(tmp_path / "x.lock")
    others = [nodequeue.publish(lock, ranges()) for _ in range(3)]
    mine = nodequeue.publish(lock, ranges()[:1])
    assert mine is not None
    assert len(nodequeue.take(mine, 5).ops) == 4  # whole requests only
    assert nodequeue.take(mine, 0).ops == []
    for t in [*others, mine]:
        assert t is not None
        t.close()


def test_an_unusable_directory_means_running_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert nodequeue.publish(str(blocker / "x.lock"), ranges()) is None
    assert nodequeue.take(None, 128).ops == []


def test_a_retry_after_a_failed_write_takes_the_same_operations_with_their_reservations(
    tmp_path: Path,
) -> None:
    """A holder whose write failed takes the same requests again on its retry: the reservations its
    failed attempt made for them stay theirs (the outcome hands them over), decided afresh."""
    lock = str(tmp_path / "x.lock")
    theirs = nodequeue.publish(lock, ranges()[:1])
    mine = nodequeue.publish(lock, [Op("add", ranges()[0].rng, B, True)])
    assert theirs is not None and mine is not None
    [first] = nodequeue.take(mine, 128).ops
    first.claims.created["198.51.100.10"], first.claims.mine["198.51.100.10"] = "7", 10
    first.to(FAILED, CniError("exhausted on a stale view", code=Code.POOL_EXHAUSTED))
    again = nodequeue.take(mine, 128)  # the write failed: nothing was answered
    assert again.ops == [first] and again.ops[0] is first
    assert (first.done, first.error, first.claims.mine) == (False, None, {"198.51.100.10": 10})
    first.offsets = [10]
    first.to(DECIDED)
    first.to(WRITTEN)
    again.answer()
    assert theirs.answered() and theirs.ops[0].claims.created == {"198.51.100.10": "7"}
    theirs.close()
    mine.close()


def test_a_failed_holder_hands_the_reservations_it_made_back_to_their_calls(tmp_path: Path) -> None:
    """The holder's write failed: the calls it took get the reservations made for them (undone, so each
    decides for itself preferring them, and drops what it does not keep); no holder takes them again."""
    lock = str(tmp_path / "x.lock")
    theirs = nodequeue.publish(lock, ranges()[:1])
    quiet = nodequeue.publish(lock, ranges()[:1])
    mine = nodequeue.publish(lock, [Op("add", ranges()[0].rng, B, True)])
    assert theirs is not None and quiet is not None and mine is not None
    taken = nodequeue.take(mine, 128)
    [first] = dict(taken.calls)[theirs.path]  # (requests are taken in file-name order: a random part)
    first.claims.created["198.51.100.10"], first.claims.mine["198.51.100.10"] = "7", 10
    first.claims.lost, first.offsets = 2, [10]
    nodequeue.hand_back(taken)
    assert not theirs.answered()
    [op] = theirs.ops
    assert (op.done, op.offsets, op.claims.created, op.claims.mine) == (
        False, [], {"198.51.100.10": "7"}, {"198.51.100.10": 10})  # fmt: skip
    assert not theirs.answered() and op.claims.lost == 0  # read twice: nothing counted twice
    assert [path for path, _ in nodequeue.take(mine, 128).calls] == [quiet.path]  # nothing made for it
    for t in (theirs, quiet, mine):
        t.close()
