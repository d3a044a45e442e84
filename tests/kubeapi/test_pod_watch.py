"""The agent's pod watch (ipam/podwatch.py) on the session's real kube-apiserver, with the node's
ServiceAccount and rbac.yaml as shipped, opened as the agent opens it (a flat file naming the node's
kubeconfig): a deleted pod's entries (at two offsets, in two pools) and reservation are freed; a live
pod's, and those of a StatefulSet pod replaced by one of the same name, are kept; a dropped watch
resumes from its resourceVersion, and a relist (after a 410) catches the deletions it missed. Pods are
created on a node name of the test's own (no kubelet here: they stay as written; grace period 0 deletes
them at once), so no other test's pod is watched.

No test waits for a thread to keep pace: the sweeps that must not race the test (a replacement created
before the sweep) are taken from the queue and run by the test itself; the others are awaited through
the watch's report callback."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni import faults, jsonio, metrics
from ipam import podwatch
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.podwatch import Job, PodWatch
from ipam.reconciler import Report
from ipam.store.names import pool_name, reservation_name
from tests.kubeapi.factory import open_kube
from tests.kubeup import Tenant
from tests.unit.ipam.test_podwatch import Once
from tests.waits import until

NET_A, NET_B = "198.51.100.0/24", "198.18.0.0/24"
WAIT = 60.0  # seconds at most for a sweep the test awaits (it normally takes well under one)


class Requests(metrics.Sink):
    """The watch's requests, by verb (cni.metrics watch_request), and its events."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.events: list[str] = []

    def watch_request(self, verb: str) -> None:
        self.requests.append(verb)

    def watch_event(self, kind: str) -> None:
        self.events.append(kind)


@pytest.fixture
def counted() -> Iterator[Requests]:
    sink = Requests()
    metrics.install(sink)
    try:
        yield sink
    finally:
        metrics.install(None)


class Swept:
    """The reports of the watch's sweeps, for a test to await one that covers a pod."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.done: list[tuple[Job, Report, float]] = []

    def __call__(self, job: Job, report: Report) -> None:
        with self.cond:
            self.done.append((job, report, time.monotonic()))
            self.cond.notify_all()

    def covering(self, namespace: str, name: str) -> tuple[Job, Report, float]:
        def found() -> tuple[Job, Report, float] | None:
            return next((d for d in self.done if (namespace, name) in d[0].gone), None)

        with self.cond:
            assert self.cond.wait_for(lambda: found() is not None, WAIT), f"no sweep of {name}"
            got = found()
            assert got is not None
            return got


def flat_file(tenant: Tenant, tmp_path: Path) -> Path:
    """The flat file as the installer writes it for the Kubernetes store (the node's kubeconfig)."""
    flat = tmp_path / "whereabouts.d" / "whereabouts.conf"
    flat.parent.mkdir(parents=True, exist_ok=True)
    flat.write_bytes(jsonio.dumps({"datastore": "kubernetes",
                                   "kubernetes": {"kubeconfig": str(tenant.node)}}))
    return flat


def opened(tenant: Tenant, tmp_path: Path, on_report: Swept | None = None) -> PodWatch:
    w = podwatch.open_pod_watch(node_of(tenant), str(flat_file(tenant, tmp_path)))
    w.backoff = (0.05, 0.5)
    if on_report is not None:
        w.on_report = on_report
    return w


def node_of(tenant: Tenant) -> str:
    return f"pw-{tenant.namespace}"


def seed(tenant: Tenant, entries: dict[str, dict[str, Allocation]],
         reservations: dict[str, Allocation]) -> None:
    store = open_kube(tenant.node)
    try:
        for rng, put in entries.items():
            store.commit_pool(Pool(pool_name(rng), rng), PoolUpdate(put=put))
        for ip, owner in reservations.items():
            store.put_reservation(Reservation(reservation_name(ip), owner))
    finally:
        store.close()


def owners(tenant: Tenant) -> dict[str, set[tuple[str, str]]]:
    """pool -> {(offset, podref)}, and "reservations" -> {(name, podref)}."""
    out = {name: {(k, str(v.get("podref"))) for k, v in allocs.items()}
           for name, allocs in tenant.pools().items()}
    out["reservations"] = {(k, str(v.get("podref"))) for k, v in tenant.reservations().items()}
    return out


def entry(tenant: Tenant, pod: str, uid: str, ifname: str = "net1") -> Allocation:
    return Allocation(f"c-{pod}-{ifname}", f"{tenant.namespace}/{pod}", ifname, uid, "netA", node_of(tenant))


def test_a_deleted_pods_entries_and_reservation_are_freed_and_a_live_pods_kept(
        tenant: Tenant, tmp_path: Path, counted: Requests) -> None:
    ns, node = tenant.namespace, node_of(tenant)
    gone = tenant.create_pod("web-1", node=node)["metadata"]["uid"]
    live = tenant.create_pod("web-2", node=node)["metadata"]["uid"]
    g, g2 = entry(tenant, "web-1", gone), entry(tenant, "web-1", gone, "net2")
    lv = entry(tenant, "web-2", live)
    # web-1 at two offsets of one pool (a copy its DEL never saw) and in a second pool
    seed(tenant, {NET_A: {"5": g, "77": g2, "6": lv}, NET_B: {"9": g}},
         {"198.51.100.5": g, "198.51.100.77": g2, "198.51.100.6": lv})
    swept = Swept()
    w = opened(tenant, tmp_path, swept)
    w.start()
    try:
        with swept.cond:  # the start-up sweep (nothing to free: both pods are listed)
            assert swept.cond.wait_for(lambda: bool(swept.done), WAIT)
        assert counted.requests[0] == "list" and w.lists == 1
        assert swept.done[0][1].freed == 0
        before = len(counted.requests)
        deleted_at = time.monotonic()
        tenant.delete_pod("web-1")
        _, report, at = swept.covering(ns, "web-1")
        took = at - deleted_at
        assert report.freed == 3 + 2 and not report.errors, report
        assert owners(tenant) == {pool_name(NET_A): {("6", f"{ns}/web-2")}, pool_name(NET_B): set(),
                                  "reservations": {("198.51.100.6", f"{ns}/web-2")}}
        sweep_requests = counted.requests[before:]
    finally:
        w.close()
    # LIST pools, LIST reservations (each a "get" here), a PATCH of each pool holding an entry (guarded
    # with the pool as listed), a GET of the pool holding each reservation's address (afresh) and its
    # DELETE; no GET of the pod (every entry had its UID)
    assert sorted(sweep_requests) == sorted(["get"] * 2 + ["patch"] * 2 + ["get", "delete"] * 2), repr(
        sweep_requests)
    assert counted.events.count("DELETED") == 1
    print(f"\npod watch: freed in {took * 1000:.0f} ms after the DELETE, {len(sweep_requests)} requests")


def test_a_statefulset_pod_replaced_by_one_of_the_same_name_keeps_the_new_pods_entries(
        tenant: Tenant, tmp_path: Path) -> None:
    ns, node = tenant.namespace, node_of(tenant)
    old = tenant.create_pod("db-0", node=node)["metadata"]["uid"]
    w = opened(tenant, tmp_path)
    w.start(sweep=False)  # (close() joins it before it closes the connection the watch reads)
    try:
        assert w.take() is not None  # the start-up list
        tenant.delete_pod("db-0")
        job = w.take()  # the deletion, queued by the watch (the sweep is ours to run)
        assert job is not None and job.gone == {(ns, "db-0"): {old}}
        new = tenant.create_pod("db-0", node=node)["metadata"]["uid"]
        upstream = Allocation("c-up", f"{ns}/db-0", "net3")  # no UID (upstream's plugin wrote it)
        was, now = entry(tenant, "db-0", old), entry(tenant, "db-0", new)
        seed(tenant, {NET_A: {"5": was, "6": now, "7": upstream}}, {"198.51.100.5": was, "198.51.100.6": now})
        report = w.sweep(job)
    finally:
        w.close()
    assert report.freed == 2, report
    assert owners(tenant) == {pool_name(NET_A): {("6", f"{ns}/db-0"), ("7", f"{ns}/db-0")},
                              "reservations": {("198.51.100.6", f"{ns}/db-0")}}


def test_an_entry_without_uid_is_freed_once_no_pod_of_its_name_exists(tenant: Tenant, tmp_path: Path) -> None:
    ns, node = tenant.namespace, node_of(tenant)
    tenant.create_pod("legacy", node=node)
    seed(tenant, {NET_A: {"9": Allocation("c-up", f"{ns}/legacy", "net1")}}, {})
    swept = Swept()
    w = opened(tenant, tmp_path, swept)
    w.start()
    try:
        # listed first: a pod deleted before the watch's first LIST is never a DELETED event, and an
        # entry without this node's name is not judged at start-up (the reconciler's, as upstream's)
        with swept.cond:
            assert swept.cond.wait_for(lambda: bool(swept.done), WAIT)
        assert not swept.done[0][0].gone and (ns, "legacy") in (swept.done[0][0].listed or {})
        tenant.delete_pod("legacy")
        _, report, _ = swept.covering(ns, "legacy")
    finally:
        w.close()
    assert report.freed == 1 and owners(tenant)[pool_name(NET_A)] == set()


def test_a_dropped_watch_resumes_and_a_relist_catches_what_it_missed(
        tenant: Tenant, tmp_path: Path, counted: Requests) -> None:
    ns, node = tenant.namespace, node_of(tenant)
    uids = {name: tenant.create_pod(name, node=node)["metadata"]["uid"] for name in ("a", "b", "c")}
    seed(tenant, {NET_A: {str(i): entry(tenant, n, uids[n]) for i, n in enumerate("abc", 5)}}, {})
    swept = Swept()
    w = opened(tenant, tmp_path, swept)
    w.start()
    try:
        with swept.cond:
            assert swept.cond.wait_for(lambda: bool(swept.done), WAIT)  # listed and watching
        # dropped: the connection ends under the reader; the watch resumes from its version, no LIST.
        # The watch is reading once it has passed on an event (a pod created for that)
        tenant.create_pod("x", node=node)
        until(lambda: "ADDED" in counted.events, "the watch passed on an event", WAIT)
        assert w.lists == 1 and counted.requests.count("watch") == 1
        w.client.http.interrupt()
        tenant.delete_pod("a")
        swept.covering(ns, "a")
        assert w.lists == 1 and counted.requests.count("watch") >= 2
    finally:
        w.close()
    # after a 410 Gone (the watch's version compacted away: tests/unit/ipam/test_podwatch.py scripts the
    # answer; this server answers an old version from its watch cache instead) the watch lists again: a
    # pod deleted while nobody watched is found missing from the new list and freed
    tenant.delete_pod("b")
    w2 = opened(tenant, tmp_path, swept)
    w2.known, w2.version = dict(w.known or {}), ""
    w2.start()
    try:
        swept.covering(ns, "b")
        assert w2.lists == 1
    finally:
        w2.close()
    assert owners(tenant)[pool_name(NET_A)] == {("7", f"{ns}/c")}


def test_the_agent_watches_its_nodes_pods_and_exports_what_the_watch_did(
        tenant: Tenant, tmp_path: Path) -> None:
    """`pycni-agent` as the DaemonSet runs it (NODENAME from the downward API, the flat file naming the
    node's kubeconfig): a pod deleted without a DEL loses its entry and reservation; the counters say so."""
    from tests import agentutil
    from tests.unit.test_metrics import scrape, value

    ns, node = tenant.namespace, node_of(tenant)
    uid = tenant.create_pod("web-1", node=node)["metadata"]["uid"]
    seed(tenant, {NET_A: {"5": entry(tenant, "web-1", uid)}}, {"198.51.100.5": entry(tenant, "web-1", uid)})
    flat = flat_file(tenant, tmp_path)
    agent = agentutil.Agent(tmp_path / "agent.fifo", tmp_path / "agent.log", f"--pod-watch={flat}",
                            env={"NODENAME": node}).start()
    try:
        until(lambda: f"pod watch on node {node}" in agent.log.read_text(), "the pod watch on", WAIT)
        until(lambda: value(scrape(agent.metrics_url()), "pycni_podwatch_requests_total", verb="watch") == 1,
              "one watch request counted", WAIT)
        tenant.delete_pod("web-1")
        until(lambda: not tenant.pools()[pool_name(NET_A)] and not tenant.reservations(),
              "the deleted pod's entry and reservation freed", WAIT)
        until(lambda: value(scrape(agent.metrics_url()), "pycni_podwatch_freed_total") == 2,
              "two frees counted", WAIT)
        got = scrape(agent.metrics_url())
    finally:
        assert agent.stop() == 0
    assert value(got, "pycni_podwatch_events_total", type="DELETED") == 1
    assert value(got, "pycni_podwatch_requests_total", verb="list") == 1  # the node's pods, once
    assert value(got, "pycni_podwatch_sweep_errors_total") == 0
    assert f"{ns}/web-1" in agent.log.read_text()


def test_a_restarted_watch_frees_what_this_node_recorded_for_pods_gone_meanwhile(
        tenant: Tenant, tmp_path: Path) -> None:
    """The agent was down while a pod went: its first list no longer has the pod, so the entries this
    node recorded for it are judged (GET: gone) and freed; another node's entry for a pod that does not
    exist either is left to the reconciler, and a listed pod's entries stay."""
    ns, node = tenant.namespace, node_of(tenant)
    uid = tenant.create_pod("web-2", node=node)["metadata"]["uid"]
    went = entry(tenant, "web-1", "uid-went")
    elsewhere = Allocation("c-x", f"{ns}/web-9", "net1", "uid-9", "netA", "another-node")
    seed(tenant, {NET_A: {"5": went, "6": entry(tenant, "web-2", uid), "7": elsewhere}},
         {"198.51.100.5": went})
    swept = Swept()
    w = opened(tenant, tmp_path, swept)
    w.start()
    try:
        with swept.cond:
            assert swept.cond.wait_for(lambda: bool(swept.done), WAIT)
        job, report, _ = swept.done[0]
    finally:
        w.close()
    assert job.listed == {(ns, "web-2"): uid} and report.freed == 2, report
    assert owners(tenant) == {pool_name(NET_A): {("6", f"{ns}/web-2"), ("7", f"{ns}/web-9")},
                              "reservations": set()}


@pytest.mark.parametrize("point", ["podwatch-list", "podwatch-event", "podwatch-take", "podwatch-sweep"])
def test_an_exception_at_each_point_leaves_the_watch_freeing_the_next_deletion(
        tenant: Tenant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """Issue 45: the watch's threads died for good on an exception they did not expect (the sweeper's left
    the watch filling its queue). One injected at each fault point of the pod watch (cni/faults.py): the
    threads go on (the watcher lists again, the sweeper sweeps the job it had in hand), the deletion under
    way when it struck is freed, and so is the next; the watch says it is up again."""
    ns, node = tenant.namespace, node_of(tenant)
    uids = {name: tenant.create_pod(name, node=node)["metadata"]["uid"] for name in ("a", "b", "c")}
    seed(tenant, {NET_A: {str(i): entry(tenant, n, uids[n]) for i, n in enumerate("abc", 5)}}, {})
    once = Once(point)
    monkeypatch.setattr(faults, "hook", once)
    swept = Swept()
    w = opened(tenant, tmp_path, swept)
    w.start()
    try:
        with swept.cond:  # the start-up sweep (listed, watching)
            assert swept.cond.wait_for(lambda: bool(swept.done), WAIT)
        tenant.delete_pod("a")
        swept.covering(ns, "a")
        tenant.delete_pod("b")
        swept.covering(ns, "b")
        until(w.health.is_up, "the pod watch up again", WAIT)
    finally:
        w.close()
    assert once.fired.is_set(), f"{point} was never reached"
    assert owners(tenant)[pool_name(NET_A)] == {("7", f"{ns}/c")}
