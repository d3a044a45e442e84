"""load -> allocate/release -> commit with compare-and-swap; conflicts retried with jittered backoff under a
deadline; an unreachable store is code 11 (after a short grace), never silence.

Overlapping ranges (one reservation per IP, cluster-wide): on ADD the reservation is claimed BEFORE the
pool is written, so no two pools can commit the same IP; on DEL the pool is released first and the
reservation after. A crash between the two steps leaves at worst a reservation without a pool entry
(an address parked, never one handed out twice); the same owner's next ADD reuses it, its DEL frees it
(ipam.reservations: Reservations.sweep), and GC and the reconciler free it once the owner is gone.

The engine runs each range's ops with the executor it was built with (`execute`): a plugin process' own
(ipam.exec_plain, the default) or the agent's (ipam.batch: the calls of one pool that arrive while a write
is in flight share the next one), chosen once where the engine is built (ipam.plugin.EXECUTE, set by the
agent at its start). A call is answered once its pool write is done, in both."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Mapping, Set

from cni import log
from cni.errors import CheckError, CniError, Code
from ipam import allocator, exec_plain, nodelock, removal
from ipam.allocator import SnapshotView
from ipam.config import IpamConfig
from ipam.model import Allocation, Attachment, Pool, PoolUpdate, PoolView, by_attachment, joined
from ipam.operation import Op, Unanswered
from ipam.ranges import IPRange, same_network
from ipam.reservations import Reservations, reserved_for
from ipam.retry import Retry
from ipam.store.base import Store
from ipam.store.names import pool_name

CLUSTER_STORES = ("kubernetes", "etcd")


type Execute = Callable[["Engine", list[Op]], None]


class Engine:
    def __init__(
        self, store: Store, conf: IpamConfig, retry: Retry | None = None,
        reopen: Callable[[], contextlib.AbstractContextManager[Store]] | None = None,
        execute: Execute = exec_plain.run,
    ) -> None:  # fmt: skip
        """`reopen`: a handle of the store for the agent's batch thread (default: a handle of conf.store
        from ipam.store.handles, warm in the agent); `execute`: how ops run (module docstring)."""
        self.store, self.conf, self.retry = store, conf, retry or Retry()
        self.reopen, self.execute = reopen, execute
        s = conf.store
        self.identity = f"{s.datastore}|{s.kubernetes.kubeconfig}|{s.etcd.host}|{s.local_db}"
        cluster = s.datastore in CLUSTER_STORES
        self.lock_dir = os.path.join(os.path.dirname(s.local_db), "pool-locks") if cluster else ""
        self.reservations = Reservations(store, conf, self.retry, self.pool_name, self.atomic)

    def on(self, store: Store) -> Engine:
        """This engine on another handle of its store (the agent's batch thread has its own)."""
        return type(self)(store, self.conf, self.retry, self.reopen, self.execute)

    def lean_for(self, op: Op) -> bool:
        """Whether `op`'s pool entry is written without extras (its reservation carries them). Pool
        entries without pycni's extras (pod UID, network, node) where every entry's reservation carries
        them: on the Kubernetes store they are a per-entry annotation of the pool object, which every
        write of it pays for (docs/benchmarks.md); readers join them back (ipam.model.joined). Node
        slices too: a slice pool has one writer, but each of its writes still pays for its size. Decided
        per op: a batch of the agent may hold ops of configurations that differ in overlapping."""
        return op.overlapping and self.conf.store.datastore == "kubernetes"

    def pool_name(self, rng: IPRange) -> str:
        return rng.pool or pool_name(rng.cidr, self.conf.network_name)

    def reservation_name(self, rng: IPRange, offset: int) -> str:
        return self.reservations.name(rng, offset)

    def view(self, rng: IPRange, floor: str = "") -> PoolView:
        """The pool as allocation sees it: the store's own view (inside `exclusive()`), else a snapshot
        (with a `floor` version: possibly from a cache, at least that new)."""
        name = self.pool_name(rng)
        view: PoolView | None = self.store.view_pool(name)
        if view is None:
            pool = self.store.recent_pool(name, floor) if floor else self.store.get_pool(name)
            view = None if pool is None else SnapshotView(pool)
        if view is None:
            return SnapshotView(Pool(name, rng.cidr))
        if not same_network(view.range, rng):
            raise CniError(
                f"pool {name} holds range {view.range!r}, expected {rng.cidr}", code=Code.INVALID_CONFIG
            )
        return view

    def commit(self, view: PoolView, update: PoolUpdate) -> str:
        return self.store.commit_pool(Pool(view.name, view.range, {}, view.version), update)

    def post(self, view: PoolView, update: PoolUpdate) -> Callable[[], str] | None:
        """The write begun, to be awaited outside the node lock (Store.post_pool); None: commit it."""
        if view.version is None:
            return None
        return self.store.post_pool(Pool(view.name, view.range, {}, view.version), update)

    def atomic(
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
        """Run ops of one range (one pool) to completion with this engine's executor; raise an op's own
        error."""
        now = self.retry.clock()
        for op in ops:
            op.started = op.begun = now
        self.execute(self, ops)
        for op in ops:
            if op.error is not None:
                raise op.error

    # ---- ADD --------------------------------------------------------------------------------------

    def add(
        self, owner: Allocation, want: Mapping[int, int] | None = None, held: Set[int] = frozenset()
    ) -> list[tuple[IPRange, int]]:
        """One address per range (`want`: the requested offset of a range, by its index in conf.ranges:
        exactly that one, ipam.requested); on failure the ranges already done are released again, but
        those in `held` (indexes: the address an IPAMClaim holds beyond this call, ipam.claims)."""
        done: list[tuple[int, IPRange, int]] = []
        want = want or {}
        try:
            for i, rng in enumerate(self.conf.ranges):
                done.append((i, rng, self._add_range(rng, owner, want.get(i))))
        except BaseException:
            for i, rng, _ in reversed(done):
                if i in held:
                    continue
                try:
                    self._delete_range(rng, owner)
                except CniError as e:
                    log.error("rollback of %s in %s failed: %s", owner.container_id, rng.cidr, e)
            raise
        return [(rng, offset) for _, rng, offset in done]

    def _add_range(self, rng: IPRange, owner: Allocation, want: int | None = None) -> int:
        op = Op("add", rng, owner, self.conf.overlapping, want=want)
        keep = ""
        try:
            self._run([op])
            offset = op.offsets[0]
            keep = self.reservation_name(rng, offset) if self.conf.overlapping else ""
            return offset
        except Unanswered as e:
            if e.held:  # a batch under way still holds the op: its claims are that batch's
                op = Op("add", rng, owner, self.conf.overlapping)
            raise
        finally:
            self.reservations.drop(op.claims, keep, owner, rng)

    # ---- DEL --------------------------------------------------------------------------------------

    def delete(self, owner: Allocation) -> None:
        """Release this attachment in every range; an unknown owner is success."""
        missing = [rng for rng in self.conf.ranges if not self._delete_range(rng, owner)]
        if missing and self.conf.overlapping and not self.store.serial:
            self.reservations.sweep(owner)

    def _delete_range(self, rng: IPRange, owner: Allocation) -> bool:
        """Release one range; False when the pool held nothing of this attachment."""
        op = Op("del", rng, owner, self.conf.overlapping)
        self._run([op])  # (its reservations released after its write, by the executor)
        return bool(op.freed or op.sent)

    def release(self, op: Op) -> None:
        """The reservations of the entries a DEL freed (overlapping ranges), after its pool write: a
        batch that fails on the way releases them again (idempotent)."""
        if op.overlapping:
            for offset, held in op.freed + [f for f in op.sent if f not in op.freed]:
                name = self.reservation_name(op.rng, offset)
                self.reservations.release(name, functools.partial(reserved_for, held=held))

    def _release_where(
        self, rng: IPRange, doomed: Callable[[Allocation], bool], extras: Mapping[Attachment, Allocation]
    ) -> list[int]:
        """Remove every allocation `doomed` picks from one pool (GC: reads the whole pool), an entry
        without extras judged by its reservation's (`extras`): through the decision core, written with
        compare-and-swap and retried (ipam.removal)."""

        def pick(pool: Pool) -> list[tuple[str, Allocation]]:
            return [(k, a) for k, a in pool.allocations.items() if doomed(joined(a, extras))]

        name = self.pool_name(rng)
        freed = removal.remove(self.store, name, pick, self.retry, f"GC in {rng.cidr}", atomic=self.atomic)
        return [int(k) for k, _ in freed if k.isdigit()]

    # ---- CHECK / GC -------------------------------------------------------------------------------

    def check(self, owner: Allocation, want: Mapping[int, int] | None = None) -> None:
        """The attachment's entry (and reservation) in every range; `want` (ipam.requested): at exactly
        the requested offset of a range, by its index."""
        for i, rng in enumerate(self.conf.ranges):
            with self.atomic():
                hit = allocator.find(self.view(rng), owner)
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

    def _release_unheld(self, doomed: list[str], stale: Callable[[Allocation], bool]) -> None:
        """GC: the reservations in `doomed` that no pool entry holds, released (if still `stale`)."""
        for name in doomed:
            if not self.reservations.held(name):
                self.reservations.release(name, stale)

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
            try:
                self._release_where(rng, stale, extras)
            except CniError as e:
                errors.append(e)
        if self.conf.overlapping and owners:
            try:
                self._release_unheld([name for name, owner in owners.items() if stale(owner)], stale)
            except CniError as e:
                errors.append(e)
        if errors:
            raise CniError("GC: " + "; ".join(e.msg for e in errors), code=int(errors[0].code))
