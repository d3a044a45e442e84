"""Release allocations and reservations whose pod is gone; never one whose pod exists.

A pod is gone when the source says it does not exist, or when it exists with another UID than the one
recorded (the name was reused by a new pod: StatefulSets). An entry an IPAMClaim owns (ipam.claimref) is
judged by its claim instead, looked up like a pod (`claims`): gone once no claim of that name and UID
exists; without a claim source it is kept. Allocations without a pod reference
(podman, cnitool) and pods the source cannot vouch for are left alone. Removal is compare-and-swap:
an entry that changed since it was judged (a kubelet re-ADD took it over) is not touched.

Memory stays bounded: one pool at a time from the store's paging iterator, pod answers in a bounded
LRU, findings streamed to a callback instead of collected.

Metrics (cni.metrics; exported when the reconciler runs with an endpoint): the size and use of every
pool it lists (it lists them all each run anyway: no request is made for the metrics), what it freed,
and how each run went."""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from cni import log, metrics
from cni.errors import CniError
from ipam import removal
from ipam.claimref import ClaimRef, claim_of
from ipam.model import Allocation, Pool, Reservation, joined
from ipam.podsource import ClaimSource, PodInfo, PodSource, PodSourceError
from ipam.ranges import usable_bounds
from ipam.retry import Retry
from ipam.store.base import Conflict, Store
from ipam.store.names import network_name_of, reservation_address

CACHE = 4096


@dataclass(frozen=True)
class Finding:
    kind: str  # "allocation" or "reservation"
    where: str  # pool or reservation name
    ip: str  # "" for reservations (their name is the IP, with an optional network prefix)
    owner: Allocation
    reason: str


@dataclass
class Report:
    found: int = 0  # judged gone (freed, or listed on a dry run)
    freed: int = 0
    kept: int = 0
    skipped: int = 0  # no pod reference, pod unknown, or changed meanwhile
    errors: list[str] = field(default_factory=list)


class Reconciler:
    def __init__(
        self,
        store: Store,
        pods: PodSource,
        dry_run: bool = False,
        on_finding: Callable[[Finding], None] = lambda f: None,
        cache: int = CACHE,
        retry: Retry | None = None,
        claims: ClaimSource | None = None,
    ) -> None:
        """`claims`: where IPAMClaims are looked up (ipam.claimref); None: a claim's entries are kept."""
        self.store, self.pods, self.dry_run, self.on_finding = store, pods, dry_run, on_finding
        self.retry, self.claims = retry or Retry(), claims
        self._claims: OrderedDict[tuple[str, str], str | None] = OrderedDict()
        self._cache: OrderedDict[tuple[str, str], PodInfo | None] = OrderedDict()
        self._cache_size = cache
        # every pool seen in this run: (name, network_name, range); one line per pool, not per address
        self._pools: list[tuple[str, str, ipaddress.IPv4Network | ipaddress.IPv6Network]] = []
        self._late_entries = 0  # entries freed in the reservation pass (judged by their reservation)

    def _lookup(self, namespace: str, name: str) -> PodInfo | None:
        key = (namespace, name)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        pod = self.pods.lookup(namespace, name)
        self._cache[key] = pod
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return pod

    def _claim_uid(self, ref: ClaimRef) -> str | None:
        assert self.claims is not None
        key = (ref.namespace, ref.name)
        if key in self._claims:
            self._claims.move_to_end(key)
            return self._claims[key]
        uid = self.claims.claim_uid(ref.namespace, ref.name)
        self._claims[key] = uid
        if len(self._claims) > self._cache_size:
            self._claims.popitem(last=False)
        return uid

    def claim_verdict(self, ref: ClaimRef) -> str | None:
        """Why the entry of IPAMClaim `ref` is gone (the claim is, or was recreated), None while the
        claim exists or when no claim source was given. Raises PodSourceError."""
        if self.claims is None:
            return None
        uid = self._claim_uid(ref)
        if uid is None:
            return f"IPAMClaim {ref} deleted"
        if uid != ref.uid:
            return f"IPAMClaim {ref} recreated (uid {ref.uid} is now {uid})"
        return None

    def verdict(self, owner: Allocation) -> str | None:
        """Why this owner is gone, or None if it is (or may be) alive. Raises PodSourceError. An owner
        that is an IPAMClaim (ipam.claimref) is judged by its claim, never by a pod."""
        ref = claim_of(owner)
        if ref is not None:
            return self.claim_verdict(ref)
        if "/" not in owner.podref:
            return None
        namespace, name = owner.podref.split("/", 1)
        pod = self._lookup(namespace, name)
        if pod is None:
            return "pod gone"
        if owner.pod_uid and pod.uid and owner.pod_uid != pod.uid:
            return f"pod recreated (uid {owner.pod_uid} is now {pod.uid})"
        return None

    def run(self) -> Report:
        self._cache.clear()
        self._claims.clear()
        self._pools.clear()
        self._late_entries = 0
        report = Report()
        started, seen, ok = time.monotonic(), set(), False
        from_pools: int | None = None  # freed allocations, once every pool is done
        try:
            for pool in self.store.iter_pools():
                self._pool(pool, report)
                seen.add(pool.name)
            metrics.sink().pools_seen(metrics.STORE.get(), seen)  # every pool listed: the others are gone
            from_pools = report.freed
            for res in self.store.iter_reservations():
                self._reservation(res, report)
            ok = not report.errors
            return report
        finally:
            allocations = report.freed if from_pools is None else from_pools + self._late_entries
            freed = {"allocation": allocations, "reservation": report.freed - allocations}
            metrics.sink().reconciled(time.monotonic() - started, ok, freed)

    def _judge(self, owner: Allocation, report: Report) -> str | None:
        if "/" not in owner.podref and claim_of(owner) is None:
            report.skipped += 1
            return None
        try:
            reason = self.verdict(owner)
        except PodSourceError as e:
            report.skipped += 1
            log.warning("owner %s unknown, left alone: %s", claim_of(owner) or owner.podref, e)
            return None
        report.kept += reason is None
        return reason

    def _pool(self, pool: Pool, report: Report) -> None:
        net = ipaddress.ip_network(pool.range, strict=False)
        network_name = network_name_of(pool.name, pool.range)
        if network_name is not None:
            self._pools.append((pool.name, network_name, net))
        doomed: dict[str, Allocation] = {}
        for key, owner in pool.allocations.items():
            reason = self._judge(owner, report)
            if reason is not None and key.isdigit():
                doomed[key] = owner
                report.found += 1
                self.on_finding(
                    Finding("allocation", pool.name, str(net.network_address + int(key)), owner, reason)
                )
        freed = self._release(pool, doomed, report) if doomed and not self.dry_run else 0
        report.freed += freed
        lo, hi = usable_bounds(net)  # the pool as this run leaves it (no request made for the metrics)
        size = max(hi - lo + 1, 0)
        metrics.sink().pool(metrics.STORE.get(), pool.name, len(pool.allocations) - freed, size)

    def _release(self, pool: Pool, doomed: dict[str, Allocation], report: Report) -> int:
        """Remove the `doomed` entries still exactly as judged (through the decision core, compare-and-swap,
        conflicts retried: ipam.removal); the others are skipped (changed meanwhile)."""
        try:
            freed = removal.remove(self.store, pool.name, lambda _: doomed.items(), self.retry,
                                   f"releasing in pool {pool.name}", first=pool)  # fmt: skip
        except CniError as e:
            report.errors.append(f"pool {pool.name}: {e.msg}")
            return 0
        report.skipped += len(doomed) - len(freed)
        return len(freed)

    def _holder(self, res: Reservation) -> tuple[Pool, str, Allocation] | None:
        """The pool entry that holds the address reservation `res` names, read afresh (pools seen in
        this run): (pool, key, entry). A reservation whose owner is gone but whose address is held
        protects that entry (upstream whereabouts takes an entry over for a re-ADD, or for a pod
        recreated under the same name, and leaves the reservation as it was): it stays.

        A node slice's pool is named `<network_name>-<node>-<slice>` (`<node>-<slice>` without a
        network name) while the reservations of its addresses are `<network_name>-<ip>`: the node a
        reservation of ours records tells the one from the other (a name alone is ambiguous)."""
        for pool_name, network_name, net in self._pools:
            prefixes = _prefixes(network_name, res.owner.node)
            names = (reservation_address(res.name, p, net.version) for p in prefixes)
            ip = next(filter(None, names), None)
            if ip is None or ipaddress.ip_address(ip) not in net:
                continue
            pool = self.store.get_pool(pool_name)
            key = str(int(ipaddress.ip_address(ip)) - int(net.network_address))
            held = None if pool is None else pool.allocations.get(key)
            if pool is not None and held is not None:
                return pool, key, held
        return None

    def _judged_by(self, entry: Allocation, owner: Allocation) -> bool:
        """Whether a pool entry the pool pass kept is this reservation's attachment without extras of its
        own, the reservation having them (a lean pool: ipam.model.joined): the pool pass judged it by its
        pod name alone (alive), the reservation's pod UID says the pod was recreated."""
        return (not entry.has_extras() and owner.has_extras() and entry.same_attachment(owner)
                and self._judge(entry, Report()) is None)  # fmt: skip

    def _entry_of(self, res: Reservation, reason: str, holder: tuple[Pool, str, Allocation],
                  report: Report) -> bool:  # fmt: skip
        """The entry holding a gone reservation's address is judged by it (`_judged_by`): it is gone too
        and is freed with it (compare-and-swap, as in the pool pass). False when it changed meanwhile:
        both stay."""
        pool, key, entry = holder
        report.found += 1
        net = ipaddress.ip_network(pool.range, strict=False)
        self.on_finding(Finding("allocation", pool.name, str(net.network_address + int(key)),
                                joined(entry, {entry.attachment: res.owner}), reason))  # fmt: skip
        if self.dry_run:
            return True
        freed = self._release(pool, {key: entry}, report)
        report.freed += freed
        self._late_entries += freed
        return freed > 0

    def _reservation(self, res: Reservation, report: Report) -> None:
        reason = self._judge(res.owner, report)
        if reason is None:
            return
        holder = self._holder(res)
        if holder is not None and self._judged_by(holder[2], res.owner):
            if not self._entry_of(res, reason, holder, report):
                return
            holder = None
        held = None if holder is None else holder[2]
        # a dry run freed nothing: a holder that is gone too would have been freed
        if held is not None and (not self.dry_run or self._judge(held, Report()) is None):
            report.skipped += 1
            log.info("reservation %s: its owner %s is gone (%s) but %s holds the address: kept",
                     res.name, res.owner.podref, reason, held.podref or held.container_id)
            return
        report.found += 1
        self.on_finding(Finding("reservation", res.name, "", res.owner, reason))
        if self.dry_run:
            return
        try:
            self.store.delete_reservation(res)
            report.freed += 1
        except Conflict:
            metrics.conflict("reservation")
            report.skipped += 1  # changed since it was read: judged again next run


def _prefixes(network_name: str, node: str) -> tuple[str, ...]:
    """The network names a pool whose name carries `network_name` (ipam.store.names.network_name_of)
    may prefix the reservations of its addresses with: its own, and when it is `node`'s slice pool
    (`<network_name>-<node>`, or `<node>`), the network's."""
    if node and network_name.endswith(f"-{node}"):
        return network_name, network_name[: -len(node) - 1]
    if node and network_name == node:
        return network_name, ""
    return (network_name,)


class Stop(Protocol):
    """What run_forever waits on: a cni.stopsignal.StopSignal (the CLI's), or a threading.Event."""

    def is_set(self) -> bool: ...
    def wait(self, timeout: float) -> bool: ...


def run_forever(
    make: Callable[[], Reconciler], interval: float, stop: Stop, report: Callable[[Report], None]
) -> None:
    """Run every `interval` seconds until `stop` is set; one failed run is logged, not fatal."""
    while not stop.is_set():
        try:
            report(make().run())
        except CniError as e:
            log.error("reconcile run failed: %s", e)
        stop.wait(interval)
