"""The agent's pod watch (ipam/podwatch.py) without a server: which entries a deletion frees (the scoped
reconciler pass over an in-memory store, with a fake pod source that counts its lookups), and how the
watch loop handles events, 410 Gone, dropped connections and relists (a scripted client)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ipam import podwatch
from ipam.kubeapi import ApiError, Unreachable
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.podsource import PodInfo
from ipam.podwatch import Job, PodWatch, ScopedReconciler
from ipam.store.names import pool_name, reservation_name
from tests.memstore import MemoryStore

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
    exception raised after them)."""

    def __init__(self, lists: list[dict[str, Any]], watches: list[list[Any]]) -> None:
        self.lists, self.watches = lists, watches
        self.queries: list[tuple[str, dict[str, Any]]] = []
        self.http = self

    def request(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
                content_type: str = "") -> dict[str, Any]:  # fmt: skip
        self.queries.append(("list", dict(query or {})))
        return self.lists.pop(0)

    def watch(self, path: str, query: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        self.queries.append(("watch", dict(query or {})))
        if not self.watches:
            raise Unreachable("no more")
        for item in self.watches.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item

    def interrupt(self) -> None:
        pass

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
    """A watch the agent's opener started: refused at once (the first), or running until closed."""

    def __init__(self, refused: bool) -> None:
        self.refused, self.closed = threading.Event(), threading.Event()
        if refused:
            self.refused.set()

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


def test_the_agent_opens_a_refused_watch_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from cni.agent.main import start_pod_watch
    from ipam import podwatch

    opened: list[OpenedWatch] = []

    def open_pod_watch(node: str, path: str, say: Any) -> OpenedWatch:
        opened.append(OpenedWatch(refused=not opened))
        return opened[-1]

    monkeypatch.setattr(podwatch, "open_pod_watch", open_pod_watch)
    stop = start_pod_watch("auto", {"NODENAME": "node-a"}, every=0.01)
    assert stop is not None
    deadline = time.monotonic() + 60
    while len(opened) < 2:  # the opener thread saw the first refused and opened a second
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert opened[0].closed.is_set() and not opened[1].closed.is_set()
    stop.set()
    assert opened[1].closed.wait(60) and len(opened) == 2
