"""load -> allocate/release -> commit with compare-and-swap; conflicts retried with jittered backoff under a
deadline; an unreachable store is code 11 (after a short grace), never silence.

Overlapping ranges (one reservation per IP, cluster-wide): on ADD the reservation is claimed BEFORE the
pool is written, so no two pools can commit the same IP; on DEL the pool is released first and the
reservation after. A crash between the two steps leaves at worst a reservation without a pool entry
(an address parked, never one handed out twice); the same owner's next ADD reuses it, its DEL frees it
(ipam.reservations: Reservations.sweep), and GC and the reconciler free it once the owner is gone.

In the agent, on the Kubernetes store with overlapping ranges (the reservations authoritative), a call is
answered once its batch decided it (ipam.batch: deferred writes): an ADD when its address is reserved, a
DEL when its entries are found; the pool write that follows carries every call decided in its window
(Combiner.window). Until it lands the address is held by its reservation alone, as after a
crash between the two steps above; a CHECK or GC of the pool waits for it (Combiner.settle)."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import time
from collections.abc import Callable, Mapping

from cni import faults, log
from cni.errors import CheckError, CniError, Code, TryAgainError
from ipam import allocator, batch, decide, nodelock, nodequeue, removal
from ipam.allocator import SnapshotView
from ipam.batch import BatchView, Claims, Op
from ipam.config import IpamConfig
from ipam.model import Allocation, Attachment, Pool, PoolUpdate, PoolView, Reservation, by_attachment, joined
from ipam.ranges import IPRange
from ipam.reservations import Reservations, reserved_for
from ipam.retry import Retry, retrying
from ipam.store.base import Conflict, Store, StoreUnavailable
from ipam.store.names import pool_name

SPREAD_MAX = 32  # after lost races, pick among at most this many of the lowest free addresses
HOT_SECONDS = 10.0  # after a race lost to another node, this node's calls scatter at once for this long
CLUSTER_STORES = ("kubernetes", "etcd")


def spread(claims: Claims) -> int:
    """1 (the lowest free address) until two races are lost, then a window doubling per loss."""
    return min(2 ** (claims.lost - 1), SPREAD_MAX) if claims.lost > 1 else 1


class Engine:
    def __init__(
        self, store: Store, conf: IpamConfig, retry: Retry | None = None,
        reopen: Callable[[], contextlib.AbstractContextManager[Store]] | None = None,
    ) -> None:  # fmt: skip
        """`reopen`: a handle of the store for a deferred batch's own thread (default: a handle of
        conf.store from ipam.store.handles, warm in the agent)."""
        self.store, self.conf, self.retry = store, conf, retry or Retry()
        self.reopen = reopen
        s = conf.store
        self.identity = f"{s.datastore}|{s.kubernetes.kubeconfig}|{s.etcd.host}|{s.local_db}"
        cluster = s.datastore in CLUSTER_STORES
        self.lock_dir = os.path.join(os.path.dirname(s.local_db), "pool-locks") if cluster else ""
        # pool entries without pycni's extras (pod UID, network, node) where every entry's reservation
        # carries them: on the Kubernetes store they are a per-entry annotation of the pool object, which
        # every write of it pays for (docs/benchmarks.md); readers join them back (ipam.model.joined).
        # Node slices too: a slice pool has one writer, but each of its writes still pays for its size
        # (the reconciler finds a slice pool's entry by the node its reservation records)
        self.lean = conf.overlapping and s.datastore == "kubernetes"
        # the agent may answer a call on overlapping ranges before its pool write (module docstring)
        self.defers = s.datastore == "kubernetes"
        self.reservations = Reservations(store, conf, self.retry, self.pool_name, self._atomic)

    def pool_name(self, rng: IPRange) -> str:
        return rng.pool or pool_name(rng.cidr, self.conf.network_name)

    def reservation_name(self, rng: IPRange, offset: int) -> str:
        return self.reservations.name(rng, offset)

    def _retrying[T](self, what: str, attempt: Callable[[], T]) -> T:
        return retrying(self.retry, what, attempt)

    def _view(self, rng: IPRange, floor: str = "") -> PoolView:
        """The pool as allocation sees it: the store's own view (inside `exclusive()`), else a snapshot
        (with a `floor` version: possibly from a cache, at least that new)."""
        name = self.pool_name(rng)
        view: PoolView | None = self.store.view_pool(name)
        if view is None:
            pool = self.store.recent_pool(name, floor) if floor else self.store.get_pool(name)
            view = None if pool is None else SnapshotView(pool)
        if view is None:
            return SnapshotView(Pool(name, rng.cidr))
        if not _same_network(view.range, rng):
            raise CniError(
                f"pool {name} holds range {view.range!r}, expected {rng.cidr}", code=Code.INVALID_CONFIG
            )
        return view

    def _commit(self, view: PoolView, update: PoolUpdate) -> str:
        return self.store.commit_pool(Pool(view.name, view.range, {}, view.version), update)

    def _atomic(
        self, pool: str = "", node: str = ""
    ) -> contextlib.AbstractContextManager[nodelock.Held | None]:
        """One attempt's read-modify-write: the store's exclusive() (local), a node-local lock per pool
        (cluster stores: ipam.nodelock), else nothing."""
        if self.store.serial:
            unit = self.store.exclusive()
            if unit is not None:
                return unit
        if self.lock_dir and pool:
            return nodelock.held(nodelock.path_for(self.lock_dir, self.identity, node, pool))
        return contextlib.nullcontext()

    # ---- batches: ADD and DEL ---------------------------------------------------------------------

    def _run(self, ops: list[Op]) -> None:
        """Run ops of one range (one pool) to completion through the process' combiner for the pool (in
        the agent, concurrent calls share one write); raise an op's own error."""
        now = self.retry.clock()
        for op in ops:
            op.started = op.begun = now
        name = self.pool_name(ops[0].rng)
        what = f"{'allocating' if ops[0].kind == 'add' else 'releasing'} in {ops[0].rng.cidr}"
        ticket = path = None
        if self.lock_dir and not batch.sharing():  # a plugin process: share writes with the node's others
            path = nodelock.path_for(self.lock_dir, self.identity, ops[0].owner.node, name)
            ticket = nodequeue.publish(path, ops)

        def here(group: list[Op]) -> None:  # `group` grows by the ops a deferred batch takes
            tries = _Tries()
            self._retrying(what, lambda: self._step(name, group, ticket, group, tries))
            if batch.sharing():
                self._release_freed(group)

        execute: Callable[[list[Op]], None] = here
        if batch.sharing() and batch.combiner((self.identity, name)).defer:  # run by the combiner's thread
            execute = self._deferred(name, what)

        try:
            batch.combiner((self.identity, name)).run(ops, execute)
        finally:
            if ticket is not None and path is not None and not ticket.closed:
                _withdraw(ticket, path)  # giving up: a holder may have decided it meanwhile
        for op in ops:
            if op.error is not None:
                raise op.error

    def _deferred(self, name: str, what: str) -> Callable[[list[Op]], None]:
        """A batch of pool `name` as the combiner's own thread runs it when writes are deferred: with a
        store handle and an engine of its own (the callers' may be back at work elsewhere)."""
        conf, retry, reopen = self.conf, self.retry, self.reopen

        def execute(group: list[Op]) -> None:
            from ipam.store.handles import store_for

            with reopen() if reopen is not None else store_for(conf.store) as store:
                engine, tries = Engine(store, conf, retry, reopen), _Tries()
                engine._retrying(what, lambda: engine._step(name, group, None, group, tries))
                engine._release_freed(group)

        return execute

    def _step(
        self, name: str, ops: list[Op], ticket: nodequeue.Ticket | None = None, grow: list[Op] | None = None,
        tries: _Tries | None = None,
    ) -> None:  # fmt: skip
        """One read-modify-write of pool `name` for every op of the batch not yet done: each decided in
        turn against the pool plus the decisions before it, then one write. A Conflict on the write
        leaves every op pending (the retry reads the pool again; reservations already made are kept).

        A batch starts from the node lock's snapshot when the previous holder on this node left one
        (ipam.nodelock.Held: the store's answer to its write), else from the store: a batch of DELs
        always, one with ADDs while the pool is not `hot` (no race lost to another node and no foreign
        write seen lately: on a pool this node alone writes, an ADD then costs no read). A snapshot may
        lack the latest writes of others: a DEL that finds nothing in it looks at the stored pool before
        saying so, a removal that no longer fits is a Conflict like any other, and a write with ADDs
        decided on a snapshot needs the whole pool unchanged since (a Conflict: the retry, and for a
        while the node's next ADDs, read the pool).

        On a pool other nodes write too (`hot`) and a store that checks whole versions (not `merges`),
        the reservations a pass created took round trips during which the pool may have moved on: the
        pool is read again and the batch decided again on it (each op keeps the address it reserved, no
        request), so the write follows its read at once instead of losing the compare-and-swap to
        whoever wrote meanwhile. A merging store guards entry by entry: no need.

        A plugin process (`ticket`: its ops in the node's queue, ipam.nodequeue) that gets the lock
        after another holder decided its ops is done without a request; a holder takes the ops other
        plugin processes left in the queue into its batch and answers them once its write succeeded.

        Deferred writes (the agent's combiner defers and `self.defers`): the ops decided are answered
        before the write, and for DEFER seconds the calls that arrive are decided on the same view and
        answered too (appended to `grow`, the batch's list, so that a retry of the write keeps them);
        then one write for all. A retry decides an answered ADD on its address again (_decide_add)."""
        pending = [op for op in ops if not op.done]
        if not pending:
            return
        _undecide(pending)  # an attempt before this one failed: its decisions are void
        rng = pending[0].rng
        with self._atomic(name, pending[0].owner.node) as lock:
            taken = self._from_queue(lock, ticket, len(pending))
            if taken is None:
                return  # decided and written by another call on this node
            try:
                self._locked_step(name, rng, lock, ticket, pending, taken, grow, tries or _Tries())
            except BaseException:
                nodequeue.hand_back(taken)
                raise

    def _locked_step(
        self, name: str, rng: IPRange, lock: nodelock.Held | None, ticket: nodequeue.Ticket | None,
        pending: list[Op], taken: nodequeue.Taken, grow: list[Op] | None, tries: _Tries,
    ) -> None:  # fmt: skip
        """_step's attempt under the node lock, `taken` the other calls' operations it serves."""
        began = time.monotonic()
        pending += taken.ops
        hot = None if lock is None else lock.hot()
        lost = sum(op.claims.lost for op in pending)
        view, got, cached = self._decide_batch(rng, lock, pending, hot, tries.reread)
        changes, decided = got.changes, got.decided
        comb = batch.combiner((self.identity, name)) if self.defers and batch.sharing() else None
        if comb is not None and comb.defer and grow is not None:
            comb.answer([op for op in decided if op.overlapping])  # the others wait for the write
            decided += self._decide_arrivals(comb, view, changes, hot, cached, pending, grow)
        if lock is not None and sum(op.claims.lost for op in pending) > lost:
            lock.heat(HOT_SECONDS)  # races lost to other nodes: the next calls here spread at once
        version = view.version
        update = changes.update()
        if cached and any(op.kind == "add" for op in decided):
            update = PoolUpdate(put=update.put, remove=update.remove, whole=True)
        if update and (view.version is not None or update.put):
            wrote = time.monotonic()
            try:
                version = self._commit(view, update)
                if comb is not None:
                    comb.wrote(time.monotonic() - wrote)
            except StoreUnavailable:  # the server may have applied the write all the same (StoreBusy:
                # a read timeout, a 504): a retry may find these entries gone, their reservations not
                for op in decided:
                    op.sent += [f for f in op.freed if f not in op.sent]
                raise
            except Conflict:
                tries.reread = True  # not a cached read next time: it may not hold what we met
                if lock is not None and update.whole:  # written since the snapshot: read it for a while
                    lock.seen_foreign(HOT_SECONDS)
                elif lock is not None:
                    lock.heat(HOT_SECONDS)  # another node wrote this pool meanwhile
                raise
            faults.point("store-commit")  # tests: inside the store transaction, before it ends
        self._keep_view(lock, name, version)
        if lock is not None:
            lock.took(time.monotonic() - began)
        self._done(lock, ticket, decided, taken)
        for op in decided:
            if op.kind == "add":
                log.debug("%s %s: %s (%s)", op.owner.container_id, op.owner.ifname,
                          op.rng.address(op.offsets[0]), name)  # fmt: skip

    def _decide_arrivals(
        self, comb: batch.Combiner, view: PoolView, changes: BatchView, hot: bool | None, cached: bool,
        pending: list[Op], grow: list[Op],
    ) -> list[Op]:  # fmt: skip
        """Deferred writes (see _step): for the combiner's window (Combiner.window), or until no op has
        arrived for Combiner.lull() seconds (or the agent stops: Combiner.close), decide and answer the
        ops that arrive, on the batch's view after its decisions; the ops so decided. An arrival that
        fails here (a pool full on this view, a snapshot found stale, the store out of reach) or a DEL
        that finds nothing on it goes back to the queue: the next batch decides it on the pool as its
        rules read it."""
        decided: list[Op] = []
        deadline = time.monotonic() + comb.window()
        while (left := deadline - time.monotonic()) > 0 and len(pending) < batch.MAX_BATCH:
            arrived = comb.more(batch.MAX_BATCH - len(pending), min(left, comb.lull()))
            if not arrived:
                break  # a lull (or the window's end): write now rather than hold what was answered
            for op in arrived:
                op.started = op.begun = self.retry.clock()
            lost = [op.claims.lost for op in arrived]
            more: list[Op] = []
            mark = changes.mark()
            try:
                got = self._decide_all(view, arrived, hot, snapshot=cached, changes=changes)
                more = [] if got.stale else got.decided
                if got.stale:
                    changes.restore(mark)  # none of them is written with this batch
            finally:  # raised or not: what was not decided goes back, as it came; so does a DEL that
                # found nothing on this view (the next batch looks at the pool as stored first)
                more = [op for op in more if op.kind == "add" or op.freed]
                failed = [op for op in arrived if op not in more]
                for op, n in zip(arrived, lost, strict=True):
                    if op in failed:
                        op.claims.lost = n
                        _undecide([op], failed=True)
                comb.requeue(failed)
            grow += more
            pending += more
            decided += more
            comb.answer([op for op in more if op.overlapping])
            if failed:
                break
        return decided

    def _decide_batch(
        self, rng: IPRange, lock: nodelock.Held | None, pending: list[Op], hot: bool | None,
        reread: bool = False,
    ) -> tuple[PoolView, Pass, bool]:  # fmt: skip
        """Decide the batch (see _step): (the view decided on, the pass, whether the view is the
        node's snapshot). The snapshot serves DELs, and ADDs while no other node raced this
        one on the pool and no foreign write was seen lately: an ADD must see every entry of its pod,
        also one written outside this node's lock (upstream whereabouts during a migration), so its
        write then needs the whole pool still at the snapshot's version. A snapshot found stale on the
        way (a candidate's reservation is newer than it: the first such stops the pass before another
        candidate is reserved; or an ADD failed on it) is no lost race: the pool is read and the batch
        decided again (each op keeps the reservations it made, all of lowest free addresses).

        Without a usable snapshot the pool is read at least as new as this node's last write of it
        (the lock's `floor`: the store may answer from a cache, which holds every write of this node);
        an ADD that fails or a DEL that finds nothing there, and every attempt after a failed write,
        reads the pool as stored."""
        before = [op.claims.lost for op in pending]  # (every op pending: _step)
        kept = self._kept_view(rng, lock) if _trusts_snapshot(lock, pending, hot) else None
        if kept is not None:
            got = self._decide_all(kept, pending, hot, snapshot=True)
            if not _lacking(got, pending):
                return kept, got, True
            if lock is not None and (got.stale or _failed_add(pending)):
                lock.seen_foreign(HOT_SECONDS)
        else:
            reread = reread or any(op.rewrites for op in pending)  # a write of theirs failed: as stored
            floor = "" if lock is None or reread else lock.floor()
            view, got = self._decide_fresh(rng, self._view(rng, floor), pending, hot)
            if not floor or not _lacking(got, pending):
                return view, got, False
            # an ADD failed or a DEL found nothing on the cached read: what it lacked may be newer than
            # the cache (written outside this node's lock): decide again on the pool as stored
        if got.stale or _failed_add(pending):
            for op, n in zip(pending, before, strict=True):
                op.claims.lost = n
            _undecide(pending, failed=True)
        else:
            _undecide(pending)
        view = self._view(rng)  # stale, or a DEL found nothing in the snapshot: the pool as stored
        return view, self._decide_all(view, [op for op in pending if not op.done], hot), False

    def _decide_fresh(
        self, rng: IPRange, view: PoolView, pending: list[Op], hot: bool | None
    ) -> tuple[PoolView, Pass]:
        """Decide on a pool read from the store. On a pool other nodes write too (`hot`) and a store
        that checks whole versions, when the pass created reservations: decided again on the pool read
        again if it moved meanwhile (see _step)."""
        got = self._decide_all(view, pending, hot)
        if hot and got.claimed and not self.store.merges:
            again = self._view(rng)
            if again.version != view.version:
                _undecide(pending)
                return again, self._decide_all(again, [op for op in pending if not op.done], hot)
        return view, got

    def _from_queue(
        self, lock: nodelock.Held | None, ticket: nodequeue.Ticket | None, pending: int
    ) -> nodequeue.Taken | None:
        """Under the node lock, a plugin process (`ticket`): None when another holder decided its ops
        already (its request withdrawn); else, after pacing its write, the ops of the node's other
        calls it takes into its batch. Nothing to take elsewhere. Without the lock (its holder is a
        stopped process: ipam.nodelock) the call withdraws its request at once, taking an outcome a
        holder left before, if any: no holder can serve it while the lock is held by the stopped one."""
        if ticket is None:
            return nodequeue.Taken()
        if lock is None:
            done = ticket.answered()
            ticket.close()
            return None if done else nodequeue.Taken()
        if ticket.answered():
            ticket.close()
            return None
        _pace(lock)
        taken = nodequeue.take(ticket, batch.MAX_BATCH - pending)
        for op in taken.ops:
            op.started = op.begun = self.retry.clock()
        return taken

    def _done(
        self, lock: nodelock.Held | None, ticket: nodequeue.Ticket | None, decided: list[Op],
        taken: nodequeue.Taken,
    ) -> None:  # fmt: skip
        """After a successful write: the ops decided are done, the other calls' ops answered, and a
        plugin process' own request withdrawn (under the lock: no holder takes it after this)."""
        if lock is not None and ticket is not None:  # the agent remembers in memory (the store's)
            self._remember(lock, decided)
        for op in decided:  # the agent's DELs: written once their reservations are released too
            if op.kind == "add" or not batch.sharing():
                op.to(batch.WRITTEN)
        taken.answer()
        if lock is not None and ticket is not None and all(op.done for op in ticket.ops):
            ticket.close()

    def _remember(self, lock: nodelock.Held, decided: list[Op]) -> None:
        """Keep beside the node lock the reservations this write's ADDs created (their versions), and
        hand each DEL the versions of the reservations it freed: its process deletes them with that
        version as a precondition instead of reading them first (a plugin process knows nothing of
        the ADD's process). Only a hint: a reservation changed since is a Conflict, then read."""
        if not any(op.overlapping for op in decided):
            return
        known = lock.reservations()
        changed = False
        for op in decided:
            if not op.overlapping:
                continue
            if op.kind == "add":
                res = self.reservation_name(op.rng, op.offsets[0])
                if res in op.claims.created:
                    known[res] = [op.claims.created[res], *op.owner]
                    changed = True
                continue
            for offset, held in op.freed:
                res = self.reservation_name(op.rng, offset)
                entry = known.pop(res, None)
                changed = changed or entry is not None
                whole = isinstance(entry, list) and len(entry) == 7
                if entry and whole and Allocation(*map(str, entry[1:])).same_attachment(held):
                    op.known[res] = str(entry[0])
        if changed:
            lock.keep_reservations(known)

    def _kept_view(self, rng: IPRange, lock: nodelock.Held | None) -> PoolView | None:
        """The pool as the previous writer on this node left it (see _step), if usable."""
        data = lock.load() if lock is not None else None
        pool = self.store.restore(data) if data is not None else None
        if not isinstance(pool, Pool) or not _same_network(pool.range, rng):
            return None
        return SnapshotView(pool)

    def _keep_view(self, lock: nodelock.Held | None, name: str, version: str | None) -> None:
        if lock is not None and version is not None:
            lock.save(self.store.snapshot(name, version))
            lock.keep_floor(version)

    def _decide_all(
        self, view: PoolView, pending: list[Op], hot: bool | None, snapshot: bool = False,
        changes: BatchView | None = None,
    ) -> Pass:  # fmt: skip
        """Decide every op on `view` (after the decisions already in `changes`, if given). An op's own
        failure is final for it. On the node's `snapshot`, the pass stops as soon as a candidate's
        reservation shows the snapshot out of date (Pass.stale: decide on the pool as stored)."""
        done = Pass(changes if changes is not None else BatchView(view))
        created = sum(len(op.claims.created) for op in pending)
        for op in pending:
            try:
                if op.kind == "del":  # the entries as stored (reservations follow them)
                    freed = decide.one(done.changes, decide.Del(op.owner), ())
                    assert isinstance(freed, decide.Freed)
                    op.freed = freed.offsets
                elif not self._decide_add(op, done.changes, hot, snapshot):
                    done.stale = True
                    break
            except (StoreUnavailable, Conflict):
                raise
            except CniError as e:  # this op's own failure (pool exhausted, candidates keep going)
                op.to(batch.FAILED, e)
                continue
            op.to(batch.DECIDED)
            done.decided.append(op)
        done.claimed = sum(len(op.claims.created) for op in pending) > created
        return done

    def _decide_add(
        self, op: Op, changes: BatchView, hot: bool | None = None, snapshot: bool = False
    ) -> bool:
        """Decide an ADD through the core (ipam.decide) until it needs no claim that is refused: each
        refused claim blocks that offset and the core decides again (a lost race: the batch's other ops
        keep off it too). False, undecided: on the node's `snapshot`, a candidate reserved by a racer
        after it was taken (the snapshot is stale). Its own failure (the pool full, a requested address
        taken, candidates taken again and again) is raised."""
        if op.told and op.offsets:  # answered before its write: it keeps that address, or nothing
            self._decide_answered(op, changes)
            return True
        segments = allocator.segments_as_offsets(op.rng)
        while True:
            outcome = decide.add(changes, self._wanted(op, hot, segments), segments)
            decision = allocator.decision(op.rng, changes, op.owner, outcome)  # full, or a request refused
            assert isinstance(outcome, decide.Took)  # (decision() raised for any other)
            if outcome.claim:
                lost, blocked = op.claims.lost, len(op.claims.blocked)
                if not self.reservations.claim(op, decision, changes.version):
                    if snapshot and op.claims.lost > lost and op.want is None:
                        return False  # reserved after the snapshot was taken: read the pool
                    self._refused(op, changes, decision.offset, lost, blocked)
                    continue
                faults.point("store-reserve")  # tests: the address reserved, the pool not yet written
            decide.apply(changes, outcome, op.owner, self.lean)
            op.offsets = [decision.offset]
            return True

    def _wanted(self, op: Op, hot: bool | None, segments: list[tuple[int, int]]) -> decide.Add:
        """What the core is asked for an ADD. Stores that serialise writers (exclusive()) never lose
        races: the lowest free address there; after lost races, one of the lowest few (`spread`); on a
        pool other nodes are racing on (`hot`), the lowest free after a random point of the range, so
        the nodes' writers stop meeting on the same few lowest addresses."""
        serial = self.store.serial
        scatter = not serial and hot is not None and (hot or op.claims.lost > 0)
        width = 1 if serial or scatter else spread(op.claims)
        if op.want is not None and op.want in op.claims.holders:  # refused by its reservation before
            raise allocator.taken(op.rng, op.want, op.claims.holders[op.want],
                                  f"reservation {self.reservation_name(op.rng, op.want)}")  # fmt: skip
        return decide.Add(
            op.owner, tuple(sorted(op.claims.mine.values())), frozenset(op.claims.blocked),
            claims=op.overlapping, spread=width, pick=self.retry.rand() if width > 1 else 0.0,
            start=decide.scatter(segments, self.retry.rand()) if scatter else None, want=op.want,
        )  # fmt: skip

    def _refused(self, op: Op, changes: BatchView, offset: int, lost: int, blocked: int) -> None:
        """A claim of `offset` refused (Reservations.claim): progress when it was a race lost (the
        batch's other ops keep off it too) or an address held for good (one fewer to walk); the op gives
        up once none is made for the retry policy's deadline, or its limit is reached."""
        if op.want is not None and op.want in op.claims.holders:  # reserved for another attachment
            name = self.reservation_name(op.rng, op.want)
            raise allocator.taken(op.rng, op.want, op.claims.holders[op.want], f"reservation {name}")
        if op.claims.lost > lost:
            op.started = self.retry.clock()  # lost to a racer: progress elsewhere
            changes.hold(offset)  # and no other op of this batch tries it again
        elif len(op.claims.blocked) > blocked:  # held for good (another network): one
            op.started = self.retry.clock()  # address fewer to walk, a bounded walk
        now = self.retry.clock()
        if now - op.started > self.retry.deadline or now - op.begun > self.retry.limit:
            raise TryAgainError(
                f"allocating in {op.rng.cidr}: gave up: candidates keep being taken elsewhere"
            )

    def _decide_answered(self, op: Op, changes: BatchView) -> None:
        """An ADD answered before its pool write, decided again after the write failed: its address
        again (its reservation is this call's: no request). Should the pool now give that address to
        another entry (a writer that ignores reservations), the entry is not written: said in the log,
        the reservation still holds the address for the attachment that was told it."""
        want = op.offsets[0]
        segments = allocator.segments_as_offsets(op.rng)
        outcome = decide.one(changes, decide.Add(op.owner, answered=want), segments, self.lean)
        if isinstance(outcome, decide.Displaced):
            log.error("%s %s: %s was answered, but pool %s now holds it for another entry: not written",
                      op.owner.container_id, op.owner.ifname, op.rng.address(want), changes.name)  # fmt: skip

    # ---- ADD --------------------------------------------------------------------------------------

    def add(self, owner: Allocation, want: Mapping[int, int] | None = None) -> list[tuple[IPRange, int]]:
        """One address per range (`want`: the requested offset of a range, by its index in conf.ranges:
        exactly that one, ipam.requested); on failure the ranges already done are released again."""
        done: list[tuple[IPRange, int]] = []
        want = want or {}
        try:
            for i, rng in enumerate(self.conf.ranges):
                done.append((rng, self._add_range(rng, owner, want.get(i))))
        except BaseException:
            for rng, _ in reversed(done):
                try:
                    self._delete_range(rng, owner)
                except CniError as e:
                    log.error("rollback of %s in %s failed: %s", owner.container_id, rng.cidr, e)
            raise
        return done

    def _add_range(self, rng: IPRange, owner: Allocation, want: int | None = None) -> int:
        op = Op("add", rng, owner, self.conf.overlapping, want=want)
        keep = ""
        try:
            self._run([op])
            offset = op.offsets[0]
            keep = self.reservation_name(rng, offset) if self.conf.overlapping else ""
            return offset
        finally:
            self.reservations.drop(op.claims, keep, owner)

    # ---- DEL --------------------------------------------------------------------------------------

    def delete(self, owner: Allocation) -> None:
        """Release this attachment in every range; an unknown owner is success."""
        missing = [rng for rng in self.conf.ranges if not self._delete_range(rng, owner)]
        if missing and self.conf.overlapping and not self.store.serial:
            self.reservations.sweep(owner)

    def _delete_range(self, rng: IPRange, owner: Allocation) -> bool:
        """Release one range; False when the pool held nothing of this attachment."""
        op = Op("del", rng, owner, self.conf.overlapping)
        self._run([op])
        if not batch.sharing():  # the agent's batch released them after its write (_release_freed)
            self._release(op)
        return bool(op.freed or op.sent)

    def _release(self, op: Op) -> None:
        """The reservations of the entries a DEL freed (overlapping ranges), after its pool write: a
        batch that fails on the way releases them again (idempotent)."""
        if op.overlapping:
            for offset, held in op.freed + [f for f in op.sent if f not in op.freed]:
                name = self.reservation_name(op.rng, offset)
                hint = Reservation(name, held, op.known[name]) if name in op.known else None
                self.reservations.release(name, functools.partial(reserved_for, held=held), hint)

    def _release_freed(self, group: list[Op]) -> None:
        """In the agent, the batch's DELs release their reservations before the batch ends: its callers
        then return together and their next calls meet in the next batch (a DEL's write is only the
        PATCH; releases in each caller's own thread after it staggered the arrivals), and the batch's
        duration, which paces the next write, includes them: each DEL is written once they are. An op's
        failure is its own."""
        for op in group:
            if op.kind == "del" and op.state in (batch.DECIDED, batch.ANSWERED):
                try:
                    self._release(op)
                except CniError as e:
                    op.to(batch.FAILED, e)
                    continue
                op.to(batch.WRITTEN)

    def _release_where(
        self, rng: IPRange, doomed: Callable[[Allocation], bool], extras: Mapping[Attachment, Allocation]
    ) -> list[int]:
        """Remove every allocation `doomed` picks from one pool (GC: reads the whole pool), an entry
        without extras judged by its reservation's (`extras`): through the decision core, written with
        compare-and-swap and retried (ipam.removal)."""

        def pick(pool: Pool) -> list[tuple[str, Allocation]]:
            return [(k, a) for k, a in pool.allocations.items() if doomed(joined(a, extras))]

        name = self.pool_name(rng)
        freed = removal.remove(self.store, name, pick, self.retry, f"GC in {rng.cidr}", atomic=self._atomic)
        return [int(k) for k, _ in freed if k.isdigit()]

    # ---- CHECK / GC -------------------------------------------------------------------------------

    def _settle(self, rng: IPRange) -> None:
        """The agent: the pool's answered calls written before it is read for CHECK or GC."""
        if self.defers and batch.sharing():
            batch.combiner((self.identity, self.pool_name(rng))).settle()

    def check(self, owner: Allocation, want: Mapping[int, int] | None = None) -> None:
        """The attachment's entry (and reservation) in every range; `want` (ipam.requested): at exactly
        the requested offset of a range, by its index."""
        for i, rng in enumerate(self.conf.ranges):
            self._settle(rng)
            with self._atomic():
                hit = allocator.find(self._view(rng), owner)
            if hit is None:
                raise CheckError(
                    f"no allocation for container {owner.container_id} {owner.ifname} in "
                    f"pool {self.pool_name(rng)}"
                )
            if want and i in want and int(hit[0]) != want[i]:
                raise CheckError(
                    f"container {owner.container_id} {owner.ifname} holds {rng.address(int(hit[0]))}, "
                    f"not the requested {rng.address(want[i])}"
                )
            if self.conf.overlapping:
                res = self.store.get_reservation(self.reservation_name(rng, int(hit[0])))
                if res is None or not res.owner.same_attachment(owner):
                    raise CheckError(
                        f"{rng.address(int(hit[0]))}: reservation missing or held by another owner"
                    )

    def gc(self, network: str, node: str, valid: set[tuple[str, str]]) -> None:
        """Release allocations and reservations recorded for this network and node whose attachment
        is not in `valid`. Unrecorded network or node (older writers): left alone."""

        def stale(a: Allocation) -> bool:
            return a.network == network and a.node == node and (a.container_id, a.ifname) not in valid

        errors: list[CniError] = []
        owners: dict[str, Allocation] = {}
        if self.conf.overlapping:  # listed first: pool entries without extras are judged by them
            try:
                owners = {r.name: r.owner for r in self.store.iter_reservations()}
            except CniError as e:
                errors.append(e)
        extras = by_attachment(owners.values())
        for rng in self.conf.ranges:
            self._settle(rng)
            try:
                self._release_where(rng, stale, extras)
            except CniError as e:
                errors.append(e)
        if self.conf.overlapping and owners:
            try:
                doomed = [name for name, owner in owners.items() if stale(owner)]
                for name in doomed:
                    if not self.reservations.held(name):
                        self.reservations.release(name, stale)
            except CniError as e:
                errors.append(e)
        if errors:
            raise CniError("GC: " + "; ".join(e.msg for e in errors), code=int(errors[0].code))


class _Tries:
    """One batch across its attempts (ipam.retry): `reread` once a write of it failed (every attempt
    after it reads the pool as stored: a cached read may not hold what that write met)."""

    reread = False


def _undecide(ops: list[Op], failed: bool = False) -> None:
    """The decisions of `ops` void (their view was stale, or an attempt failed): pending again; with
    `failed`, also the failures met on that view."""
    for op in ops:
        if op.state in (batch.DECIDED, batch.ANSWERED) or (failed and op.state == batch.FAILED):
            op.to(batch.PENDING)


class Pass:
    """One pass of decisions over ops (Engine._decide_all): the changes, the ops decided, whether any
    reservation was created on the way, and whether it stopped on a snapshot found `stale`."""

    def __init__(self, changes: BatchView) -> None:
        self.changes = changes
        self.decided: list[Op] = []
        self.claimed = False
        self.stale = False


def _trusts_snapshot(lock: nodelock.Held | None, pending: list[Op], hot: bool | None) -> bool:
    """Whether the batch may start from the node's snapshot (see Engine._decide_batch)."""
    adds = any(op.kind == "add" for op in pending)
    return not adds or (lock is not None and not hot and not lock.foreign())


def _failed_add(pending: list[Op]) -> bool:
    return any(op.kind == "add" and op.state == batch.FAILED for op in pending)


def _lacking(got: Pass, pending: list[Op]) -> bool:
    """The view a pass decided on may lack newer writes: it stopped stale, an ADD failed on it, or a DEL
    found nothing on it."""
    return got.stale or _failed_add(pending) or any(op.kind == "del" and not op.freed for op in got.decided)


def _pace(lock: nodelock.Held) -> None:
    """A plugin process holding the node lock waits as the agent's combiner does (batch.PACE): the
    node's calls that arrive meanwhile queue behind the lock and join this write (ipam.nodequeue)."""
    gap = batch.pace_gap(*lock.last_write())
    if gap > 0:
        time.sleep(gap)


def _withdraw(ticket: nodequeue.Ticket, path: str) -> None:
    """Withdraw a request under the node lock, taking the outcome a holder left for it, if any."""
    try:
        with nodelock.held(path) as lock:
            if lock is not None:
                ticket.answered()
            ticket.close()
    except CniError as e:  # a hung holder: the call's own error is what it answers
        log.warning("node queue: request withdrawn without the lock: %s", e)
    finally:
        ticket.close()


def _same_network(stored: str, rng: IPRange) -> bool:
    """spec.range as written by us or upstream (host bits set or not) names the same network."""
    try:
        return ipaddress.ip_network(stored, strict=False) == rng.network
    except ValueError:
        return False
