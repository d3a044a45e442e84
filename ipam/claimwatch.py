"""IPAMClaims deleted (a VM deleted), their addresses freed within seconds: the node-local agent's watch on
IPAMClaims (k8s.cni.cncf.io/v1alpha1), beside its pod watch (ipam.podwatch) and like it. The periodic
reconciler frees the same entries at its next run (it judges a claim's entries by their claim,
ipam.reconciler), so this watch is a matter of seconds, never of correctness.

Which node frees: a claim belongs to no node (a VM migrates), so every ADD that allocates for a claim
leaves a record in its node's state directory (`claims/<uid>`, ipam.claims.record). An agent watches
IPAMClaims only while its node has records, and frees only the recorded claims it sees deleted: a
cluster without VMs (or without the CRD) gets no request, and a VM's deletion is freed by the agents of
the nodes that ran it (usually one; two after a live migration: the second finds nothing), not by every
node.

- **Watch**: LIST the IPAMClaims of the cluster (recorded claims missing from it are gone), then WATCH
  from the list's resourceVersion (bookmarks on, `timeoutSeconds` bounded), resumed after a dropped
  connection (backoff), listed again after 410 Gone. A DELETED event of a recorded claim (same UID)
  queues it. No records: no watch (the records are looked for every `idle` seconds).
- **Sweep**: a sweeper thread takes every queued claim and runs ONE reconciler pass (ipam.reconciler)
  that judges only the entries and reservations those claims own (ipam.claimref): freed through
  ipam.removal (compare-and-swap), reservations deleted with a precondition. Its requests: one paged
  LIST of the pools and one of the reservations, a guarded PATCH per pool holding a freed entry, a GET
  of that pool per reservation and the reservation's DELETE. Records of swept claims are removed; a
  sweep that fails is tried three times, then left to the reconciler.
- A server that does not serve IPAMClaims (no CRD): logged, looked at again after the longest backoff.

Failures are logged, never raised into plugin calls (own threads, own clients). Neither thread ends on an
exception (ipam.keeprunning: run again with backoff, said once each time it fails after working); at most
QUEUE jobs wait for the sweeper: a deletion that finds the queue full ends the watch, and the next list
finds the claim gone."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from cni import faults, log
from cni.errors import CniError
from ipam import keeprunning, rbac
from ipam.claimref import ClaimRef, claim_of
from ipam.claims import GROUP, RECORDS, RESOURCE, VERSION
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.model import Allocation
from ipam.podsource import PodInfo, PodSourceError
from ipam.podwatch import BACKOFF, QUEUE, READ_SLACK, SWEEP_TRIES, WATCH_TIMEOUT  # the pod watch's
from ipam.reconciler import Reconciler, Report
from ipam.store.base import Store

IDLE = 5.0  # seconds between looks at the records while there are none
CLAIMS = f"/apis/{GROUP}/{VERSION}/{RESOURCE}"  # every namespace


class _NoPods:
    """The sweep judges claims only: no pod is ever asked about."""

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        raise PodSourceError("a claim sweep asks about no pod")

    def close(self) -> None:
        pass


class ClaimSweep(Reconciler):
    """A reconciler pass that frees only what the claims `gone` (uid -> claim) own; every other entry
    and reservation is kept without a request."""

    def __init__(self, store: Store, gone: Mapping[str, ClaimRef]) -> None:
        super().__init__(store, _NoPods())
        self.gone = gone

    def verdict(self, owner: Allocation) -> str | None:
        ref = claim_of(owner)
        if ref is not None and self.gone.get(ref.uid) == ref:
            return f"IPAMClaim {ref} deleted"
        return None


class Records:
    """The node's records of claims it allocated for (ipam.claims.record): `<dir>/<uid>` = "ns/name"."""

    def __init__(self, directory: str) -> None:
        self.dir = directory

    def all(self) -> dict[str, ClaimRef]:
        try:
            names = os.listdir(self.dir)
        except OSError:
            return {}
        out = {}
        for uid in names:
            ref = self.get(uid)
            if ref is not None:
                out[uid] = ref
        return out

    def get(self, uid: str) -> ClaimRef | None:
        if not uid or uid.startswith(".") or uid.endswith(".tmp") or "/" in uid:
            return None
        try:
            with open(os.path.join(self.dir, uid)) as fh:
                ns, _, name = fh.read().strip().partition("/")
        except OSError:
            return None
        return ClaimRef(ns, name, uid) if ns and name else None

    def drop(self, uid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.dir, uid))


class ClaimWatch:
    """The watch (`run_watch`) and the sweeper (`run_sweeper`), one thread each (`start`)."""

    def __init__(self, client: Client, store: Store, records: Records, timeout: int = WATCH_TIMEOUT,
                 backoff: tuple[float, float] = BACKOFF, idle: float = IDLE,
                 on_report: Callable[[dict[str, ClaimRef], Report], None] = lambda gone, report: None,
                 say: Callable[[str], None] = lambda line: log.warning("%s", line)) -> None:  # fmt: skip
        self.client, self.store, self.records, self.say = client, store, records, say
        self.timeout, self.backoff, self.idle, self.on_report = timeout, backoff, idle, on_report
        self.role = rbac.NODE
        self.jobs: queue.Queue[dict[str, ClaimRef] | None] = queue.Queue(QUEUE)
        self.held: dict[str, ClaimRef] = {}  # the claims in the sweeper's hand (first after a restart)
        self.failing = {"watch": False, "sweep": False}  # a thread failed and has not worked since
        self.stop = threading.Event()
        self.version = ""  # the resourceVersion to resume from ("": list first)
        self.lists = 0
        self._threads: list[threading.Thread] = []

    # the watch

    def relist(self) -> None:
        """LIST the claims; recorded claims missing from the list (or there with another UID) are gone."""
        rbac.require(self.role, GROUP, RESOURCE, "list")
        doc = self.client.request("GET", CLAIMS)
        self.lists += 1
        live = {str((i.get("metadata") or {}).get("uid") or "") for i in doc.get("items") or []
                if isinstance(i, dict)}  # fmt: skip
        gone = {uid: ref for uid, ref in self.records.all().items() if uid not in live}
        if gone and not keeprunning.put(self.jobs, gone, self.stop):
            return  # stopping
        self.version = str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def events(self) -> Iterator[dict[str, Any]]:
        query = {"resourceVersion": self.version, "allowWatchBookmarks": "true",
                 "timeoutSeconds": self.timeout}  # fmt: skip
        rbac.require(self.role, GROUP, RESOURCE, "watch")
        return self.client.watch(CLAIMS, query)

    def handle(self, event: dict[str, Any]) -> bool:
        """One watch event; False when the watch must be listed again (410 Gone)."""
        kind, obj = str(event.get("type") or ""), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                self.version = ""
                return False
            code, reason = int(obj.get("code") or 500), str(obj.get("reason", ""))
            raise ApiError(code, reason, str(obj.get("message", "")))
        meta = obj.get("metadata") or {}
        if meta.get("resourceVersion"):
            self.version = str(meta["resourceVersion"])
        if kind == "DELETED":
            uid = str(meta.get("uid") or "")
            ref = self.records.get(uid)
            if ref is not None:
                try:
                    self.jobs.put_nowait({uid: ref})
                except queue.Full:  # the sweeper is behind: the next list (waiting for room) finds it gone
                    self.version = ""
                    return False
        return True

    def watch_once(self) -> None:
        """List when needed, then read one watch request to its end (the server's timeoutSeconds)."""
        if not self.version:
            self.relist()
        for event in self.events():
            if not self.handle(event):
                return

    def run_watch(self) -> None:
        delay = self.backoff[0]
        told = False
        while not self.stop.is_set():
            if not self.records.all():
                self.version = ""  # deletions while not watching: the next list finds them
                if self.stop.wait(self.idle):
                    return
                continue
            try:
                self.watch_once()
                delay, told = self.backoff[0], False
                self.failing["watch"] = False
                continue
            except ApiError as e:
                if e.status == 410:
                    self.version = ""
                    continue
                if e.status == 404 and not told:
                    self.say(f"claim watch: the API server does not serve {RESOURCE}.{GROUP} (no CRD): "
                             "looked at again later; the reconciler frees deleted claims")  # fmt: skip
                    told = True
                    delay = self.backoff[1]
                elif e.status != 404:
                    self._failed(e, delay)
            except (Unreachable, CniError, OSError, ValueError) as e:
                self._failed(e, delay)
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.backoff[1])

    def _failed(self, e: Exception, delay: float) -> None:
        if not self.stop.is_set():
            log.warning("claim watch: %s (again in %.1f s)", e, delay)

    # the sweeper

    def take(self, block: bool = True) -> dict[str, ClaimRef] | None:
        """Every claim queued so far, as one job (waits for the first when `block`); None when stopping."""
        try:
            first = self.jobs.get(block=block)
        except queue.Empty:
            return None
        if first is None:
            return None
        while True:
            try:
                more = self.jobs.get_nowait()
            except queue.Empty:
                return first
            if more is None:
                with contextlib.suppress(queue.Full):  # full: `stop` is set, the sweeper sees it
                    self.jobs.put_nowait(None)
                return first
            first.update(more)

    def sweep(self, gone: dict[str, ClaimRef]) -> Report:
        """One reconciler pass over what the claims `gone` own; their records dropped once it is clean."""
        faults.point("claimwatch-sweep")  # tests: a sweep starting
        report = ClaimSweep(self.store, gone).run()
        for e in report.errors:
            log.warning("claim watch: %s", e)
        if not report.errors:
            for uid in gone:
                self.records.drop(uid)
        claims = ", ".join(sorted(str(ref) for ref in gone.values()))
        self.say(f"claim watch: freed {report.freed} of {report.found} allocations and reservations of "
                 f"deleted IPAMClaims ({claims})")  # fmt: skip
        return report

    def run_sweeper(self) -> None:
        while not self.stop.is_set():
            more = self.take(block=not self.held)
            if more is None and not self.held:
                return  # stopping
            self.held.update(more or {})  # run again after a failure: the claims it had in hand, and the rest
            gone = dict(self.held)
            for attempt in range(SWEEP_TRIES):
                try:
                    self.on_report(gone, self.sweep(gone))
                    break
                except Exception as e:  # the store out of reach (CniError), or anything else
                    if not isinstance(e, CniError):
                        log.error("claim watch: %s", log.traceback_text())
                    log.warning("claim watch: sweep failed (%s); %s", e,
                                "again" if attempt + 1 < SWEEP_TRIES else "left to the reconciler")
                    if self.stop.wait(self.backoff[0] * 2**attempt):
                        return
            self.held = {}
            self.failing["sweep"] = False

    def _keep(self, part: str, body: Callable[[], None], recover: Callable[[], None]) -> None:
        """Run `body` (a thread's loop) again after any exception that escapes it (ipam.keeprunning): said
        once each time the part fails after it worked, with the traceback."""

        def down(e: Exception) -> None:
            if not self.failing[part]:
                self.failing[part] = True
                self.say(f"claim watch: its {part} thread failed ({e!r}); run again with backoff")
                log.error("claim watch: %s", log.traceback_text())

        keeprunning.keep(self.stop, body, recover, down, lambda: not self.failing[part], self.backoff,
                         "kubernetes")  # fmt: skip

    def _list_next(self) -> None:
        self.version = ""  # the watcher failed mid-event: list again (a relist finds what it missed)

    def start(self) -> None:
        for part, body, recover in (("watch", self.run_watch, self._list_next),
                                    ("sweep", self.run_sweeper, lambda: None)):  # fmt: skip
            t = threading.Thread(target=self._keep, args=(part, body, recover), name=f"claim-{part}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def close(self, timeout: float = 5.0) -> None:
        """Stop both threads (the watch's connection is closed to end its read)."""
        self.stop.set()
        with contextlib.suppress(queue.Full):  # full: the sweeper is not waiting, it sees `stop`
            self.jobs.put_nowait(None)
        self.client.http.interrupt()
        keeprunning.close_after(self._threads, timeout, [self.client.close, self.store.close], "claim watch")


class NotKubernetes(Exception):
    """The node's store is not the Kubernetes store: there are no claims to watch."""


def open_claim_watch(configuration_path: str = "",
                     say: Callable[[str], None] = lambda line: log.warning("%s", line),
                     records: str = "", **options: Any) -> ClaimWatch:  # fmt: skip
    """The claim watch over the store of the node's flat file (found as the plugin finds it), with the
    records in `records` (default: beside the flat file's local_db, where the plugin writes them unless
    a NAD names another local_db); `options`: ClaimWatch's. ConfigError when there is no flat file yet;
    NotKubernetes for another store."""
    from ipam import config
    from ipam.kubeapi import load_kubeconfig
    from ipam.store.kube import KubeStore

    conf = config.load_store({"configuration_path": configuration_path} if configuration_path else {})
    if conf.datastore != "kubernetes":
        raise NotKubernetes(conf.datastore)
    kube = load_kubeconfig(conf.kubernetes.kubeconfig)
    store = KubeStore(Client(kube), kube.namespace, role=rbac.NODE)
    watch = Client(kube, timeout=(3.0, WATCH_TIMEOUT + READ_SLACK))
    where = records or os.path.join(os.path.dirname(conf.local_db), RECORDS)
    return ClaimWatch(watch, store, Records(where), say=say, **options)
