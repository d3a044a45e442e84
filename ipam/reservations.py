"""The cluster-wide reservation of each address (OverlappingRangeIPReservation, one object per IP) as the
engine (ipam.engine) keeps it beside its pools when enable_overlapping_ranges is on: claimed before a
pool write on ADD, released after it on DEL, taken over for the same pod interface (a kubelet re-ADD,
upstream's reservations without a container id), and swept when a pool no longer holds it."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from contextlib import AbstractContextManager

from cni import jsonio, log
from cni.errors import CniError
from ipam import allocator
from ipam.config import IpamConfig
from ipam.model import Allocation, Reservation
from ipam.operation import Claims, Op
from ipam.ranges import IPRange
from ipam.retry import Retry, retrying
from ipam.store.base import Conflict, Store, StoreUnavailable
from ipam.store.names import reservation_address, reservation_name

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

    from ipam.model import PoolView
    from ipam.nodelock import Held


class Reservations:
    """The reservations of one configuration on one store. `pool_name` names a range's pool, `atomic`
    opens one attempt's unit (the store's exclusive(), else nothing)."""

    def __init__(
        self, store: Store, conf: IpamConfig, retry: Retry, pool_name: Callable[[IPRange], str],
        atomic: Callable[..., AbstractContextManager[Any]],
    ) -> None:  # fmt: skip
        self.store, self.conf, self.retry = store, conf, retry
        self.pool_name, self.atomic = pool_name, atomic

    def name(self, rng: IPRange, offset: int) -> str:
        return reservation_name(str(rng.address(offset)), self.conf.network_name)

    def claim(self, op: Op, decision: allocator.Decision, pool_version: str | None = None) -> bool:
        """The cluster-wide reservation of the decided address: created (POST first: one request when it
        is free), kept when this attachment holds it, taken over for the same pod and interface: True.
        False: the op decides again; a candidate held by someone else is blocked (op.claims says who
        holds it and whether that was a race lost), one deleted or changed meanwhile is judged again.
        A create that gets no answer (StoreUnavailable: the server may have applied it) is recorded in
        `claims.maybe` and raised: found later naming this attachment, it is this op's as if answered
        (`created`, `mine`); not kept, `drop` deletes it."""
        rng, owner, claims = op.rng, op.owner, op.claims
        name = self.name(rng, decision.offset)
        if claims.mine.get(name) == decision.offset:
            return True  # created by this call (a lost pool commit leaves it ours): not read again
        try:
            claims.created[name] = self.store.put_reservation(Reservation(name, owner))
            claims.mine[name] = decision.offset
            if claims.maybe:
                claims.maybe.pop(name, None)  # (the earlier create was not applied)
            return True
        except Conflict:  # it exists: whose is it?
            res = self.store.get_reservation(name)
        except StoreUnavailable:  # no answer: created or not, the ADD's end knows (drop)
            claims.maybe[name] = decision.offset
            raise
        if res is None:  # deleted since: judged again at once
            return False
        if res.owner.same_attachment(owner):
            if name in claims.maybe and res.version is not None:  # our create, applied unanswered
                claims.created[name], claims.mine[name] = res.version, claims.maybe.pop(name)
            return True
        claims.maybe.pop(name, None)  # another's: a create of ours still on its way would be refused
        if res.owner.same_pod_interface(owner) or legacy_same_pod(res.owner, owner):
            try:
                version = self.store.put_reservation(Reservation(name, owner, res.version))
            except Conflict:
                return False
            if name in claims.created:
                claims.created[name] = version
        elif decision.kind == "new":
            claims.blocked.add(decision.offset)
            claims.holders[decision.offset] = res.owner
            same_network = bool(res.owner.network) and res.owner.network == owner.network
            if same_network or newer(res.version, pool_version):
                claims.lost += 1  # a racer (a reservation older than the pool we read: a steady block)
            return False
        else:
            log.error(
                "%s: pool %s gives it to %s/%s but reservation %s names %s/%s",
                rng.address(decision.offset),
                self.pool_name(rng),
                owner.container_id,
                owner.ifname,
                name,
                res.owner.container_id,
                res.owner.ifname,
            )
        return True

    def drop(self, claims: Claims, keep: str, owner: Allocation, rng: IPRange | None = None) -> None:
        """Reservations this call created for candidates it did not end up with: those it knows it
        created (deleted if still at the version it wrote), and those whose create got no answer and
        that were not found since (`claims.maybe`: deleted if they exist naming this attachment, at the
        version read). Those it cannot delete now (the store out of reach) are left in the pool's node
        lock (`rng`'s) as a dead holder's claims: the next call on the pool on this node frees them."""
        left: list[tuple[str, int]] = []
        for name, version in claims.created.items():
            if name == keep:
                continue
            try:
                res = self.store.get_reservation(name)
                if res is not None and res.version == version and res.owner.same_attachment(owner):
                    self.store.delete_reservation(res)
            except CniError as e:
                log.warning("reservation %s left behind: %s", name, e)
                left.append((name, claims.mine.get(name, -1)))
        for name in claims.maybe:
            if name == keep or name in claims.created:
                continue
            try:
                res = self.store.get_reservation(name)
                if res is not None and res.owner.same_attachment(owner):
                    log.info("reservation %s: created for %s/%s unanswered, not kept: released", name,
                             owner.container_id, owner.ifname)  # fmt: skip
                    self.store.delete_reservation(res)
            except CniError as e:
                log.warning("reservation %s (created unanswered) left behind: %s", name, e)
                left.append((name, claims.maybe[name]))
        if left and rng is not None:
            self._leave(rng, owner, [(n, o) for n, o in left if o >= 0])

    def _leave(self, rng: IPRange, owner: Allocation, left: list[tuple[str, int]]) -> None:
        """Claims `owner` could not drop, noted in the pool's node lock for its next holder (free_left)."""
        try:
            with self.atomic(self.pool_name(rng), owner.node) as lock:
                if lock is None:
                    raise OSError("no node lock")
                for name, offset in left:
                    lock.leave(_note(name, offset, owner))
        except OSError as e:
            log.warning("reservations %s of %s/%s left to DEL, GC and the reconciler: %s",
                        ", ".join(n for n, _ in left), owner.container_id, owner.ifname, e)  # fmt: skip

    def sweep(self, owner: Allocation) -> None:
        """A pool without this attachment may still leave its reservation behind: an ADD killed between
        claiming the address and writing the pool (on a store without exclusive(), the two writes are
        separate). Free every reservation this attachment holds. Costs a paged list of the
        reservations, so only a DEL that found nothing in some pool pays it (a repeated DEL, or the DEL
        after a crashed ADD)."""
        names = retrying(self.retry,
            "listing reservations",
            lambda: [r.name for r in self.store.iter_reservations() if r.owner.same_attachment(owner)],
        )
        for name in names:
            if self.held(name):
                continue
            log.info("reservation %s of %s/%s has no pool entry: released", name, owner.container_id,
                     owner.ifname)
            self.release(name, owner.same_attachment)

    def held(self, name: str) -> bool:
        """Whether a pool of this configuration holds the address reservation `name` names. Then the
        reservation is not an orphan but the claim of that entry, even when it names another container:
        upstream whereabouts takes an entry over for a kubelet re-ADD (new container id) and leaves
        the reservation as it was. Reads the pools; only DEL's sweep and GC ask, for few names."""
        for rng in self.conf.ranges:
            ip = reservation_address(name, self.conf.network_name, rng.version)
            if ip is None or ipaddress.ip_address(ip) not in rng.network:
                continue
            read = functools.partial(self.store.get_pool, self.pool_name(rng))
            pool = retrying(self.retry, f"reading {self.pool_name(rng)}", read)
            if pool is not None and str(rng.offset(ipaddress.ip_address(ip))) in pool.allocations:
                return True
        return False

    def release(self, name: str, doomed: Callable[[Allocation], bool]) -> None:
        """Delete reservation `name` if `doomed` says so of its owner: with the version this process
        knows (the store's memory: the agent) as a precondition, else read first."""
        res = self.store.known_reservation(name)
        if res is not None and doomed(res.owner):
            try:  # as this process last wrote or read it: deleted if it is still that version
                self.store.delete_reservation(res)
                return
            except (Conflict, StoreUnavailable):
                pass  # changed since, or no answer (deleted or not): judged on the stored one, retried

        def attempt() -> None:
            with self.atomic():
                res = self.store.get_reservation(name)
                if res is not None and doomed(res.owner):
                    self.store.delete_reservation(res)

        retrying(self.retry, f"releasing reservation {name}", attempt)


def reserved_for(res: Allocation, held: Allocation) -> bool:
    """Whether a reservation (its owner `res`) belongs to the pool entry `held` that a DEL just freed,
    so the DEL frees it too: the same attachment; or the same pod interface, whatever container id the
    reservation names, because upstream whereabouts writes reservations without one and, when it takes
    an entry over for a re-ADD (new container id), leaves the reservation as it was. A reservation of
    another pod or interface is never touched."""
    return res.same_attachment(held) or held.same_pod_interface(res) or legacy_same_pod(res, held)


def newer(version: str | None, than: str | None) -> bool:
    """Whether object version `version` was written after `than`. Kubernetes resourceVersions and etcd
    mod_revisions are one cluster-wide counter: a reservation newer than the pool we read belongs to a
    call in flight, not to an allocation the pool (or another pool) already held. Only a hint for
    spreading candidates, never for correctness: unparsable versions say no."""
    try:
        return version is not None and than is not None and int(version) > int(than)
    except ValueError:
        return False


def legacy_same_pod(held: Allocation, owner: Allocation) -> bool:
    """A reservation written by upstream whereabouts (no container id) for the same pod."""
    return (
        not held.container_id
        and bool(owner.podref)
        and held.podref == owner.podref
        and held.ifname in ("", owner.ifname)
    )


# ---- a killed ADD's reservation --------------------------------------------------------------------
# What an ADD killed between its reservation and its pool write left: found and freed by the next call
# on that pool on the node (the retried ADD, or any other).
#
# An ADD on a cluster store claims an address's reservation (OverlappingRangeIPReservation: POST) before
# it writes the pool, two separate writes; killed between them (SIGKILL, an OOM kill of the process that
# runs it), it leaves a reservation that no pool entry holds: the address is parked, never handed out
# twice. Its retry cannot find it by asking the store without a list of every reservation (a call cannot
# tell a retry from a first ADD, and a reservation's name is its address), and it would not always pick
# that address again (lower ones freed meanwhile). So the one who knows is the node lock of the pool
# (ipam.nodelock): every claim is noted in the lock file before its POST and the note is taken off when
# the lock is released; a note found when the lock is taken is a dead holder's (each attempt notes again
# the op's claims: those it made, and those whose POST got no answer, Claims.maybe: they may exist). The
# new holder frees the reservation it names when the pool does not hold that address and the reservation
# still names the noted attachment (compare-and-swap on its version: one taken over meanwhile stays). The
# killed ADD never answered, so nobody uses the address: the retried ADD needs nothing of it, and
# allocates as any ADD.
#
# Cost: on every claim one write to the lock file (a page-cache write, no fsync: a SIGKILL loses nothing
# of it) and one truncation at the release; no request to the store. After a kill, the next holder reads
# the pool and the reservation and deletes it: 3 requests, once.
#
# Not covered: a node that goes down (its notes are of no use elsewhere), a holder killed while it
# waited between two attempts (its claims are kept across attempts but noted only during one), a store
# that serialises writers (the local store: one transaction, nothing left). There the reservation is
# left to the attachment's DEL (which sweeps them), CNI GC and the reconciler, as before.


def note_claim(lock: Held | None, name: str, offset: int, owner: Allocation) -> None:
    """Note in the held node lock that this holder claims reservation `name` (`offset`) for `owner`."""
    if lock is not None:
        lock.note(_note(name, offset, owner))


def _note(name: str, offset: int, owner: Allocation) -> bytes:
    return jsonio.dumps({"name": name, "offset": offset, "owner": list(owner)})


def free_left(reservations: Reservations, read: Callable[[], PoolView], lock: Held) -> None:
    """Free what the notes found in `lock` (a dead holder's) name, judged on the pool `read` returns;
    those that cannot be judged now (the store did not answer) stay for the next holder."""
    left: list[bytes] = []
    view = None
    for line in lock.left:
        try:
            found = jsonio.loads(line, "node lock note")
            name, offset, owner = str(found["name"]), int(found["offset"]), Allocation(*found["owner"])
        except (CniError, KeyError, TypeError, ValueError):
            log.warning("node lock %s: note %r not understood: dropped", lock.path, line[:200])
            continue
        try:
            view = view or read()
            if view.holder(offset) is not None:
                continue  # written (killed after its pool write), or another entry's: never freed here
            log.info("reservation %s of %s/%s: its ADD died before its pool write: released", name,
                     owner.container_id, owner.ifname)  # fmt: skip
            reservations.release(name, owner.same_attachment)
        except CniError as e:
            log.warning("reservation %s of a killed ADD not released yet: %s", name, e)
            left.append(line)
    lock.left[:] = left
