"""The cluster-wide reservation of each address (OverlappingRangeIPReservation, one object per IP) as the
engine (ipam.engine) keeps it beside its pools when enable_overlapping_ranges is on: claimed before a
pool write on ADD, released after it on DEL, taken over for the same pod interface (a kubelet re-ADD,
upstream's reservations without a container id), and swept when a pool no longer holds it."""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from contextlib import AbstractContextManager

from cni import log
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


class Reservations:
    """The reservations of one configuration on one store. `pool_name` names a range's pool, `atomic`
    opens one attempt's unit (the store's exclusive(), else nothing)."""

    def __init__(
        self, store: Store, conf: IpamConfig, retry: Retry, pool_name: Callable[[IPRange], str],
        atomic: Callable[[], AbstractContextManager[Any]],
    ) -> None:  # fmt: skip
        self.store, self.conf, self.retry = store, conf, retry
        self.pool_name, self.atomic = pool_name, atomic

    def name(self, rng: IPRange, offset: int) -> str:
        return reservation_name(str(rng.address(offset)), self.conf.network_name)

    def claim(self, op: Op, decision: allocator.Decision, pool_version: str | None = None) -> bool:
        """The cluster-wide reservation of the decided address: created (POST first: one request when it
        is free), kept when this attachment holds it, taken over for the same pod and interface: True.
        False: the op decides again; a candidate held by someone else is blocked (op.claims says who
        holds it and whether that was a race lost), one deleted or changed meanwhile is judged again."""
        rng, owner, claims = op.rng, op.owner, op.claims
        name = self.name(rng, decision.offset)
        if claims.mine.get(name) == decision.offset:
            return True  # created by this call (a lost pool commit leaves it ours): not read again
        try:
            claims.created[name] = self.store.put_reservation(Reservation(name, owner))
            claims.mine[name] = decision.offset
            return True
        except Conflict:  # it exists: whose is it?
            res = self.store.get_reservation(name)
        if res is None:  # deleted since: judged again at once
            return False
        if res.owner.same_attachment(owner):
            return True
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

    def drop(self, claims: Claims, keep: str, owner: Allocation) -> None:
        """Reservations this call created for candidates it did not end up with."""
        for name, version in claims.created.items():
            if name == keep:
                continue
            try:
                res = self.store.get_reservation(name)
                if res is not None and res.version == version and res.owner.same_attachment(owner):
                    self.store.delete_reservation(res)
            except CniError as e:
                log.warning("reservation %s left behind: %s", name, e)

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
