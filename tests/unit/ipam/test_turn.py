"""The write turn of a shared pool (ipam.turn) against an in-memory stand-in of its objects: the JSON Patch
evaluation, a free turn, waiters combined into one round, the turn handed to the oldest waiting intent,
a silent holder taken over (an injected clock), refused and already-applied intents, the limit, a watch
that lost its place, and a holder whose write fails. Every interleaving is forced by the stand-in's hooks,
never left to threads keeping pace. The real API server: tests/kubeapi/test_turn_kube.py."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cni.errors import TryAgainError
from ipam import turn
from ipam.store.base import Conflict, StoreUnavailable
from ipam.turn import Intent, Outcome, State, Writer, evaluate

WAIT = 10.0  # seconds a test waits for a thread it synchronises with


def add(key: str, cid: str) -> list[dict[str, Any]]:
    path, entry = f"/spec/allocations/{key}", {"id": cid, "podref": f"ns/{cid}", "ifname": "net1"}
    return [{"op": "test", "path": path, "value": None}, {"op": "add", "path": path, "value": entry}]


def remove(key: str, cid: str) -> list[dict[str, Any]]:
    path = f"/spec/allocations/{key}"
    return [{"op": "test", "path": f"{path}/id", "value": cid}, {"op": "remove", "path": path}]


class Objects:
    """One pool's turn, its intents and the pool itself in memory, for writers in threads. Versions come
    from one counter as on a server; `changes` is a watch: the turn's states after `since`, blocking until
    one comes (or, with `instant`, returning at once and moving `clock` on by the watch's length)."""

    def __init__(self, pool: dict[str, Any] | None = None) -> None:
        self.cv = threading.Condition()
        self.counter = 10
        self.stored = pool or {"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"allocations": {}}}
        self.history: list[State] = []  # every state of the turn, oldest first
        self.intents_: dict[str, Intent] = {}
        self.now = 0.0
        self.instant = False
        self.takes: list[str] = []
        self.writes = 0
        self.on_write: Callable[[], None] | None = None
        self.on_post: Callable[[Intent], None] | None = None
        self.fail_write: BaseException | None = None
        self.gone_once = False
        self.too_old = 0  # a watch from an older version is Gone (the server keeps no older events)
        self.out_of_reach = 0  # the next this many watches and takes fail: the server out of reach

    def clock(self) -> float:
        return self.now

    def _next(self) -> str:
        self.counter += 1
        return str(self.counter)

    def _set(self, holder: str, last: Outcome | None = None) -> State:
        prev = self.history[-1] if self.history else State("0")
        state = State(self._next(), holder, last if last is not None else prev.last)
        self.history.append(state)
        self.cv.notify_all()
        return state

    # ---- ipam.turn.Objects --------------------------------------------------------------------

    def turn(self) -> State | None:
        with self.cv:
            return self.history[-1] if self.history else None

    def create(self) -> State:
        with self.cv:
            if self.history:
                raise Conflict("exists")
            return self._set("")

    def take(self, seen: State, me: str) -> State | None:
        self._reach()
        with self.cv:
            if self.history[-1].version != seen.version:
                return None
            self.takes.append(me)
            return self._set(me)

    def release(self, held: State, me: str, outcome: Outcome, to: str) -> State | None:
        with self.cv:
            if self.history[-1].holder != me:
                return None
            return self._set(to, outcome)

    def _reach(self) -> None:
        if self.out_of_reach:
            self.out_of_reach -= 1
            raise StoreUnavailable("kubernetes: leases/t: connection refused")

    def changes(self, since: str, seconds: float) -> Iterator[State]:
        self._reach()
        if self.gone_once:
            self.gone_once = False
            raise turn.Gone()
        with self.cv:
            if since and int(since) < self.too_old:
                raise turn.Gone()
            first = []
            if not since:  # from now: the current state first
                first, since = [self.history[-1]], self.history[-1].version
            if self.instant and int(self.history[-1].version) <= int(since):
                self.now += seconds  # the rest of the watch: nothing
                states = first
            else:
                self.cv.wait_for(lambda: int(self.history[-1].version) > int(since), WAIT)
                states = first + [s for s in self.history if int(s.version) > int(since)]
        yield from states

    def post(self, ops: list[dict[str, Any]], me: str) -> Intent:
        with self.cv:
            intent = Intent(f"i-{len(self.intents_)}-{me}", ops, self._next(), 0.0, me)
            self.intents_[intent.name] = intent
            self.cv.notify_all()
        if self.on_post is not None:
            self.on_post(intent)
        return intent

    def delete(self, name: str) -> None:
        with self.cv:
            self.intents_.pop(name, None)
            self.cv.notify_all()

    def intents(self, at_least: str) -> list[Intent]:
        with self.cv:
            return list(self.intents_.values())

    def pool(self, at_least: str) -> dict[str, Any]:
        with self.cv:
            return copy.deepcopy(self.stored)

    def write(self, ops: list[dict[str, Any]], after: dict[str, Any]) -> dict[str, Any]:
        if self.on_write is not None:
            hook, self.on_write = self.on_write, None
            hook()
        with self.cv:
            if self.fail_write is not None:
                raise self.fail_write
            plan, doc = evaluate(self.stored, [Intent("w", ops)])
            if plan.rejected:
                raise Conflict(f"test failed: {plan.rejected}")
            doc["metadata"] = {**doc["metadata"], "resourceVersion": self._next()}
            self.stored = doc
            self.writes += 1
            return copy.deepcopy(doc)

    # ---- for the tests ------------------------------------------------------------------------

    def held_by(self, who: str) -> None:
        with self.cv:
            self._set(who)

    def await_intents(self, n: int) -> None:
        with self.cv:
            assert self.cv.wait_for(lambda: len(self.intents_) >= n, WAIT), f"{n} intents never posted"

    def entries(self) -> dict[str, Any]:
        with self.cv:
            return dict(self.stored["spec"]["allocations"])


class Running:
    """A Writer's write in a thread: its result or error."""

    def __init__(self, writer: Writer, ops: list[dict[str, Any]]) -> None:
        self.result: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(writer, ops), daemon=True)
        self.thread.start()

    def _run(self, writer: Writer, ops: list[dict[str, Any]]) -> None:
        try:
            self.result = writer.write(ops)
        except BaseException as e:
            self.error = e

    def join(self) -> str:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the write did not end"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# ---- evaluate -----------------------------------------------------------------------------------


def test_evaluate_applies_in_order_and_leaves_the_pool_alone() -> None:
    pool = {"metadata": {"resourceVersion": "5"}, "spec": {"allocations": {"1": {"id": "a"}}}}
    before = copy.deepcopy(pool)
    intents = [Intent("x", add("2", "b")), Intent("y", add("2", "c")), Intent("z", remove("1", "a")),
               Intent("w", add("3", "d") + remove("9", "nobody"))]  # fmt: skip
    plan, after = evaluate(pool, intents)
    assert plan.ok == ["x", "z"]
    assert set(plan.rejected) == {"y", "w"}  # 2 taken by x; w half-applicable: undone whole
    assert after["spec"]["allocations"] == {"2": {"id": "b", "podref": "ns/b", "ifname": "net1"}}
    assert pool == before
    assert plan.ops == add("2", "b") + remove("1", "a")


def test_evaluate_finds_what_is_already_there() -> None:
    pool = {"spec": {"allocations": {"2": {"id": "b", "podref": "ns/b", "ifname": "net1"}}}}
    plan, _ = evaluate(pool, [Intent("again", add("2", "b")), Intent("gone", remove("7", "x"))])
    assert plan.applied == ["again", "gone"] and not plan.rejected and not plan.ops


def test_evaluate_refuses_a_change_of_a_missing_parent() -> None:
    plan, _ = evaluate({"metadata": {}}, [Intent("n", [{"op": "add", "path": "/metadata/annotations/a",
                                                         "value": "1"}])])  # fmt: skip
    assert "n" in plan.rejected


# ---- the writer -----------------------------------------------------------------------------------


def test_a_free_turn_is_taken_written_and_released() -> None:
    objs = Objects()
    w = Writer(objs, "n1/1/a", clock=objs.clock)
    version = w.write(add("4", "c4"))
    assert objs.entries()["4"]["id"] == "c4"
    assert version == objs.stored["metadata"]["resourceVersion"]
    state = objs.turn()
    assert state is not None and state.holder == "" and state.last.done == {turn.MINE}
    assert w.rounds == 1 and not w.waited and objs.writes == 1


def test_writers_waiting_on_a_held_turn_share_one_round() -> None:
    objs = Objects()
    objs.held_by("someone")
    runs = [Running(Writer(objs, f"n{i}/1/x", clock=objs.clock), add(str(10 + i), f"c{i}")) for i in range(3)]
    objs.await_intents(3)
    with objs.cv:  # the holder lets go without a round: the three take it and one of them writes all
        objs._set("")
    versions = {r.join() for r in runs}
    assert objs.writes == 1 and len(versions) == 1
    assert {k: v["id"] for k, v in objs.entries().items()} == {"10": "c0", "11": "c1", "12": "c2"}
    assert not objs.intents_, "every writer deleted its intent"


def test_the_turn_is_handed_to_the_oldest_intent_posted_during_a_round() -> None:
    objs = Objects()
    late: list[Running] = []

    def during_write() -> None:  # the holder's pool write is in flight: a second writer comes
        late.append(Running(Writer(objs, "n2/1/b", clock=objs.clock), add("21", "c21")))
        objs.await_intents(1)

    objs.on_write = during_write
    first = Writer(objs, "n1/1/a", clock=objs.clock)
    first.write(add("20", "c20"))
    handed = [s for s in objs.history if s.holder == "n2/1/b"]
    assert handed and handed[0].last.done == {turn.MINE}, "released to the waiting writer"
    late[0].join()
    assert objs.takes == ["n1/1/a"], "the second writer held its round without taking the turn"
    assert objs.writes == 2 and set(objs.entries()) == {"20", "21"}
    assert objs.turn().holder == ""  # type: ignore[union-attr]


def test_a_silent_holder_is_taken_over_after_the_turn_seconds() -> None:
    objs = Objects()
    objs.held_by("dead/1/z")
    objs.instant = True  # the watch sees nothing: each one lasts its seconds on the injected clock
    w = Writer(objs, "n1/1/a", clock=objs.clock, turn_seconds=5.0)
    w.write(add("3", "c3"))
    assert objs.takes == ["n1/1/a"] and w.rounds == 1
    assert 5.0 <= objs.now <= 10.0, "taken over within two watch lengths of silence"
    assert objs.entries()["3"]["id"] == "c3"


def test_a_refused_intent_is_a_conflict_and_its_entry_is_untouched() -> None:
    pool = {"metadata": {"resourceVersion": "1"}, "spec": {"allocations": {"5": {"id": "other"}}}}
    objs = Objects(pool)
    with pytest.raises(Conflict, match="refused"):
        Writer(objs, "n1/1/a", clock=objs.clock).write(add("5", "mine"))
    assert objs.entries() == {"5": {"id": "other"}} and objs.writes == 0
    assert objs.turn().holder == ""  # type: ignore[union-attr]


def test_a_waiter_whose_watch_lost_its_place_finds_its_write_in_the_pool() -> None:
    objs = Objects()
    objs.held_by("someone")
    objs.gone_once = True

    def apply_meanwhile(intent: Intent) -> None:  # a round the waiter will never see wrote it
        with objs.cv:
            objs.stored["spec"]["allocations"]["8"] = intent.ops[1]["value"]

    objs.on_post = apply_meanwhile
    Writer(objs, "n1/1/a", clock=objs.clock).write(add("8", "c8"))
    assert objs.writes == 0 and not objs.intents_


def test_a_write_that_waits_past_the_limit_is_code_11_and_withdrawn() -> None:
    objs = Objects()
    objs.held_by("busy/1/z")
    objs.instant = True
    stays: list[str] = []

    def busy_take(seen: State, me: str) -> State | None:  # the holder keeps renewing: never silent
        with objs.cv:
            stays.append(me)
            objs._set("busy/1/z")
        return None

    objs.take = busy_take  # type: ignore[method-assign]
    w = Writer(objs, "n1/1/a", limit=30.0, clock=objs.clock, turn_seconds=5.0)
    with pytest.raises(TryAgainError, match="not written within 30s"):
        w.write(add("1", "c1"))
    assert not objs.intents_ and objs.writes == 0 and stays


def test_a_holder_whose_write_fails_releases_the_turn() -> None:
    objs = Objects()
    objs.fail_write = StoreUnavailable("kubernetes: no answer")
    with pytest.raises(StoreUnavailable):
        Writer(objs, "n1/1/a", clock=objs.clock).write(add("1", "c1"))
    state = objs.turn()
    assert state is not None and state.holder == "" and not state.last.done


def test_an_intent_is_evaluated_once_even_when_its_writer_never_deletes_it() -> None:
    """An ADD's intent refused (its address was taken then) whose writer died without deleting it: as
    long as it exists, no later round evaluates it again (the outcomes carry it in `handled`), so it is
    not applied after the address is freed (an entry of a dead call, after its attachment's DEL)."""
    pool = {"metadata": {"resourceVersion": "1"}, "spec": {"allocations": {"5": {"id": "other"}}}}
    objs = Objects(pool)
    objs.held_by("someone")
    dead = objs.post(add("5", "dead"), "dead/1/x")  # posted while the turn is held; its writer dies
    with objs.cv:
        objs._set("")
    for i in range(4):  # four more rounds; between the first two, .5 is freed
        Writer(objs, f"n{i}/1/a", clock=objs.clock).write(add(str(10 + i), f"c{i}"))
        if i == 0:
            assert objs.turn().last.rejected.keys() == {dead.name}  # type: ignore[union-attr]
            with objs.cv:
                del objs.stored["spec"]["allocations"]["5"]
        else:
            assert dead.name in objs.turn().last.handled  # type: ignore[union-attr]
    assert "5" not in objs.entries() and dead.name in objs.intents_


def test_a_silent_holder_is_taken_over_when_the_server_keeps_no_events_as_old_as_the_turn() -> None:
    """The turn unchanged for longer than the server keeps events (its restart, a long quiet): a watch
    from its version is Gone. The waiter watches from now (the turn as it is first), without taking that
    for the holder moving, and takes the silent turn over."""
    objs = Objects()
    objs.held_by("dead/1/z")
    objs.instant = True
    objs.too_old = int(objs.history[-1].version) + 1  # every version so far is too old to watch from
    w = Writer(objs, "n1/1/a", clock=objs.clock, turn_seconds=5.0)
    w.write(add("3", "c3"))
    assert objs.takes == ["n1/1/a"] and objs.entries()["3"]["id"] == "c3"
    assert 5.0 <= objs.now <= 15.0


def test_a_waiter_whose_server_is_out_of_reach_keeps_its_intent_until_a_round_writes_it() -> None:
    """The server restarted while an intent waits: the intent may still be written by a round, so its
    writer keeps it and waits (an ADD that answered code 11 here and was retried would hold two entries:
    the retry's and, later, this intent's). Once the server answers again (here: the holder silent, so
    the waiter takes the turn over), the intent is written once and deleted by its writer."""
    objs = Objects()
    objs.held_by("dead/1/x")
    objs.instant, objs.out_of_reach = True, 3
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        objs.now += seconds

    w = Writer(objs, "n1/1/a", limit=30.0, clock=objs.clock, turn_seconds=5.0, sleep=pause)
    version = w.write(add("1", "c1"))
    assert version == objs.stored["metadata"]["resourceVersion"]
    assert objs.entries() == {"1": {"id": "c1", "podref": "ns/c1", "ifname": "net1"}} and objs.writes == 1
    assert pauses == [turn.OUT_OF_REACH_PAUSE] * 3 and objs.takes == ["n1/1/a"] and not objs.intents_


def test_a_waiter_whose_server_stays_out_of_reach_gives_up_at_its_limit() -> None:
    objs = Objects()
    objs.held_by("dead/1/x")
    objs.out_of_reach = 10**6

    def pause(seconds: float) -> None:
        objs.now += seconds

    w = Writer(objs, "n1/1/a", limit=10.0, clock=objs.clock, turn_seconds=5.0, sleep=pause)
    with pytest.raises(TryAgainError, match="not written within 10s"):
        w.write(add("1", "c1"))
    assert objs.writes == 0 and not objs.intents_
