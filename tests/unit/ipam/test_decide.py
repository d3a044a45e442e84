"""The pure decision core (ipam.decide), property by property: no offset handed out twice, nothing outside
the range's segments, a re-ADD keeps its address, a DEL frees exactly its attachment's entries, blocked
offsets are never chosen, a batch decides as its operations would one after another, and the claim loop
an executor runs around it reaches a fixpoint in which each operation keeps the offset it claimed."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from ipam import decide
from ipam.decide import Add, Changes, Del, Freed, Full, SnapshotView, Took
from ipam.model import Allocation, Pool, PoolUpdate, Segment

CONTAINERS = [f"c{i}" for i in range(8)]
PODS = [f"ns/p{i}" for i in range(5)]
IFNAMES = ["net1", "net2"]


def owner(container: str, pod: str, ifname: str) -> Allocation:
    return Allocation(container, pod, ifname, f"uid-{pod}", "blue", "node1")


owners = st.builds(owner, st.sampled_from(CONTAINERS), st.sampled_from(PODS), st.sampled_from(IFNAMES))


@st.composite
def segments(draw: st.DrawFn) -> list[Segment]:
    """1 to 3 ascending, disjoint segments inside offsets 1..40 (the gaps: excludes, range ends)."""
    cuts = sorted(draw(st.sets(st.integers(1, 40), min_size=2, max_size=6)))
    if len(cuts) % 2:
        cuts = cuts[:-1]
    return [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]


@st.composite
def pools(draw: st.DrawFn, segs: Sequence[Segment]) -> Pool:
    """A pool as a store holds it: entries inside the segments, one per attachment and per pod
    interface (what the rules themselves keep), versioned."""
    inside = [o for lo, hi in segs for o in range(lo, hi + 1)]
    keys = draw(st.lists(st.sampled_from(inside), unique=True, max_size=min(len(inside), 12)))
    entries: dict[str, Allocation] = {}
    for key in keys:
        a = draw(owners)
        if any(b.same_attachment(a) or b.same_pod_interface(a) for b in entries.values()):
            continue
        entries[str(key)] = a
    return Pool("p", "198.51.100.0/24", entries, "7")


type Case = tuple[list[Segment], Pool, list[decide.Op]]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Segments, a pool in them, and a batch whose owners are often the pool's own (DELs that free, re-ADDs
    and takeovers) and whose ADDs often hold a reservation of a free offset already."""
    segs = draw(segments())
    pool = draw(pools(segs))
    known = st.sampled_from(list(pool.allocations.values())) if pool.allocations else owners
    who = st.one_of(owners, known, known.map(lambda a: a._replace(container_id="c-new")))
    free = sorted({o for lo, hi in segs for o in range(lo, hi + 1)} - {int(k) for k in pool.allocations})
    held = draw(st.lists(st.sampled_from(free), unique=True, max_size=3)) if free else []
    batch: list[decide.Op] = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            batch.append(Del(draw(who)))
            continue
        reserved = (held.pop(),) if held and draw(st.booleans()) else ()
        batch.append(Add(draw(who), reserved, draw(st.frozensets(st.integers(0, 42), max_size=6))))
    return segs, pool, batch


def inside(segs: Sequence[Segment], offset: int) -> bool:
    return any(lo <= offset <= hi for lo, hi in segs)


def after(pool: Pool, update: PoolUpdate) -> dict[str, Allocation]:
    return update.apply(pool.allocations)


@given(cases())
def test_no_offset_twice_and_never_outside_the_range(
    case: Case,
) -> None:
    segs, pool, batch = case
    decided = decide.decide(SnapshotView(pool), batch, segs)
    new = [o.offset for o in decided.outcomes if isinstance(o, Took) and o.kind == "new"]
    assert len(new) == len(set(new))  # never twice in one batch
    assert not set(map(str, new)) & pool.allocations.keys()  # nor an address the pool holds
    assert all(inside(segs, o) for o in new)
    final = after(pool, decided.update())
    for i, (op, out) in enumerate(zip(batch, decided.outcomes, strict=True)):
        if isinstance(op, Add) and isinstance(out, Took) and out.kind == "new":
            assert out.offset not in op.blocked
            later = batch[i + 1 :]  # a later DEL of the attachment, or a takeover, changes the entry
            if not any(
                o.owner.same_attachment(op.owner) or o.owner.same_pod_interface(op.owner) for o in later
            ):
                assert final[str(out.offset)] == op.owner


@given(cases())
def test_full_only_when_no_unblocked_offset_is_free(
    case: Case,
) -> None:
    segs, pool, batch = case
    changes = Changes(SnapshotView(pool))
    freed: set[int] = set()
    for op in batch:
        free = {o for lo, hi in segs for o in range(lo, hi + 1)} - freed
        free -= {int(k) for k in changes.update().apply(pool.allocations)}
        out = decide.one(changes, op, segs)
        if isinstance(out, Full):
            assert isinstance(op, Add) and not free - op.blocked
            assert out.count >= len(pool.allocations)
        elif isinstance(op, Add) and free - op.blocked:
            assert isinstance(out, Took)
        if isinstance(out, Freed):
            freed |= {o for o, _ in out.offsets}


@given(cases())
def test_a_re_add_keeps_its_address_and_writes_nothing(
    case: Case,
) -> None:
    segs, pool, _ = case
    for key, held in pool.allocations.items():
        decided = decide.decide(SnapshotView(pool), [Add(held, blocked=frozenset({int(key)}))], segs)
        assert decided.outcomes == [Took(int(key), "existing")]
        assert not decided.update()
    # and within one batch: the second ADD of an attachment finds the first one's address
    first = owner("c9", "ns/p9", "net1")
    twice = decide.decide(SnapshotView(pool), [Add(first), Add(first)], segs)
    a, b = twice.outcomes
    if isinstance(a, Took):
        assert b == Took(a.offset, "existing")
        assert twice.update().put == {str(a.offset): first}
    else:
        assert isinstance(a, Full) and isinstance(b, Full)


@given(cases())
def test_a_del_frees_exactly_its_attachments_entries(
    case: Case,
) -> None:
    segs, pool, batch = case
    for op in batch:
        if not isinstance(op, Del):
            continue
        decided = decide.decide(SnapshotView(pool), [op], segs)
        mine = {k: a for k, a in pool.allocations.items() if a.same_attachment(op.owner)}
        (out,) = decided.outcomes
        assert isinstance(out, Freed) and dict(out.entries) == mine
        assert decided.update() == PoolUpdate(remove=frozenset(mine))
        assert after(pool, decided.update()) == {k: a for k, a in pool.allocations.items() if k not in mine}
        # a second DEL in the same batch finds nothing more (DEL is idempotent)
        again = decide.decide(SnapshotView(pool), [op, op], segs).outcomes[1]
        assert again == Freed(())


def sequentially(segs: list[Segment], pool: Pool, batch: list[decide.Op]) -> list[decide.Outcome]:
    """Each op decided alone on the pool as the previous ones' writes left it; offsets freed earlier in
    the batch stay out of reach (a batch never hands out what it frees), as do other ops' reservations."""
    out: list[decide.Outcome] = []
    freed: set[int] = set()
    reserved = {o for op in batch if isinstance(op, Add) for o in op.reserved}
    for op in batch:
        alone = op
        if isinstance(op, Add):
            others = reserved.difference(op.reserved)
            alone = Add(op.owner, op.reserved, op.blocked | freed | others, op.claims, op.start)
        decided = decide.decide(SnapshotView(pool), [alone], segs)
        (outcome,) = decided.outcomes
        out.append(outcome)
        if isinstance(outcome, Freed):
            freed |= {o for o, _ in outcome.offsets}
        pool = Pool(pool.name, pool.range, after(pool, decided.update()), pool.version)
    return out


def shape(outcome: decide.Outcome) -> object:
    return "full" if isinstance(outcome, Full) else outcome  # a full pool's count: the batch's own view


@given(cases(), st.lists(st.integers(1, 40), max_size=4))
def test_a_batch_decides_as_its_ops_one_after_another(case: Case, reserved: list[int]) -> None:
    segs, pool, batch = case
    # some ADDs hold reservations already (distinct offsets: one claim per reservation)
    batch = [Add(op.owner, (reserved.pop(),), op.blocked) if isinstance(op, Add) and reserved else op
             for op in batch]  # fmt: skip
    together = decide.decide(SnapshotView(pool), batch, segs).outcomes
    assert list(map(shape, together)) == list(map(shape, sequentially(segs, pool, batch)))


@given(cases(), st.floats(0, 0.999))
def test_start_takes_the_lowest_free_offset_from_its_point_wrapping_around(case: Case, point: float) -> None:
    segs, pool, _ = case
    view = SnapshotView(pool)
    newcomer = owner("c9", "ns/p9", "net1")
    lowest = decide.add(view, Add(newcomer), segs)
    start = decide.scatter(segs, point)
    scattered = decide.add(view, Add(newcomer, start=start), segs)
    if isinstance(lowest, Full):
        assert isinstance(scattered, Full)
        return
    assert isinstance(scattered, Took)
    free = sorted({o for lo, hi in segs for o in range(lo, hi + 1)} - {int(k) for k in pool.allocations})
    assert scattered.offset == min([o for o in free if o >= start] or free)  # wrapping around


@given(cases(), st.sets(st.integers(1, 40), max_size=10))
def test_claims_reach_a_fixpoint_where_each_add_keeps_its_claim(case: Case, strangers: set[int]) -> None:
    """The executor's loop: decide, claim the offsets the core asks for (refused: held by a stranger
    or by another attachment), decide again with the refused ones blocked; until nothing is refused."""
    segs, pool, batch = case
    seen: set[tuple[str, str]] = set()  # one op per attachment (a runtime serialises an attachment's calls)
    batch = [op for op in batch if op.owner.attachment not in seen and not seen.add(op.owner.attachment)]
    batch = [Add(op.owner, op.reserved, claims=True) if isinstance(op, Add) else op for op in batch]
    # a stranger never holds what the pool's entries or the batch's earlier claims hold (one reservation
    # per address): drawn offsets that coincide with those are no stranger's
    strangers = strangers - {int(k) for k in pool.allocations}
    strangers -= {o for op in batch if isinstance(op, Add) for o in op.reserved}
    stranger = Allocation("stranger", "ns/other", "eth0")
    held = dict.fromkeys(strangers, stranger)
    for key, a in pool.allocations.items():
        held[int(key)] = a  # the pool's entries hold their reservations
    for op in batch:
        if isinstance(op, Add) and op.reserved:
            held[op.reserved[0]] = op.owner  # claimed in an earlier attempt
    rounds = 0
    while True:
        rounds += 1
        assert rounds <= 2 + 2 * 40 * len(batch)  # each round claims or blocks one more offset
        decided = decide.decide(SnapshotView(pool), batch, segs)
        claimed = False
        for i, (op, out) in enumerate(zip(batch, decided.outcomes, strict=True)):
            if not (isinstance(op, Add) and isinstance(out, Took) and out.claim):
                continue
            claimed = True
            holder = held.get(out.offset)
            mine = holder is None or holder.same_attachment(op.owner) or holder.same_pod_interface(op.owner)
            if mine or out.kind != "new":  # an entry's own (or taken over) reservation: the executor's
                held[out.offset] = op.owner
                batch[i] = Add(op.owner, (*op.reserved, out.offset), op.blocked, True)
            else:  # never one another op of the batch claimed: the core keeps them off it
                assert holder is not None and not any(holder == o.owner for o in batch)
                batch[i] = Add(op.owner, op.reserved, op.blocked | {out.offset}, True)
        if not claimed:
            break
    for op, out in zip(batch, decided.outcomes, strict=True):
        if isinstance(op, Add) and isinstance(out, Took) and out.kind == "new":
            assert op.reserved == (out.offset,)  # one claim per op, and the op kept it
            if any(
                o.owner.same_pod_interface(op.owner) and not o.owner.same_attachment(op.owner) for o in batch
            ):
                continue  # a takeover by the pod's other container holds it now
            assert held[out.offset].same_attachment(op.owner) and out.offset not in strangers


@given(cases())
def test_lean_entries_carry_no_extras(case: Case) -> None:
    segs, pool, batch = case
    decided = decide.decide(SnapshotView(pool), batch, segs, lean=True)
    assert all(not a.has_extras() for a in decided.update().put.values())
    fat = decide.decide(SnapshotView(pool), batch, segs)
    assert list(map(keys, decided.outcomes)) == list(map(keys, fat.outcomes))
    assert decided.update().put.keys() == fat.update().put.keys()


def keys(o: decide.Outcome) -> object:
    """An outcome without the entries' contents (a lean entry lacks the extras)."""
    if isinstance(o, Freed):
        return [k for k, _ in o.entries]
    return (o.offset, o.kind, o.claim) if isinstance(o, Took) else o


@given(cases(), st.data())
def test_remove_frees_exactly_the_picked_entries_still_as_judged(case: Case, data: st.DataObject) -> None:
    """GC, the reconciler and `pycni-ipam release` pick entries; those the pool no longer holds as picked
    (taken over, freed) stay untouched, the others go, nothing else does."""
    segs, pool, _ = case
    entries = list(pool.allocations.items())
    picked = data.draw(st.lists(st.sampled_from(entries), unique=True) if entries else st.just([]))
    changed = data.draw(st.lists(st.sampled_from(picked), unique=True) if picked else st.just([]))
    judged = [
        (k, a._replace(container_id="was-" + a.container_id) if (k, a) in changed else a) for k, a in picked
    ]
    decided = decide.decide(SnapshotView(pool), [decide.Remove(tuple(judged))], segs)
    (out,) = decided.outcomes
    still = [(k, a) for k, a in picked if (k, a) not in changed]
    assert isinstance(out, Freed) and sorted(out.entries) == sorted(still)
    assert after(pool, decided.update()) == {k: a for k, a in entries if (k, a) not in still}
