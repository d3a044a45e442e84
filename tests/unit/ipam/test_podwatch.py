"""The agent's pod watch (ipam/podwatch.py) without a server: which entries a deletion frees (the scoped
reconciler pass over an in-memory store, with a fake pod source that counts its lookups), and how the
watch loop handles events, 410 Gone, dropped connections and relists (a scripted client)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cni import metrics
from ipam import podwatch
from ipam.kubeapi import ApiError, Unreachable
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.podsource import PodInfo
from ipam.podwatch import Job, PodWatch, ScopedReconciler
from ipam.store.names import pool_name, reservation_name
from tests.memstore import MemoryStore
from tests.waits import until

NET_A, NET_B = "198.51.100.0/24", "198.18.0.0/24"
GONE = Allocation("c1", "ns/web-1", "net1", "uid-gone", "netA", "node-a")
GONE_B = Allocation("c1", "ns/web-1", "net2", "uid-gone", "netB", "node-b")  # another pool, other node
LIVE = Allocation("c2", "ns/web-2", "net1", "uid-live", "netA", "node-a")
REPLACED = Allocation("c3", "ns/db-0", "net1", "uid-new", "netA", "node-a")  # the new db-0
OLD_DB = Allocation("c0", "ns/db-0", "net1", "uid-old", "netA", "node-a")  # the deleted db-0
NOUID_GONE = Allocation("c4", "ns/legacy", "net1")  # upstream wrote it: no UID, pod gone
NOUID_LIVE = Allocation("c5", "ns/db-0", "net9")  # no UID, a pod of that name exists


class Pods:
    def __init__(self, *pods: PodInfo) -> None:
        self.pods = {(p.namespace, p.name): p for p in pods}
        self.asked: list[tuple[str, str]] = []

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        self.asked.append((namespace, name))
        return self.pods.get((namespace, name))

    def close(self) -> None:
        pass


def seeded() -> MemoryStore:
    store = MemoryStore()
    a, b = pool_name(NET_A), pool_name(NET_B)
    store.commit_pool(Pool(a, NET_A), PoolUpdate(put={
        "5": GONE, "77": GONE, "6": LIVE, "7": REPLACED, "8": OLD_DB, "9": NOUID_GONE, "10": NOUID_LIVE}))
    store.commit_pool(Pool(b, NET_B), PoolUpdate(put={"5": GONE_B}))
    for ip, owner in (("198.51.100.5", GONE), ("198.51.100.200", GONE), ("198.51.100.6", LIVE),
                      ("198.51.100.201", REPLACED)):
        store.put_reservation(Reservation(reservation_name(ip), owner))
    return store


def held(store: MemoryStore) -> set[tuple[str, str, str]]:
    return {(p.name, k, a.container_id) for p in store.iter_pools() for k, a in p.allocations.items()}


def test_a_deletion_frees_every_entry_and_reservation_naming_the_pod_by_uid_without_a_lookup() -> None:
    store, pods = seeded(), Pods(PodInfo("ns", "web-2", "uid-live"), PodInfo("ns", "db-0", "uid-new"))
    report = ScopedReconciler(store, pods, {("ns", "web-1"): frozenset({"uid-gone"})}).run()
    a, b = pool_name(NET_A), pool_name(NET_B)
    assert held(store) == {(a, "6", "c2"), (a, "7", "c3"), (a, "8", "c0"), (a, "9", "c4"), (a, "10", "c5")}
    assert (b, "5", "c1") not in held(store)  # the other pool, recorded by another node: freed too
    assert set(r.name for r in store.iter_reservations()) == {"198.51.100.6", "198.51.100.201"}
    assert report.freed == 3 + 2 and not report.errors
    assert pods.asked == []  # every entry carried the deleted UID


def test_a_statefulset_pod_replaced_by_one_of_the_same_name_keeps_the_new_pods_entries() -> None:
    store, pods = seeded(), Pods(PodInfo("ns", "db-0", "uid-new"))
    ScopedReconciler(store, pods, {("ns", "db-0"): frozenset({"uid-old"})}).run()
    keys = {k for _, k, _ in held(store)}
    assert "8" not in keys  # the deleted db-0's entry
    assert {"7", "10"} <= keys  # the new db-0's entry, and an entry without UID while db-0 lives
    assert "198.51.100.201" in {r.name for r in store.iter_reservations()}
    assert set(pods.asked) == {("ns", "db-0")}  # asked once (cached): entries without the deleted UID


def test_an_entry_without_uid_is_freed_only_when_no_pod_of_that_name_exists() -> None:
    store, pods = seeded(), Pods()
    ScopedReconciler(store, pods, {("ns", "legacy"): frozenset({"uid-x"})}).run()
    assert "9" not in {k for _, k, _ in held(store)}
    assert pods.asked == [("ns", "legacy")]


def test_entries_of_other_pods_are_never_judged() -> None:
    store, pods = seeded(), Pods()  # the source knows no pod at all: a full reconciler would free all
    before = held(store)
    report = ScopedReconciler(store, pods, {("ns", "nobody"): frozenset({"u"})}).run()
    assert held(store) == before and report.freed == 0 and pods.asked == []


def test_start_up_judges_this_nodes_entries_whose_pod_is_not_listed() -> None:
    store, pods = seeded(), Pods(PodInfo("ns", "db-0", "uid-new"))
    listed = {("ns", "web-2"): "uid-live", ("ns", "db-0"): "uid-new"}
    ScopedReconciler(store, pods, {}, node="node-a", listed=listed).run()
    a, b = pool_name(NET_A), pool_name(NET_B)
    # web-1 (node-a, not listed, GET: gone) and the old db-0 freed; node-b's entry and those without a
    # node (no UID either: another writer) left to the reconciler
    assert held(store) == {(a, "6", "c2"), (a, "7", "c3"), (a, "9", "c4"), (a, "10", "c5"), (b, "5", "c1")}
    assert set(pods.asked) == {("ns", "web-1"), ("ns", "db-0")}


# the watch loop, on a scripted client


def pod(name: str, uid: str, version: str = "") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "uid": uid, "resourceVersion": version}}


class Script:
    """A client whose LISTs and WATCHes answer from lists the test gives (a watch: events, or an
    exception raised after them; an exception instead of a list: the watch not opened at all). When
    the watches run out: `done` is called, and the watch fails (Unreachable)."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[Any],
                 done: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        self.lists, self.watches, self.done = lists, watches, done
        self.queries: list[tuple[str, dict[str, Any]]] = []
        self.interrupted = threading.Event()
        self.http = self

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "") -> dict[str, Any]:  # fmt: skip
        self.queries.append(("list", dict(query or {})))
        return self.lists.pop(0)

    def watch(self, path: str, query: dict[str, Any] | None = None,
              opened: Callable[[], None] = lambda: None) -> Iterator[dict[str, Any]]:  # fmt: skip
        self.queries.append(("watch", dict(query or {})))
        if not self.watches:
            self.done()
            raise Unreachable("no more")
        script = self.watches.pop(0)
        if isinstance(script, BaseException):
            raise script
        opened()
        for item in script:
            if isinstance(item, BaseException):
                raise item
            yield item

    def interrupt(self) -> None:
        self.interrupted.set()

    def parked(self) -> Iterator[dict[str, Any]]:
        """A watch that reads nothing until the watch's connection is interrupted (closing it)."""
        if self.interrupted.wait(60):
            raise Unreachable("closed")
        yield from ()

    def close(self) -> None:
        pass


def listing(version: str, *pods: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": version}, "items": list(pods)}


def watcher(client: Script) -> PodWatch:
    return PodWatch(client, "node-a", MemoryStore(), Pods(), backoff=(0.0, 0.0))  # type: ignore[arg-type]


def jobs(w: PodWatch) -> list[Job]:
    out = []
    while (job := w.take(block=False)) is not None:
        out.append(job)
    return out


def test_the_watch_lists_the_nodes_pods_then_watches_from_the_lists_version() -> None:
    client = Script([listing("10", pod("a", "ua"), pod("b", "ub"))],
                    [[{"type": "DELETED", "object": pod("a", "ua", "11")},
                      {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}]])
    w = watcher(client)
    w.watch_once()
    assert client.queries[0] == ("list", {"fieldSelector": "spec.nodeName=node-a"})
    kind, query = client.queries[1]
    assert kind == "watch" and query["resourceVersion"] == "10" and query["allowWatchBookmarks"] == "true"
    assert query["fieldSelector"] == "spec.nodeName=node-a"
    assert w.version == "15" and w.known == {("ns", "b"): "ub"}
    (job,) = jobs(w)  # the start-up list and the deletion, taken as one sweep
    assert job.gone == {("ns", "a"): {"ua"}} and job.listed == {("ns", "a"): "ua", ("ns", "b"): "ub"}


def test_a_410_lists_again_and_pods_gone_meanwhile_count_as_deleted() -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    client = Script([listing("10", pod("a", "ua"), pod("b", "ub")), listing("30", pod("b", "ub2"))],
                    [[gone], [{"type": "ADDED", "object": pod("c", "uc", "31")}]])
    w = watcher(client)
    w.watch_once()  # list, then the watch says 410
    assert w.version == ""
    jobs(w)
    w.watch_once()  # lists again: a went, b is another pod of the same name now
    (job,) = jobs(w)
    assert job.gone == {("ns", "a"): {"ua"}, ("ns", "b"): {"ub"}} and job.listed is None
    assert w.known == {("ns", "b"): "ub2", ("ns", "c"): "uc"} and w.version == "31" and w.lists == 2


def test_a_dropped_watch_resumes_from_its_version_and_a_410_answer_relists() -> None:
    client = Script([listing("10"), listing("40")],
                    [[{"type": "ADDED", "object": pod("a", "ua", "12")}, Unreachable("reset")],
                     [ApiError(410, "Expired")], [{"type": "DELETED", "object": pod("a", "ua", "41")}]])
    w = watcher(client)
    done = threading.Event()
    original = w.handle

    def handle(event: dict[str, Any]) -> bool:
        answer = original(event)
        if event["type"] == "DELETED":
            w.stop.set()
            done.set()
        return answer

    w.handle = handle  # type: ignore[method-assign]
    w.run_watch()
    assert done.is_set()
    kinds = [(k, q.get("resourceVersion")) for k, q in client.queries]
    assert kinds == [("list", None), ("watch", "10"), ("watch", "12"), ("list", None), ("watch", "40")]
    gone = [j.gone for j in jobs(w)]
    assert {("ns", "a"): {"ua"}} in gone


def test_refused_credentials_end_the_watch_to_be_opened_again() -> None:
    """A 401 or 403 (the kubeconfig the watch was opened with no longer works: another installer's
    pod-bound token, say) ends the watch with `refused` set; the agent opens it again from the flat
    file (cni.agent.main start_pod_watch). Other errors are retried on the same watch."""
    for status in (401, 403):
        client = Script([listing("10")], [[ApiError(status, "Unauthorized")]])
        w = watcher(client)
        w.run_watch()  # returns on its own: not stopped, refused
        assert w.refused.is_set() and not w.stop.is_set()
    client = Script([listing("10")], [[ApiError(500, "boom")]])  # then "no more": Unreachable
    w = watcher(client)
    stopper = threading.Timer(0.0, w.stop.set)  # (backoff 0: it retries until stopped)
    stopper.start()
    w.run_watch()
    stopper.join()
    assert not w.refused.is_set()


def test_the_sweeper_takes_every_queued_deletion_as_one_pass() -> None:
    store = seeded()
    pods = Pods(PodInfo("ns", "db-0", "uid-new"))
    w = PodWatch(None, "node-a", store, pods, backoff=(0.0, 0.0))  # type: ignore[arg-type]
    w.jobs.put(Job(gone={("ns", "web-1"): {"uid-gone"}}))
    w.jobs.put(Job(gone={("ns", "db-0"): {"uid-old"}}))
    w.jobs.put(None)
    reports: list[int] = []
    w.on_report = lambda job, report: reports.append(report.freed)
    w.run_sweeper()
    assert reports == [6]  # web-1: 3 entries + 2 reservations; db-0: its old entry
    assert pods.asked == [("ns", "db-0")]


@pytest.mark.parametrize("datastore", ["local", "etcd"])
def test_other_stores_are_not_watched(tmp_path: Any, datastore: str) -> None:
    flat = tmp_path / "whereabouts.conf"
    extra = {"local": '"local_db": "/nonexistent/x.db"', "etcd": '"etcd_host": "127.0.0.1:1"'}[datastore]
    flat.write_text(f'{{"datastore": "{datastore}", {extra}}}')
    with pytest.raises(podwatch.NotKubernetes):
        podwatch.open_pod_watch("node-a", str(flat))


def test_the_agent_starts_the_watch_only_with_a_node_name_and_a_kubernetes_store(
        tmp_path: Any, capfd: pytest.CaptureFixture[str]) -> None:
    from cni.agent.main import start_pod_watch

    assert start_pod_watch("off", {"NODENAME": "node-a"}) is None
    assert start_pod_watch("auto", {}) is None
    assert start_pod_watch(str(tmp_path / "none.conf"), {}) is None  # a path, but no node name
    assert "pod watch off (no NODENAME)" in capfd.readouterr().err
    flat = tmp_path / "whereabouts.conf"
    flat.write_text('{"datastore": "local", "local_db": "/nonexistent/x.db"}')
    stop = start_pod_watch(str(flat), {"NODENAME": "node-a"}, every=0.01)
    assert stop is not None
    deadline = time.monotonic() + 60
    err = ""
    while "not kubernetes" not in err:  # said by the opener thread, once it read the flat file
        assert time.monotonic() < deadline, err
        time.sleep(0.01)
        err += capfd.readouterr().err
    assert "the node's store is local" in err
    stop.set()


class OpenedWatch:
    """A watch the agent's opener started (through start_pod_watch's `open_watch` seam): refused at once
    (the first), or running until closed."""

    def __init__(self, refused: bool) -> None:
        self.refused, self.closed = threading.Event(), threading.Event()
        if refused:
            self.refused.set()

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


def test_the_agent_opens_a_refused_watch_again() -> None:
    from cni.agent.main import start_pod_watch

    opened: list[OpenedWatch] = []

    def open_pod_watch(node: str, path: str, say: Any, health: Any) -> OpenedWatch:
        opened.append(OpenedWatch(refused=not opened))
        return opened[-1]

    stop = start_pod_watch("auto", {"NODENAME": "node-a"}, every=0.01, open_watch=open_pod_watch)
    assert stop is not None
    deadline = time.monotonic() + 60
    while len(opened) < 2:  # the opener thread saw the first refused and opened a second
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert opened[0].closed.is_set() and not opened[1].closed.is_set()
    stop.set()
    assert opened[1].closed.wait(60) and len(opened) == 2


# never dead, never unbounded (issue 45)


def deleted(name: str, uid: str, version: str) -> dict[str, Any]:
    return {"type": "DELETED", "object": pod(name, uid, version)}


def test_a_full_queue_falls_back_to_one_relist() -> None:
    """The sweeper behind (here: nobody sweeps): a deletion that finds the queue full ends the watch and
    stays among the known pods; the next pass lists again once the queue has room, and queues every pod
    gone since as one job. The queue never holds more than its size."""
    client = Script([listing("10", pod("a", "ua"), pod("b", "ub"), pod("c", "uc"), pod("d", "ud")),
                     listing("20", pod("d", "ud"))],
                    [[deleted("a", "ua", "11"), deleted("b", "ub", "12"), deleted("c", "uc", "13")], []])
    w = PodWatch(client, "node-a", MemoryStore(), Pods(), backoff=(0.0, 0.0), queue_size=2)  # type: ignore[arg-type]
    w.watch_once()  # the start-up list (1 of 2), a's deletion (2 of 2); b's finds it full
    assert w.jobs.qsize() == 2 and w.version == ""
    assert w.known == {("ns", "b"): "ub", ("ns", "c"): "uc", ("ns", "d"): "ud"}  # b not lost, c never read
    first = w.take(block=False)  # what a sweeper takes: everything queued, as one job
    assert first is not None and first.gone == {("ns", "a"): {"ua"}} and first.listed is not None
    w.watch_once()  # room again: one LIST, then the watch from its version
    (job,) = jobs(w)
    assert job.gone == {("ns", "b"): {"ub"}, ("ns", "c"): {"uc"}} and job.listed is None
    assert [(k, q.get("resourceVersion")) for k, q in client.queries] == [
        ("list", None), ("watch", "10"), ("list", None), ("watch", "20")]
    assert w.lists == 2


def test_the_relist_waits_for_room_while_the_sweeper_is_behind() -> None:
    """A relist whose job finds the queue full waits (the watch reads nothing meanwhile: one LIST later
    says what went) until the sweeper takes; it never adds past the queue's size."""
    client = Script([listing("10", pod("a", "ua"))], [[deleted("a", "ua", "11")]])
    w = PodWatch(client, "node-a", MemoryStore(), Pods(), backoff=(0.0, 0.0), queue_size=2)  # type: ignore[arg-type]
    w.known, w.version = {("ns", "a"): "ua", ("ns", "b"): "ub"}, ""  # b went while nobody watched
    for name in ("x", "y"):  # the queue full
        w.jobs.put(Job(gone={("ns", name): {"u" + name}}))
    t = threading.Thread(target=w.watch_once)
    t.start()
    until(lambda: w.lists == 1, "the watch listed")  # its job waits for room
    assert w.jobs.qsize() == 2 and t.is_alive()
    taken = w.take(block=False)  # the sweeper takes everything queued
    assert taken is not None and set(taken.gone) == {("ns", "x"), ("ns", "y")}
    t.join(30)
    assert not t.is_alive()
    (job,) = jobs(w)
    assert job.gone == {("ns", "b"): {"ub"}, ("ns", "a"): {"ua"}}  # b by the relist, then a by its event


class Hiccup(MemoryStore):
    """A store whose first listing of the pools raises what no caller expects (a bug, say)."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.raised = False

    def iter_pools(self) -> Iterator[Pool]:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a bug in the store")
        return super().iter_pools()


def test_the_watch_and_the_sweeper_outlive_exceptions_nobody_expected() -> None:
    """Issue 45's reproduction through the constructor's seams (the store, the client), not fault points:
    a sweep that raises a RuntimeError (the store's first listing of the pools) ended the sweeper for
    good, and an event the watch cannot read (its metadata not an object) the watcher. Both go on: the
    sweep is tried again, the watch lists again and finds the pod deleted meanwhile."""
    store = Hiccup(seeded().backend)
    reports = Reports()
    gate = threading.Event()
    pods = {n: pod(n, uid) for n, uid in (("web-1", "uid-gone"), ("web-2", "uid-live"), ("db-0", "uid-old"))}

    def unreadable() -> Iterator[dict[str, Any]]:
        assert gate.wait(30)
        yield {"type": "MODIFIED", "object": {"metadata": "not an object"}}

    # the relist after the unreadable event: db-0 went meanwhile (its DELETED event never read)
    client = Script([listing("10", *pods.values()), listing("12", pods["web-2"])], [])
    client.watches = [[deleted("web-1", "uid-gone", "11")], unreadable(), client.parked()]
    w = PodWatch(client, "node-a", store, Pods(PodInfo("ns", "db-0", "uid-new")),  # type: ignore[arg-type]
                 backoff=(0.0, 0.0), on_report=reports)
    w.start()
    try:
        with reports.cond:
            assert reports.cond.wait_for(lambda: reports.swept("web-1"), 30), reports.done
        gate.set()
        with reports.cond:
            assert reports.cond.wait_for(lambda: reports.swept("db-0"), 30), reports.done
    finally:
        w.close()
    assert store.raised and w.lists == 2
    assert {k for _, k, _ in held(store)} == {"6", "7", "9", "10"}  # web-1's entries and the old db-0's


class Boom(RuntimeError):
    """The injected failure."""


class Once:
    """A fault hook (cni/faults.py) raising Boom the first time `what` is reached."""

    def __init__(self, what: str) -> None:
        self.what, self.fired = what, threading.Event()

    def __call__(self, what: str) -> None:
        if what == self.what and not self.fired.is_set():
            self.fired.set()
            raise Boom(what)


class Reports:
    """A sweep's reports, for a test to wait on."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done: list[tuple[Job, int]] = []

    def __call__(self, job: Job, report: Any) -> None:
        with self.cond:
            self.done.append((job, report.freed))
            self.cond.notify_all()

    def swept(self, name: str) -> bool:
        return any(("ns", name) in job.gone for job, _ in self.done)


@pytest.mark.parametrize("point", ["podwatch-list", "podwatch-event", "podwatch-take", "podwatch-sweep"])
def test_the_watch_and_the_sweeper_outlive_an_exception_at_each_point(
        monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """An exception at each fault point of the pod watch: both threads go on (run again after it, or the
    sweep tried again), the deletion under way when it struck is swept all the same, and so is the next
    (tests/kubeapi/test_pod_watch.py does the same on a real API server)."""
    from cni import faults

    store = seeded()
    reports = Reports()
    gate = threading.Event()  # the second deletion's watch is read once the first was swept

    def second() -> Iterator[dict[str, Any]]:
        assert gate.wait(30)
        yield deleted("db-0", "uid-old", "13")

    pods = {n: pod(n, uid) for n, uid in (("web-1", "uid-gone"), ("web-2", "uid-live"), ("db-0", "uid-old"))}
    client = Script([listing("10", *pods.values()), listing("12", pods["web-2"], pods["db-0"])], [])
    client.watches = [[deleted("web-1", "uid-gone", "11")], second(), client.parked()]
    w = PodWatch(client, "node-a", store, Pods(PodInfo("ns", "db-0", "uid-new")),  # type: ignore[arg-type]
                 backoff=(0.0, 0.0), on_report=reports)
    once = Once(point)
    monkeypatch.setattr(faults, "hook", once)
    w.start()
    try:
        with reports.cond:
            assert reports.cond.wait_for(lambda: reports.swept("web-1"), 30), reports.done
        gate.set()
        with reports.cond:
            assert reports.cond.wait_for(lambda: reports.swept("db-0"), 30), reports.done
        until(w.health.is_up, "the pod watch up again")
    finally:
        w.close()
    assert once.fired.is_set(), f"{point} was never reached"
    assert {k for _, k, _ in held(store)} == {"6", "7", "9", "10"}  # web-1's entries and the old db-0's


# health: said once per change, and the gauge (issue 45)


class Seen(metrics.Sink):
    """What the pod watch tells cni.metrics: its state (watch_up) and its sweeps' retries and conflicts."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.ups: list[bool | None] = []
        self.counted: list[tuple[str, ...]] = []

    def watch_up(self, up: bool | None) -> None:
        with self.cond:
            self.ups.append(up)
            self.cond.notify_all()

    def retry(self, store: str, reason: str) -> None:
        self.counted.append(("retry", store, reason))

    def conflict(self, store: str, kind: str, n: int = 1) -> None:
        self.counted.append(("conflict", store, kind, str(n)))

    def changes(self) -> list[bool | None]:
        return [u for i, u in enumerate(self.ups) if i == 0 or self.ups[i - 1] != u]


@pytest.fixture
def seen() -> Iterator[Seen]:
    sink = Seen()
    metrics.install(sink)
    try:
        yield sink
    finally:
        metrics.install(None)


def test_a_failing_watch_is_said_down_once_and_up_once_and_the_gauge_follows(seen: Seen) -> None:
    """Three failed attempts to open the watch, then one that works: one warning (naming the error), one
    line when it is up again; the gauge 0 while it failed, then 1."""
    lines: list[str] = []
    client = Script([listing("10")], [Unreachable("connection refused")] * 3 + [[]])
    w = PodWatch(client, "node-a", MemoryStore(), Pods(), backoff=(0.0, 0.0), say=lines.append)  # type: ignore[arg-type]
    client.done = w.stop.set  # when the scripted watches run out
    w.run_watch()
    assert [k for k, _ in client.queries] == ["list"] + ["watch"] * 5
    down = [line for line in lines if line.startswith("pod watch down")]
    up = [line for line in lines if line.startswith("pod watch up")]
    assert len(down) == 1 and "connection refused" in down[0] and len(up) == 1, lines
    assert lines.index(down[0]) < lines.index(up[0])
    assert seen.changes()[-2:] == [False, True]


def test_the_agent_says_once_that_the_watch_is_not_started_and_once_that_it_is_up(
        seen: Seen, capfd: pytest.CaptureFixture[str]) -> None:
    """No flat file yet: the agent looks for it again every `every` seconds and says so once, not at each
    look; the gauge is 0 until the watch runs, then 1 (and the line that says so)."""
    from cni.agent.main import start_pod_watch
    from cni.errors import ConfigError

    tries: list[OpenedWatch] = []

    def open_pod_watch(node: str, path: str, say: Any, health: Any) -> OpenedWatch:
        if len(tries) < 4:
            tries.append(OpenedWatch(refused=False))
            raise ConfigError("ipam.datastore: no store configured")
        tries.append(OpenedWatch(refused=False))
        return tries[-1]

    stop = start_pod_watch("auto", {"NODENAME": "node-a"}, every=0.001, open_watch=open_pod_watch)
    assert stop is not None
    with seen.cond:
        assert seen.cond.wait_for(lambda: seen.ups[-1:] == [True], 60), seen.ups
    stop.set()
    assert tries[-1].closed.wait(60)
    err = capfd.readouterr().err
    assert len(tries) == 5
    assert err.count("pod watch down: not started (ipam.datastore: no store configured") == 1, err
    assert err.count("pod watch up") == 1, err
    assert seen.changes() == [False, True]


def test_other_stores_take_the_gauge_away(
        seen: Seen, tmp_path: Any, capfd: pytest.CaptureFixture[str]) -> None:
    """A store other than Kubernetes: the watch is off by configuration, not down (no sample of the gauge,
    so that an alert on 0 fires only where a watch should run)."""
    from cni.agent.main import start_pod_watch

    flat = tmp_path / "whereabouts.conf"
    flat.write_text('{"datastore": "local", "local_db": "/nonexistent/x.db"}')
    stop = start_pod_watch(str(flat), {"NODENAME": "node-a"}, every=0.01)
    assert stop is not None
    with seen.cond:
        assert seen.cond.wait_for(lambda: seen.ups[-1:] == [None], 60), seen.ups
    stop.set()
    assert "pod watch off: the node's store is local" in capfd.readouterr().err


def test_the_sweepers_retries_and_conflicts_are_counted_under_the_watchs_store(seen: Seen) -> None:
    """The sweeper runs on a thread of its own, where cni.metrics STORE (per context) is not set by any
    IPAM call: a sweep that loses a compare-and-swap is retried and counted under the watch's store all
    the same, as an IPAM call's would be."""
    from tests.unit.ipam.test_engine import Flaky

    store = Flaky(seeded().backend, 1)  # the first pool write of the sweep loses its race
    reports = Reports()
    client = Script([listing("10", pod("web-2", "uid-live"), pod("db-0", "uid-new"))], [])
    client.watches = [client.parked()]
    w = PodWatch(client, "node-a", store, Pods(PodInfo("ns", "db-0", "uid-new")),  # type: ignore[arg-type]
                 backoff=(0.0, 0.0), on_report=reports)
    w.start()  # the start-up sweep frees web-1 (recorded by node-a, not listed, no such pod)
    try:
        with reports.cond:
            assert reports.cond.wait_for(lambda: bool(reports.done), 30)
    finally:
        w.close()
    assert reports.done[0][1] > 0
    assert ("retry", "kubernetes", "conflict") in seen.counted, seen.counted
    assert {c[1] for c in seen.counted} == {"kubernetes"}, seen.counted
