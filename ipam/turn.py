"""The write turn of a shared pool: at most one whole-pool write in flight per pool across the cluster, and
the writers that wait meanwhile combined into that holder's next write (docs/ipam.md "Shared pools").

Why: the API server applies every write of an `IPPool` to the whole object (decode, patch, schema
validation, encode: about 0.1 ms of its CPU per entry, whatever the patch holds) and redoes a write whose
object changed meanwhile. N nodes writing one pool at once each pay for the writes that beat them: the
server's work per attachment grows with N. With a turn, one write is in flight and it carries every
waiting writer's entries, so the writes per attachment fall as the writers grow.

Objects (ipam.store.kubeturn keeps them as `Lease`s in the store's namespace):
- the pool's turn: its holder ("" when free) and the last round's outcome: the pool version it wrote,
  the intents it wrote (`done`) and those it refused (`rejected`, with why);
- an intent per waiting writer: the JSON Patch operations it wants applied to the pool, each guarded as
  the Kubernetes store guards them (ipam.store.kube patch_ops). Each writer posts its own object, so
  waiting writers never write one object together (a small object that N writers patch at once costs the
  server as much per write as N, too).

A writer with operations `ops` (`Writer.write`):
1. takes the turn if it is free, or its holder has not moved for TURN_SECONDS by this writer's own
   clock (a holder that died or stalled: taken over, compare-and-swap on the turn's version): it holds
   the turn and runs a round with its own operations in hand;
2. otherwise posts its intent and watches the turn: its intent in a round's `done`: written; in
   `rejected`: Conflict (the caller decides again on a fresh pool); the turn free: 1.
A round (`Writer.round`): list the pool's intents (at least as new as the take), write them and the
holder's own as ONE JSON Patch, unread (every operation is guarded); a write refused (a test failed) or
unanswered (it may have been applied) reads the pool and evaluates every intent on it in turn
(`evaluate`: tests that fail reject it, unless it is already applied: done) and writes the rest again.
Then it lists again and releases the turn, with the round's outcome, to the writer of the oldest intent
still waiting (else free). An intent is evaluated once: the outcome carries the handled intents that
still exist (`Outcome.handled`).

Correctness never rests on the turn: every operation keeps its own guard, so a holder taken over while
still writing, or a writer outside the turn (upstream whereabouts, the reconciler) can only make a
write fail its tests, never hand an address out twice. The turn only keeps writes from piling up."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence, Set

from cni import faults, log
from cni.errors import TryAgainError
from cni.types.valueclass import field, valueclass
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any, Protocol

    type Ops = list[dict[str, Any]]

    class Objects(Protocol):
        """The turn's objects in a store (ipam.store.kubeturn.KubeTurn; tests: an in-memory one)."""

        def turn(self) -> State | None: ...
        def create(self) -> State: ...
        def take(self, seen: State, me: str) -> State | None: ...
        def release(self, held: State, me: str, outcome: Outcome, to: str) -> State | None: ...
        def changes(self, since: str, seconds: float) -> Iterator[State]:
            """The turn's states after version `since` (""): from now, the current state first) for
            `seconds` at most; Gone when `since` is older than the server keeps."""
            ...
        def post(self, ops: Ops, me: str) -> Intent: ...
        def delete(self, name: str) -> None: ...
        def intents(self, at_least: str) -> list[Intent]: ...
        def pool(self, at_least: str) -> dict[str, Any]: ...
        def write(self, ops: Ops, after: dict[str, Any] | None) -> dict[str, Any]: ...
else:
    Protocol = object

TURN_SECONDS = 5.0  # a holder whose turn did not move this long (by a waiter's own clock) is taken over
STALE_SECONDS = 10.0  # an intent this old that a round handled: its writer is gone (a live one deletes
# its own at once); deleting a live writer's intent is harmless (its verdict is in the same round)
MINE = ""  # the holder's own operations in a round's plan (not posted as an intent)
OUT_OF_REACH_PAUSE = 0.5  # a waiter whose server is out of reach looks again after this long


class Gone(Exception):
    """The watch's starting version is older than the server keeps (410): look at the turn again."""


@valueclass
class Outcome:
    """What a round did: its number, the pool version after its write, the intents it wrote or found
    applied (`done`) and those it refused (`rejected`: name -> why), and the intents an earlier round
    handled that still existed when this one listed them (`handled`): no round evaluates an intent
    twice (an ADD whose writer died, applied after its attachment's DEL, would leave an entry)."""

    n: int = 0
    pool: str = ""
    done: frozenset[str] = frozenset()
    rejected: dict[str, str] = field(default_factory=dict)
    handled: frozenset[str] = frozenset()

    def verdicts(self) -> frozenset[str]:
        """Every intent this round or an earlier one handled, as far as this outcome knows."""
        return self.done | self.rejected.keys() | self.handled


@valueclass
class State:
    """The turn as read or watched: its object version, its holder ("" when free), the last round."""

    version: str
    holder: str = ""
    last: Outcome = field(default_factory=Outcome)


@valueclass
class Intent:
    name: str
    ops: list[dict[str, Any]]
    version: str = ""  # the object's version when posted
    age: float = 0.0  # seconds since it was created (as the holder judges it: 0 when unknown)
    writer: str = ""  # its writer's identity: the turn is handed to it


@valueclass
class Plan:
    """`evaluate`'s answer: the operations to write (the intents that apply, in order), the intents that
    apply (`ok`), those already applied (`applied`), those refused (`rejected`: name -> why)."""

    ops: list[dict[str, Any]]
    ok: list[str]
    applied: list[str]
    rejected: dict[str, str]


# ---- evaluating intents on a pool object (pure) ------------------------------------------------------


class _Refused(Exception):
    pass


_MISSING = object()


class _Doc:
    """A pool object under evaluation: the dicts on a written path are copied on first write (the caller's
    object is never changed), and every change is logged so that an intent refused half-way is undone."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.root = dict(obj)
        self._own: set[int] = {id(self.root)}
        self.log: list[tuple[dict[str, Any], str, Any]] = []

    def get(self, path: str) -> Any:
        node: Any = self.root
        for p in _parts(path):
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                return None
        return node

    def _parent(self, parts: list[str]) -> dict[str, Any] | None:
        node = self.root
        for p in parts[:-1]:
            child = node.get(p)
            if not isinstance(child, dict):
                return None
            if id(child) not in self._own:
                child = dict(child)
                self._own.add(id(child))
                node[p] = child  # (not logged: the copy equals the original until changed)
            node = child
        return node

    def apply(self, op: dict[str, Any]) -> None:
        """One JSON Patch (RFC 6902) operation on objects, as the API server applies it: `test` with a
        null value passes when the member is absent; `add` sets a member (replacing one); `replace` and
        `remove` need it present."""
        kind, path = op.get("op"), str(op.get("path", ""))
        if kind == "test":
            if self.get(path) != op.get("value"):
                raise _Refused(f"test {path} failed")
            return
        parts = _parts(path)
        parent = self._parent(parts)
        if parent is None:
            raise _Refused(f"{kind} {path}: no parent")
        key = parts[-1]
        if kind in ("replace", "remove") and key not in parent:
            raise _Refused(f"{kind} {path}: absent")
        if kind not in ("add", "replace", "remove"):
            raise _Refused(f"operation {kind!r}")
        self.log.append((parent, key, parent.get(key, _MISSING)))
        if kind == "remove":
            del parent[key]
        else:
            parent[key] = copy.deepcopy(op.get("value"))

    def undo(self, mark: int) -> None:
        """Every change since the log was `mark` long, undone."""
        while len(self.log) > mark:
            parent, key, old = self.log.pop()
            if old is _MISSING:
                parent.pop(key, None)
            else:
                parent[key] = old


def _parts(path: str) -> list[str]:
    if not path.startswith("/"):
        raise _Refused(f"path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _applied(doc: _Doc, ops: Ops) -> bool:
    """Whether the changes of `ops` are already in `doc` (a write of them that was applied, or the same
    decision written by someone else): every member they add is there with that value (an object: with
    at least those members), every member they remove is absent."""
    for op in ops:
        kind, path = op.get("op"), str(op.get("path", ""))
        if kind == "test":
            continue
        try:
            have = doc.get(path)
        except _Refused:
            return False
        if kind == "remove":
            if have is not None:
                return False
            continue
        want = op.get("value")
        if isinstance(want, dict) and isinstance(have, dict):
            if any(have.get(k) != v for k, v in want.items()):
                return False
        elif have != want:
            return False
    return True


def applied(pool: dict[str, Any], ops: Ops) -> bool:
    """Whether the changes of `ops` are in `pool` already (`_applied`)."""
    return _applied(_Doc(pool), ops)


def evaluate(pool: dict[str, Any], intents: Sequence[Intent]) -> tuple[Plan, dict[str, Any]]:
    """Each intent's operations tried in turn on `pool` plus the intents before it that apply: those whose
    tests pass apply, those whose changes are already there are `applied`, the rest `rejected`. Returns the
    plan and the pool as the plan's write would leave it. `pool` itself is not changed."""
    doc = _Doc(pool)
    plan = Plan([], [], [], {})
    for intent in intents:
        mark = len(doc.log)
        try:
            for op in intent.ops:
                doc.apply(op)
        except _Refused as e:
            doc.undo(mark)
            if _applied(doc, intent.ops):
                plan.applied.append(intent.name)
            else:
                plan.rejected[intent.name] = str(e)
            continue
        plan.ok.append(intent.name)
        plan.ops.extend(intent.ops)
    return plan, doc.root


# ---- the writer ------------------------------------------------------------------------------------


class Writer:
    """One writer's use of a pool's turn (module docstring). `me`: this writer's identity (node, process,
    a random part); `clock`: monotonic seconds (tests inject one); `limit`: how long a write may wait in
    all before TryAgainError (the retry policy's limit)."""

    def __init__(
        self, objects: Objects, me: str, limit: float = 120.0, clock: Callable[[], float] = time.monotonic,
        turn_seconds: float = TURN_SECONDS, sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        self.o, self.me, self.limit, self.clock, self.sleep = objects, me, limit, clock, sleep
        self.turn_seconds = turn_seconds
        self.rounds = 0  # rounds this writer held (counted for tests and metrics)
        self.waited = False  # the last write waited for another holder (the pool is contended)

    def write(self, ops: Ops) -> str:
        """Have `ops` written into the pool; the pool's version after the write that applied them.
        Conflict when a round refused them (a test failed: decide again on a fresh pool); TryAgainError
        when nothing came of it within the limit (the intent withdrawn first)."""
        return self.start(ops).wait()

    def start(self, ops: Ops) -> Ticket:
        """Begin `write`: the turn taken and a round held at once when it is free (the ticket is done),
        else the intent posted (the ticket's `wait` waits for a round: call it outside any lock)."""
        begun = self.clock()
        self.waited = False
        state = self.o.turn() or self._create()
        if not state.holder:
            held = self.o.take(state, self.me)
            if held is not None:
                version = _verdict(self.round(held, ops), MINE)
                if version is None:  # (a round writes or refuses its holder's own operations)
                    raise Conflict("turn: the holder's own operations were not handled")
                return Ticket(self, None, state, begun, version)
        intent = self.o.post(ops, self.me)  # held (or taken just now): wait for a round
        self.waited = True
        return Ticket(self, intent, state, begun)

    def _create(self) -> State:
        try:
            return self.o.create()
        except Conflict:  # made by another writer meanwhile
            state = self.o.turn()
            if state is None:
                raise Conflict("turn: created and deleted at once") from None
            return state

    def await_round(self, intent: Intent, state: State, start: float) -> str:
        """Watch the turn (from `state`, read before `intent` was posted) until a round names `intent`;
        hold a round when the turn is handed to this writer, is free, or its holder is silent."""
        since, seen_at = state.version, self.clock()
        while True:
            got = _verdict(state.last, intent.name)
            if got is not None:
                return got
            now = self.clock()
            if now - start > self.limit:
                raise TryAgainError(f"turn: not written within {self.limit:g}s (holder {state.holder!r})")
            try:
                held: State | None = None
                if state.holder == self.me:  # handed over by the last holder
                    held = state
                elif not state.holder or now - seen_at >= self.turn_seconds:  # free, or its holder silent
                    held = self.o.take(state, self.me)
                    if held is not None and state.holder:
                        log.info("turn: took over from %s (silent for %gs)", state.holder, self.turn_seconds)
                    seen_at = self.clock()  # lost the race: its winner's change is coming
                if held is not None:
                    got = _verdict(self.round(held, None), intent.name)
                    if got is None:  # (a round lists every intent posted before its take)
                        raise Conflict(f"turn: intent {intent.name} not in its own writer's round")
                    return got
                for new in self.o.changes(since, self.turn_seconds):
                    if new.version != state.version:  # the turn moved (not just seen again)
                        seen_at = self.clock()
                    state, since = new, new.version
                    if intent.name in new.last.done or intent.name in new.last.rejected:
                        break
                    if not new.holder or new.holder == self.me:
                        break
            except Gone:  # older than the server keeps (a restart, a turn long unchanged): from now on,
                since = ""  # the turn as it is first; and a round missed meanwhile may have written it
                pool = self.o.pool("")
                if applied(pool, intent.ops):
                    return str((pool.get("metadata") or {}).get("resourceVersion") or state.last.pool)
            except StoreUnavailable as e:  # the server out of reach (restarted, its network cut): the
                # intent stays and may still be written by a round, so the call may not end (an ADD
                # that failed here and was retried would hold two entries): wait, within the limit
                log.debug("turn: waiting for the server (%s)", e)
                self.sleep(OUT_OF_REACH_PAUSE)

    def round(self, held: State, mine: Ops | None) -> Outcome:
        """The holder's round (module docstring): `mine` and every intent of the pool not yet handled,
        written in one write; the turn released with the outcome, to the writer of the oldest intent
        still waiting (else free). Failures to write within the limit release the turn and raise."""
        self.rounds += 1
        last = held.last.verdicts()  # their writers have their verdict: never evaluated again
        listed = self.o.intents(held.version)
        intents = [i for i in listed if i.name not in last]
        leftover = [i for i in listed if i.name in last and i.age > STALE_SECONDS]  # their writers are gone
        batch = ([Intent(MINE, mine)] if mine is not None else []) + intents
        got = _Round(held.last.pool)
        try:
            self._write_all(batch, held, got)
        finally:
            kept = frozenset(i.name for i in listed if i.name in last)  # handled before, not deleted yet
            outcome = Outcome(held.last.n + 1, got.version, frozenset(got.done), got.rejected, kept)
            self._release(held, outcome, last, got.wrote)
        handled = outcome.done | outcome.rejected.keys()
        self._sweep(leftover + [i for i in intents if i.age > STALE_SECONDS and i.name in handled])
        return outcome

    def _write_all(self, batch: list[Intent], held: State, got: _Round) -> None:
        """`batch` in one pool write: at first unread (every operation is guarded); a refused or
        unanswered write evaluated on the pool read (`evaluate`) and written again without what does not
        apply. What happened goes into `got`."""
        pool: dict[str, Any] | None = None
        start = self.clock()
        while True:
            if pool is None:
                plan, after = Plan([op for i in batch for op in i.ops], [i.name for i in batch], [], {}), None
            else:
                plan, after = evaluate(pool, batch)
            got.done += plan.applied
            got.rejected.update(plan.rejected)
            batch = [i for i in batch if i.name in plan.ok]
            if not batch:
                meta = (pool or {}).get("metadata") or {}
                got.version, got.wrote = str(meta.get("resourceVersion") or got.version), True
                return
            faults.point("turn-round")  # tests: the turn held, the pool not yet written
            try:
                written = self.o.write(plan.ops, after)
            except (Conflict, StoreBusy) as e:  # a test failed (which?), or maybe applied: read
                if self.clock() - start > self.limit:
                    raise TryAgainError(f"turn: the pool write kept failing: {e}") from None
                pool = self.o.pool("" if pool is not None else held.last.pool)
                continue
            got.done += plan.ok
            got.version = str((written.get("metadata") or {}).get("resourceVersion") or "")
            got.wrote = True
            return

    def _release(self, held: State, outcome: Outcome, last: Set[str], wrote: bool) -> None:
        """The turn released with `outcome`: to the writer of the oldest intent not handled yet (posted
        during the round: one more list), else free."""
        handled = outcome.verdicts() | last
        waiting: list[Intent] = []
        if wrote:
            try:
                waiting = [i for i in self.o.intents(held.version) if i.name not in handled]
            except (StoreUnavailable, Conflict):
                waiting = []
        to = min(waiting, key=_order).writer if waiting else ""
        if self.o.release(held, self.me, outcome, to) is None:
            log.info("turn: taken over meanwhile (this round's outcome unpublished)")

    def _sweep(self, stale: list[Intent]) -> None:
        """Intents of writers that are gone: handled by a round STALE_SECONDS ago or more (a live writer
        deletes its own as soon as it learns its verdict)."""
        for intent in stale:
            try:
                self.o.delete(intent.name)
            except (StoreUnavailable, Conflict):
                return


class Ticket:
    """A write begun by `Writer.start`: done (`version`), or an intent waiting for a round."""

    def __init__(
        self, writer: Writer, intent: Intent | None, state: State, begun: float, version: str | None = None
    ) -> None:  # fmt: skip
        self.writer, self.intent, self.state, self.begun, self.version = writer, intent, state, begun, version

    def wait(self) -> str:
        """The pool's version after the write that applied the operations (module docstring); the
        intent deleted, whatever the outcome."""
        if self.intent is None:
            assert self.version is not None
            return self.version
        w = self.writer
        try:
            return w.await_round(self.intent, self.state, self.begun)
        finally:
            try:
                w.o.delete(self.intent.name)
            except (StoreUnavailable, Conflict) as e:  # a later round's holder removes it
                log.debug("turn: intent %s left for a later round: %s", self.intent.name, e)


class _Round:
    """What a round's write did (Writer._write_all)."""

    def __init__(self, version: str) -> None:
        self.version = version  # the pool's version after the write (or as read, nothing to write)
        self.done: list[str] = []
        self.rejected: dict[str, str] = {}
        self.wrote = False  # the write succeeded, or nothing was left to write


def _order(intent: Intent) -> tuple[int, str]:
    """Oldest first: by the version the intent was posted at."""
    return (int(intent.version) if intent.version.isdigit() else 0, intent.name)


def _verdict(outcome: Outcome, name: str) -> str | None:
    """The pool version when `outcome`'s round wrote intent `name` (or found it applied); Conflict when it
    refused it; None when it did not handle it."""
    if name in outcome.done:
        return outcome.pool
    why = outcome.rejected.get(name)
    if why is not None:
        raise Conflict(f"turn: refused: {why}")
    return None


def watch_states(
    events: Iterator[dict[str, Any]], parse: Callable[[dict[str, Any]], State]
) -> Iterator[State]:
    """The turn's states from a watch's events (ADDED/MODIFIED); 410 ERROR events raise Gone."""
    for event in events:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise StoreUnavailable(f"turn: watch: {obj.get('message') or obj}")
        if kind in ("ADDED", "MODIFIED"):
            yield parse(obj)
