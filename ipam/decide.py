"""The IPAM's decisions, pure: a pool view and operations in, a pool update and one outcome per operation
out. No I/O, no clock, no threads, no random numbers (an import-linter contract keeps it so): whatever
an executor (ipam.engine) wants at random, it draws and passes in as plain values.

- `Add`: one attachment's address in one range. Cluster-wide reservations (overlapping ranges) are the
  executor's I/O: an Add carries the offsets it already `reserved` (kept while free) and those it found
  `blocked` (someone else's); its outcome says whether the address needs a `claim`. The executor claims
  it and, when refused, decides the Add again with the offset added to `blocked`, until a decision needs
  no claim that fails (a fixpoint: each refusal blocks one more offset, and the range is finite).
- `Del`: one attachment's entries removed; its outcome is the entries freed.
- `Remove`: entries picked by whoever judged them (CNI GC, the reconciler, `pycni-ipam release`),
  removed where the pool still holds them exactly as judged (an entry taken over since stays); its
  outcome is the entries freed.
- Outcomes: `Took` (an address), `Full` (no free address: the executor's pool-exhausted error),
  `Freed` (entries removed), `Taken` (a requested offset another entry holds or that is blocked: the
  executor's code 109 naming the holder), `Elsewhere` (a request from an attachment that holds another
  offset).

Rules: the same attachment keeps its entry ("existing"); the same pod and interface with a new container
id takes its entry over ("takeover"); else the lowest free offset of the range's segments that is not
blocked ("new"), or with `start` the lowest at or after that point of the range, wrapping around. An Add
with `want` (a requested address, ipam.requested) takes exactly that offset: its own entry there
("existing"), its pod interface's entry there ("takeover"), else the offset if free and not blocked
("new"), else Taken. Offsets decided or freed earlier in the same batch are taken for the rest of it, as
are the offsets other Adds of the batch reserved. `lean` (the Kubernetes store with overlapping ranges):
entries are written without pycni's extras, which their reservations carry (ipam.model.Allocation.bare).

A view is the PoolView protocol (ipam.model): `SnapshotView` over a loaded pool, or a store's own
indexed answer (the local store). Within a segment [lo, hi] the taken offsets are sorted and distinct,
so "taken[j] == lo + j" holds for a prefix of them and a binary search finds where it first fails: the
lowest free offset costs O(k log n) for k segments and n allocations, never a walk of the range."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence, Set

from cni.types.valueclass import field, valueclass
from ipam.model import Allocation, Pool, PoolUpdate, PoolView, Segment


@valueclass
class Add:
    """An ADD in one range. `start` (an offset: `scatter` of a random point) comes from the executor's
    random draw, or keeps its default (the lowest free offset)."""

    owner: Allocation
    reserved: tuple[int, ...] = ()  # offsets this call holds claims on: preferred while free
    blocked: frozenset[int] = frozenset()  # offsets held by others (refused claims)
    claims: bool = False  # overlapping ranges: an offset needs a cluster-wide claim
    start: int | None = None
    want: int | None = None  # a requested address (ipam.requested): exactly this offset, or Taken


@valueclass
class Del:
    owner: Allocation


@valueclass
class Remove:
    entries: tuple[tuple[str, Allocation], ...]


@valueclass
class Took:
    """`kind`: "existing" (nothing to write), "takeover" (`previous` replaced in place) or "new"."""

    offset: int
    kind: str
    claim: bool = False  # the executor claims the reservation of `offset` before the write
    previous: Allocation | None = None


@valueclass
class Full:
    count: int  # allocations in the pool


@valueclass
class Taken:
    """A requested offset held by another entry of the pool (`holder`), or blocked (holder None: a
    refused claim, another op of the batch): nothing written."""

    offset: int
    holder: Allocation | None = None


@valueclass
class Elsewhere:
    """A request for `want` from an attachment that already holds `offset` in the pool."""

    offset: int
    want: int


@valueclass
class Freed:
    entries: tuple[tuple[str, Allocation], ...] = ()

    @property
    def offsets(self) -> list[tuple[int, Allocation]]:
        """The entries with decimal keys (the others have no address, nor a reservation)."""
        return [(int(k), a) for k, a in self.entries if k.isdigit()]


type Op = Add | Del | Remove
type Outcome = Took | Full | Freed | Taken | Elsewhere


# ---- views --------------------------------------------------------------------------------------------


def lowest_free(segments: Iterable[Segment], taken: Sequence[int]) -> int | None:
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


def taken_offsets(allocations: Iterable[str]) -> list[int]:
    """The decimal keys as sorted offsets (other keys hold no address: skipped, kept in the store)."""
    return sorted({int(k) for k in allocations if k.isdigit()})


def _numeric(item: tuple[str, Allocation]) -> tuple[int, str]:
    return len(item[0]), item[0]


class SnapshotView:
    """PoolView over a loaded Pool."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._taken: list[int] | None = None

    @property
    def name(self) -> str:
        return self.pool.name

    @property
    def range(self) -> str:
        return self.pool.range

    @property
    def version(self) -> str | None:
        return self.pool.version

    def count(self) -> int:
        return len(self.pool.allocations)

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        match = owner.same_pod_interface if by_pod else owner.same_attachment
        return sorted(((k, a) for k, a in self.pool.allocations.items() if match(a)), key=_numeric)

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        if self._taken is None:
            self._taken = taken_offsets(self.pool.allocations)
        # skip blocked candidates one by one (few) instead of merging them into `taken` (large)
        segs = list(segments)
        while True:
            candidate = lowest_free(segs, self._taken)
            if candidate is None or candidate not in blocked:
                return candidate
            segs = after(segs, candidate)

    def holder(self, offset: int) -> Allocation | None:
        return self.pool.allocations.get(str(offset))


class Changes:
    """`base` with a batch's decisions applied. Offsets freed in the batch stay taken until the write
    commits (a freed address is never handed out again by the same write)."""

    def __init__(self, base: PoolView) -> None:
        self.base = base
        self.put: dict[str, Allocation] = {}
        self.remove: set[str] = set()
        self._held: set[int] = set()

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def range(self) -> str:
        return self.base.range

    @property
    def version(self) -> str | None:
        return self.base.version

    def count(self) -> int:
        return self.base.count() + len(self._held)

    def owned(self, owner: Allocation, by_pod: bool = False) -> list[tuple[str, Allocation]]:
        match = owner.same_pod_interface if by_pod else owner.same_attachment
        changed = self.remove | self.put.keys()
        out = [(k, a) for k, a in self.base.owned(owner, by_pod) if k not in changed]
        out += [(k, a) for k, a in self.put.items() if match(a)]
        return sorted(out, key=_numeric)

    def lowest_free(self, segments: Sequence[Segment], blocked: Set[int]) -> int | None:
        return self.base.lowest_free(segments, set(blocked) | self._held if self._held else blocked)

    def holder(self, offset: int) -> Allocation | None:
        key = str(offset)
        if key in self.put:
            return self.put[key]
        return None if key in self.remove else self.base.holder(offset)

    def apply(self, update: PoolUpdate) -> None:
        for key in update.remove:
            self.put.pop(key, None)
            self.remove.add(key)
            if key.isdigit():
                self._held.add(int(key))
        for key, owner in update.put.items():
            self.remove.discard(key)
            self.put[key] = owner
            if key.isdigit():
                self._held.add(int(key))

    def hold(self, offset: int) -> None:
        """`offset` is someone else's (a reservation): no op of this batch picks it."""
        self._held.add(offset)

    def update(self) -> PoolUpdate:
        return PoolUpdate(put=dict(self.put), remove=frozenset(self.remove))


# ---- decisions ----------------------------------------------------------------------------------------


@valueclass
class Decided:
    """A batch's decisions: the pool update (`changes.update()`) and the outcomes, in the ops' order."""

    changes: Changes
    outcomes: list[Outcome] = field(default_factory=list)

    def update(self) -> PoolUpdate:
        return self.changes.update()


def decide(
    view: PoolView, ops: Sequence[Op], segments: Sequence[Segment], lean: bool = False,
    changes: Changes | None = None,
) -> Decided:  # fmt: skip
    """Decide `ops` in turn on `view` (after the decisions already in `changes`, if given, which then
    takes these too): each on the pool plus the decisions before it."""
    changes = changes if changes is not None else Changes(view)
    reserved = {o for op in ops if isinstance(op, Add) for o in op.reserved}
    out: list[Outcome] = []
    for op in ops:
        others = reserved.difference(op.reserved) if isinstance(op, Add) else set()
        out.append(one(changes, op, segments, lean, frozenset(others)))
    return Decided(changes, out)


def one(
    changes: Changes, op: Op, segments: Sequence[Segment], lean: bool = False,
    others: frozenset[int] = frozenset(),
) -> Outcome:  # fmt: skip
    """Decide `op` on `changes` and apply its update there. `others`: offsets other ops reserved."""
    if isinstance(op, Del):
        owned = changes.owned(op.owner)
        changes.apply(PoolUpdate(remove=frozenset(k for k, _ in owned)))
        return Freed(tuple(owned))
    if isinstance(op, Remove):
        found = [(k, a) for k, a in op.entries if (k, a) in changes.owned(a)]  # still exactly as judged
        changes.apply(PoolUpdate(remove=frozenset(k for k, _ in found)))
        return Freed(tuple(found))
    outcome = add(changes, op, segments, others)
    if isinstance(outcome, Took):
        apply(changes, outcome, op.owner, lean)
    return outcome


def add(view: PoolView, op: Add, segments: Sequence[Segment], others: Set[int] = frozenset()) -> Outcome:
    """The address `op` gets in `view` (nothing applied)."""
    held = _held(view, op)
    if held is not None:
        return held
    blocked = op.blocked | others if others else op.blocked
    if op.want is not None:
        if op.want in blocked or view.lowest_free([(op.want, op.want)], blocked) != op.want:
            return Taken(op.want, view.holder(op.want))
        return Took(op.want, "new", _claim(op, op.want))
    return _free(view, op, segments, blocked)


def _held(view: PoolView, op: Add) -> Outcome | None:
    """The attachment's own entry (elsewhere than requested: Elsewhere), else its pod's entry of the same
    interface (a takeover; a request moves no other entry); None without either."""
    owner, want = op.owner, op.want
    mine = view.owned(owner)
    if mine:
        if want is not None and int(mine[0][0]) != want:
            return Elsewhere(int(mine[0][0]), want)
        return Took(int(mine[0][0]), "existing", _claim(op, int(mine[0][0])))
    old = view.owned(owner, by_pod=True) if owner.podref else []
    old = [(k, a) for k, a in old if want is None or k == str(want)]  # a request moves no other entry
    if old:
        key, prev = old[0]
        return Took(int(key), "takeover", _claim(op, int(key)), prev)
    return None


def _free(view: PoolView, op: Add, segments: Sequence[Segment], blocked: Set[int]) -> Outcome:
    """A free address for an attachment without one: one it reserved already, else the lowest free (after
    `op.start`), else Full."""
    for want in op.reserved:
        free = want not in blocked and view.lowest_free([(want, want)], blocked) == want
        if free and inside(segments, want):
            return Took(want, "new", _claim(op, want))
    offset = None
    if op.start is not None:
        offset = view.lowest_free(after(segments, op.start - 1), blocked)
    if offset is None:
        offset = view.lowest_free(segments, blocked)
    if offset is None:
        return Full(view.count())
    return Took(offset, "new", _claim(op, offset))


def _claim(op: Add, offset: int) -> bool:
    return op.claims and offset not in op.reserved


def apply(changes: Changes, took: Took, owner: Allocation, lean: bool = False) -> None:
    """Apply an Add's address to `changes` (an entry without extras when `lean`)."""
    if took.kind != "existing":
        changes.apply(PoolUpdate(put={str(took.offset): owner.bare() if lean else owner}))


# ---- the range's geometry -----------------------------------------------------------------------------


def scatter(segments: Sequence[Segment], point: float) -> int:
    """The offset at fraction `point` (0 <= point < 1) of the segments' addresses taken together."""
    total = sum(hi - lo + 1 for lo, hi in segments)
    left = min(int(point * total), total - 1)
    for lo, hi in segments:
        if left <= hi - lo:
            return lo + left
        left -= hi - lo + 1
    return segments[0][0] if segments else 0


def inside(segments: Sequence[Segment], offset: int) -> bool:
    return any(lo <= offset <= hi for lo, hi in segments)


def after(segments: Sequence[Segment], offset: int) -> list[Segment]:
    """The segments trimmed to the offsets above `offset`."""
    return [(max(lo, offset + 1), hi) for lo, hi in segments if hi > offset]
