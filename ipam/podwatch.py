"""Pods deleted without a DEL, freed within seconds: the node-local agent's watch on the pods of its own
node (Kubernetes store only). Upstream whereabouts' `ip-control-loop` does this with a shared informer
on every pod of the cluster; here each node watches its own pods (fieldSelector spec.nodeName), so no
leader election and no cluster-wide pod cache.

- **Watch**: LIST the node's pods, then WATCH from the list's resourceVersion (bookmarks on,
  `timeoutSeconds` bounded), resumed from the last resourceVersion after a dropped connection (with
  backoff), listed again after 410 Gone. A relist that misses a pod known before treats it as deleted.
- **Sweep**: a sweeper thread takes every deletion queued so far and runs ONE reconciler pass
  (ipam.reconciler, freeing through ipam.removal) that judges only the entries naming those pods: one
  recording the deleted UID is freed at once; one without a UID, or with another (a pod of the same
  name: StatefulSets), is judged by a GET of the pod, as the reconciler does. A sweep's requests: one
  paged LIST of the pools and one of the reservations, a guarded PATCH per pool holding a freed entry,
  a GET of the pool holding a reservation's address and the reservation's DELETE, a GET per deleted
  pod when an entry lacks its UID (lean entries do). A dual-stack pod: 9 (docs/benchmarks.md).
- **Start-up**: entries recorded by this node whose pod is not among its first LIST (same UID) are
  judged by GET: deletions missed while the agent was down are freed then. The periodic reconciler
  stays the safety net (a watch that cannot be opened, a failed sweep, entries of other nodes).

- **Never dead, never unbounded**: each thread's loop runs again after any exception that escapes it
  (backoff doubling from 0.5 s to 30 s); the watcher lists again then (the event it was handling may be
  lost), the sweeper sweeps the job it had in hand. At most QUEUE jobs wait for the sweeper: a deletion
  that finds the queue full is left in the watch's known pods and caught by one relist once the queue
  has room (the sweeper takes everything queued at once).
- **Health** (ipam/watchhealth.py): the gauge pycni_podwatch_up and one line per change of state.

Failures are logged and counted, never raised into plugin calls (their own threads)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from cni import faults, log, metrics
from cni.errors import CniError
from ipam import keeprunning, rbac
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.model import Allocation
from ipam.podsource import PodSource
from ipam.reconciler import Reconciler, Report
from ipam.store.base import Store
from ipam.watchhealth import Health

type PodKey = tuple[str, str]  # (namespace, name)

WATCH_TIMEOUT = 300  # seconds a watch request lasts on the server (then resumed from its resourceVersion)
READ_SLACK = 30.0  # a read waits this much longer than the watch lasts: then the connection is dead
BACKOFF = (0.5, 30.0)  # first and longest wait before the watch is opened again after a failure
PODS = "/api/v1/pods"  # every namespace, filtered by node (fieldSelector)
SWEEP_TRIES = 3  # a sweep that fails (store unreachable) is tried again this often; then the reconciler
QUEUE = 256  # jobs waiting for the sweeper at most (one per deletion; the sweeper takes them all at once)


class ScopedReconciler(Reconciler):
    """A reconciler pass that judges only the entries of deleted pods (`gone`: pod -> deleted UIDs) and,
    at start-up, the entries `node` recorded whose pod is not in `listed` (pod -> UID); every other
    entry is kept without a request."""

    def __init__(self, store: Store, pods: PodSource, gone: Mapping[PodKey, frozenset[str]],
                 node: str = "", listed: Mapping[PodKey, str] | None = None) -> None:  # fmt: skip
        super().__init__(store, pods)
        self.gone, self.node, self.listed = gone, node, listed

    def verdict(self, owner: Allocation) -> str | None:
        if "/" not in owner.podref:
            return None
        namespace, name = owner.podref.split("/", 1)
        uids = self.gone.get((namespace, name))
        if uids is not None:
            if owner.pod_uid and owner.pod_uid in uids:
                return f"pod deleted (uid {owner.pod_uid})"
            return super().verdict(owner)  # no UID, or another pod of the same name: ask the API
        if self.listed is not None and self.node and owner.node == self.node:
            uid = self.listed.get((namespace, name))
            if uid is not None and (not owner.pod_uid or not uid or owner.pod_uid == uid):
                return None
            return super().verdict(owner)
        return None


@dataclass
class Job:
    """What one sweep judges: deleted pods (pod -> UIDs), and once, the start-up list of the node's pods."""

    gone: dict[PodKey, set[str]] = field(default_factory=dict)
    listed: dict[PodKey, str] | None = None

    def merge(self, other: Job) -> None:
        for key, uids in other.gone.items():
            self.gone.setdefault(key, set()).update(uids)
        if other.listed is not None:
            self.listed = other.listed


class PodWatch:
    """The watch (`run_watch`) and the sweeper (`run_sweeper`), one thread each (`start`), each run again
    after any exception (`_keep`). Fault points (cni/faults.py, docs/testing.md): podwatch-list (a LIST
    answered), podwatch-event (an event read), podwatch-take (a job in the sweeper's hand),
    podwatch-sweep (a sweep starting)."""

    def __init__(self, client: Client, node: str, store: Store, pods: PodSource,
                 timeout: int = WATCH_TIMEOUT, backoff: tuple[float, float] = BACKOFF,
                 on_report: Callable[[Job, Report], None] = lambda job, report: None,
                 say: Callable[[str], None] = lambda line: log.warning("%s", line),
                 health: Health | None = None, store_label: str = "kubernetes",
                 queue_size: int = QUEUE) -> None:  # fmt: skip
        self.client, self.node, self.store, self.pods, self.say = client, node, store, pods, say
        self.timeout, self.backoff, self.on_report = timeout, backoff, on_report
        self.health = health or Health(say, starting=())
        self.store_label = store_label  # what its sweeps' retries and conflicts are counted under
        self.jobs: queue.Queue[Job | None] = queue.Queue(queue_size)
        self.held: Job | None = None  # the job the sweeper has in hand (swept first after a restart)
        self.stop = threading.Event()
        self.known: dict[PodKey, str] | None = None  # the node's pods as last seen (key -> uid)
        self.version = ""  # the resourceVersion to resume from ("" : list first)
        self.lists = 0  # LISTs made (start and every relist)
        # the server refused the watch's credentials (401, 403): it ended, to be opened again from the
        # node's flat file (its kubeconfig may have changed: another installer's, then ours again)
        self.refused = threading.Event()
        self._threads: list[threading.Thread] = []

    # the watch

    def relist(self) -> None:
        """LIST the node's pods; pods known before and missing now (or with another UID) are deleted."""
        rbac.require(rbac.NODE, "", "pods", "list")
        doc = self.client.request("GET", PODS, query={"fieldSelector": f"spec.nodeName={self.node}"})
        metrics.sink().watch_request("list")
        self.lists += 1
        faults.point("podwatch-list")
        listed = {_key(item): _uid(item) for item in doc.get("items") or [] if isinstance(item, dict)}
        job = None
        if self.known is None:
            job = Job(listed=dict(listed))
        else:
            gone = {k: {uid} for k, uid in self.known.items() if listed.get(k) != uid}
            if gone:
                self.say(f"pod watch: {len(gone)} pods of node {self.node} went while it was not watching")
                job = Job(gone=gone)
        if job is not None and not keeprunning.put(self.jobs, job, self.stop):
            return  # stopping
        self.known = listed
        self.version = str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def events(self) -> Iterator[dict[str, Any]]:
        query = {"fieldSelector": f"spec.nodeName={self.node}", "resourceVersion": self.version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": self.timeout}  # fmt: skip
        rbac.require(rbac.NODE, "", "pods", "watch")
        metrics.sink().watch_request("watch")
        return self.client.watch(PODS, query, opened=self._watching)

    def _watching(self) -> None:
        self.health.up("watch", f"pod watch up: the pods of node {self.node} listed and watched")

    def handle(self, event: dict[str, Any]) -> bool:
        """One watch event; False when the watch must be listed again (410 Gone, the queue full)."""
        faults.point("podwatch-event")
        kind, obj = str(event.get("type") or ""), event.get("object") or {}
        metrics.sink().watch_event(kind)
        if kind == "ERROR":
            if obj.get("code") == 410:
                metrics.sink().watch_event("GONE")
                self.version = ""
                return False
            code, reason = int(obj.get("code") or 500), str(obj.get("reason", ""))
            raise ApiError(code, reason, str(obj.get("message", "")))
        version = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        if version:
            self.version = version
        if kind == "BOOKMARK" or self.known is None:
            return True
        key, uid = _key(obj), _uid(obj)
        if kind == "DELETED":
            try:
                self.jobs.put_nowait(Job(gone={key: {uid}}))
            except queue.Full:  # the sweeper is behind: the pod stays known, and one relist finds it gone
                self.say(f"pod watch: {self.jobs.maxsize} sweeps queued; node {self.node}'s pods are listed "
                         "again once the sweeper has room")
                self.version = ""
                return False
            self.known.pop(key, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.known[key] = uid
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
        while not self.stop.is_set():
            try:
                self.watch_once()
                delay = self.backoff[0]
                continue
            except ApiError as e:
                if e.status == 410:
                    self.version = ""
                    metrics.sink().watch_event("GONE")
                    continue
                if e.status in (401, 403):
                    self._failed(e, 0.0, "its credentials were refused")
                    self.refused.set()
                    return
                self._failed(e, delay)
            except (Unreachable, CniError, OSError, ValueError) as e:
                self._failed(e, delay)
            except Exception as e:  # anything else (a bug, an event not as expected): it may have cost an
                self.version = ""  # event, so the pods are listed again
                self._failed(e, delay, trace=True)
            if self.stop.wait(delay):
                return
            delay = min(delay * 2, self.backoff[1])

    def _failed(self, e: Exception, delay: float, why: str = "", trace: bool = False) -> None:
        """Said once while the watch stays down (ipam/watchhealth.py); each retry only at debug level."""
        if self.stop.is_set():  # closing ends the watch's read: not worth a line
            return
        why = why or f"again in {delay:.1f} s, then with backoff up to {self.backoff[1]:g} s"
        if self.health.down("watch", f"the watch of node {self.node}'s pods failed: {e!r}; {why}"):
            if trace:
                log.error("pod watch: %s", log.traceback_text())
        else:
            log.debug("pod watch on node %s: %s (again in %.1f s)", self.node, e, delay)

    # the sweeper

    def take(self, block: bool = True) -> Job | None:
        """Every job queued so far as one (waits for the first when `block`); None when stopping, or
        when nothing is queued and not `block`."""
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
            first.merge(more)

    def sweep(self, job: Job) -> Report:
        """One reconciler pass over the pods of `job` (ScopedReconciler)."""
        faults.point("podwatch-sweep")
        gone = {k: frozenset(v) for k, v in job.gone.items()}
        started = time.monotonic()
        report = ScopedReconciler(self.store, self.pods, gone, self.node, job.listed).run()
        freed = report.freed
        metrics.sink().watch_swept(time.monotonic() - started, not report.errors, freed)
        for e in report.errors:
            log.warning("pod watch: %s", e)
        if report.found:
            pods = ", ".join(sorted(f"{ns}/{name}" for ns, name in gone)) or "pods gone before the start"
            self.say(f"pod watch: freed {freed} of {report.found} allocations and reservations ({pods})")
        return report

    def run_sweeper(self) -> None:
        while not self.stop.is_set():
            if self.held is None:
                self.health.up("sweep")  # waiting for work: the sweeper runs
            more = self.take(block=self.held is None)
            if more is not None and self.held is not None:
                self.held.merge(more)  # run again after a failure: the job it had in hand, and the rest
            elif more is not None:
                self.held = more
            elif self.held is None:
                return  # stopping
            job = self.held
            faults.point("podwatch-take")
            for attempt in range(SWEEP_TRIES):
                try:
                    self.on_report(job, self.sweep(job))
                    break
                except Exception as e:  # the store out of reach (CniError), or anything else
                    metrics.sink().watch_swept(0.0, False, 0)
                    if not isinstance(e, CniError):
                        log.error("pod watch: %s", log.traceback_text())
                    log.warning("pod watch: sweep failed (%s); %s", e,
                                "again" if attempt + 1 < SWEEP_TRIES else "left to the reconciler")
                    if self.stop.wait(self.backoff[0] * 2**attempt):
                        return
            self.held = None
            self.health.up("sweep")

    def _keep(self, part: str, body: Callable[[], None], recover: Callable[[], None]) -> None:
        """Run `body` (a thread's loop) again after any exception that escapes it (ipam.keeprunning): said
        once while the part stays down (ipam/watchhealth.py, with the traceback)."""

        def down(e: Exception) -> None:
            if self.health.down(part, f"its {part} thread failed ({e!r}); run again with backoff"):
                log.error("pod watch: %s", log.traceback_text())

        keeprunning.keep(self.stop, body, recover, down, lambda: self.health.is_up(part), self.backoff,
                         self.store_label)  # fmt: skip

    def _list_next(self) -> None:
        self.version = ""  # the watcher failed mid-event: list again (a relist finds what it missed)

    def start(self, sweep: bool = True) -> None:
        """The watch's and the sweeper's threads (without `sweep`: the watch's only, its jobs left to the
        caller's take() and sweep())."""
        parts: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
            ("watch", self.run_watch, self._list_next), ("sweep", self.run_sweeper, lambda: None)]
        parts = parts if sweep else parts[:1]
        self.health.starting(*(part for part, _, _ in parts))
        for part, body, recover in parts:
            t = threading.Thread(target=self._keep, args=(part, body, recover), name=f"pod-{part}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def close(self, timeout: float = 5.0) -> None:
        """Stop both threads (the watch's connection is closed to end its read)."""
        self.stop.set()
        with contextlib.suppress(queue.Full):  # full: the sweeper is not waiting, it sees `stop`
            self.jobs.put_nowait(None)
        self.client.http.interrupt()
        closers = [self.client.close, self.store.close, self.pods.close]
        keeprunning.close_after(self._threads, timeout, closers, "pod watch")


def _key(obj: dict[str, Any]) -> PodKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _uid(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


class CountedClient(Client):
    """The sweep's client: every request counted by verb (cni.metrics watch_request), so the exporter
    shows what the watch costs the API server."""

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "") -> dict[str, Any]:  # fmt: skip
        metrics.sink().watch_request(method.lower())
        return super().request(method, path, body, query, content_type)


class NotKubernetes(Exception):
    """The node's store is not the Kubernetes store: the watch has nothing to free."""


def open_pod_watch(node: str, configuration_path: str = "",
                   say: Callable[[str], None] = lambda line: log.warning("%s", line),
                   health: Health | None = None) -> PodWatch:  # fmt: skip
    """The watch of `node`'s pods over the store of the node's flat file (found as the plugin finds it;
    `configuration_path`: the flat file, or its directory). ConfigError when there is none yet;
    NotKubernetes for another store."""
    from ipam import config
    from ipam.kubeapi import load_kubeconfig
    from ipam.kubepods import KubePodSource
    from ipam.store.kube import KubeStore

    conf = config.load_store({"configuration_path": configuration_path} if configuration_path else {})
    if conf.datastore != "kubernetes":
        raise NotKubernetes(conf.datastore)
    kube = load_kubeconfig(conf.kubernetes.kubeconfig)
    store = KubeStore(CountedClient(kube), kube.namespace, role=rbac.NODE)
    pods = KubePodSource(CountedClient(kube), role=rbac.NODE)
    watch = Client(kube, timeout=(3.0, WATCH_TIMEOUT + READ_SLACK))
    return PodWatch(watch, node, store, pods, say=say, health=health, store_label=conf.datastore)
