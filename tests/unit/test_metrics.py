"""Metrics (cni.metrics hooks, cni.exporter): what the hooks see from the retry loop, the batch combiner,
an IPAM call, the agent and the reconciler; the endpoints scraped over HTTP and parsed with
prometheus_client's own parser; and that a plugin call never imports prometheus_client. No root."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cni import jsonio, metrics, skel
from cni.agent import client, server
from cni.errors import Code, TryAgainError
from cni.exporter import AGENT, EXPORTERS, RECONCILER, Exporter
from ipam import batch, combiner
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Reservation
from ipam.podsource import PodInfo
from ipam.reconciler import Reconciler
from ipam.retry import Retry, retrying
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable
from ipam.store.local import LocalStore
from tests.logtee import PYTHONPATH
from tests.memstore import Backend, MemoryStore
from tests.nsutil import REPO
from tests.unit.ipam.test_engine import Clock, Flaky, addrs, make
from tests.unit.test_import_cost import modules

A = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")
B = Allocation("cb", "ns/b", "net1", "uid-b", "netA", "node1")
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod-a;K8S_POD_UID=uid-a"
Sample = tuple[str, dict[str, str], float]


class Recorder(metrics.Sink):
    """Every observation, in order (seconds left out: never depend on how fast a machine is)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, ...]] = []

    def attach(self, plugin: str, command: str, seconds: float, code: int) -> None:
        self.seen.append(("attach", plugin, command, code))

    def refused(self, reason: str) -> None:
        self.seen.append(("refused", reason))

    def inflight(self, n: int) -> None:
        self.seen.append(("inflight", n))

    def ipam(self, store: str, command: str, seconds: float, code: int) -> None:
        assert seconds >= 0
        self.seen.append(("ipam", store, command, code))

    def retry(self, store: str, reason: str) -> None:
        self.seen.append(("retry", store, reason))

    def conflict(self, store: str, kind: str, n: int = 1) -> None:
        self.seen.append(("conflict", store, kind, n))

    def pool(self, store: str, name: str, used: int, size: int) -> None:
        self.seen.append(("pool", store, name, used, size))

    def pools_seen(self, store: str, names: set[str]) -> None:
        self.seen.append(("pools_seen", store, frozenset(names)))

    def reconciled(self, seconds: float, ok: bool, freed: dict[str, int]) -> None:
        self.seen.append(("reconciled", ok, dict(freed)))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [s for s in self.seen if s[0] == kind]


@pytest.fixture
def rec() -> Iterator[Recorder]:
    r = Recorder()
    metrics.install(r)
    try:
        yield r
    finally:
        metrics.install(None)


def scrape(url: str) -> list[Sample]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    families = text_string_to_metric_families(text)
    return [(s.name, dict(s.labels), s.value) for fam in families for s in fam.samples]


def value(samples: list[Sample], name: str, **labels: str) -> float | None:
    hits = [v for n, lab, v in samples if n == name and lab == labels]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


@pytest.fixture
def served() -> Iterator[list[Exporter]]:
    """Exporters a test serves, closed afterwards (the hooks go back to dropping everything)."""
    made: list[Exporter] = []
    yield made
    for e in made:
        e.close()
    metrics.install(None)


def serve(made: list[Exporter], component: str) -> tuple[Exporter, str]:
    e = EXPORTERS[component]("b-test")
    made.append(e)
    metrics.install(e)
    host, port = e.serve("127.0.0.1", 0)
    return e, f"http://{host}:{port}/metrics"


# ---- hooks ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [("127.0.0.1:9736", ("127.0.0.1", 9736)), (":9737", ("0.0.0.0", 9737)), ("[::1]:0", ("::1", 0)),
     ("[198.51.100.7]:9736", ("198.51.100.7", 9736)),
     ("198.51.100.7:80", ("198.51.100.7", 80)), ("off", None), ("OFF", None)],
)
def test_metrics_address(text: str, want: tuple[str, int] | None) -> None:
    assert metrics.parse_address(text) == want


@pytest.mark.parametrize("text", ["9736", "localhost:9736", "127.0.0.1:http", "127.0.0.1:70000", "::1:80"])
def test_metrics_address_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected HOST:PORT|not an IP address|in brackets"):
        metrics.parse_address(text)


def test_retry_loop_counts_each_retry_and_conflict_under_the_calls_store(rec: Recorder) -> None:
    raised = [Conflict("x"), Conflict("x"), StoreBusy("busy"), StoreUnavailable("down")]

    def attempt() -> str:
        if raised:
            raise raised.pop(0)
        return "done"

    clock = Clock()
    with metrics.ipam_call("etcd", "ADD"):
        assert retrying(Retry(clock=clock, sleep=clock.sleep), "t", attempt) == "done"
    assert rec.seen == [
        ("conflict", "etcd", "pool", 1), ("retry", "etcd", "conflict"),
        ("conflict", "etcd", "pool", 1), ("retry", "etcd", "conflict"),
        ("retry", "etcd", "busy"), ("retry", "etcd", "unavailable"),
        ("ipam", "etcd", "ADD", 0),
    ]
    assert metrics.STORE.get() == ""  # the label ends with the call


def test_ipam_call_records_the_code_that_ends_it(rec: Recorder) -> None:
    with pytest.raises(TryAgainError), metrics.ipam_call("kubernetes", "DEL"):
        raise TryAgainError("store down")
    with pytest.raises(KeyError), metrics.ipam_call("local", "ADD"):
        raise KeyError("bug")
    assert rec.seen == [("ipam", "kubernetes", "DEL", 11), ("ipam", "local", "ADD", 999)]


def test_engine_counts_lost_pool_writes_and_reservation_races(rec: Recorder) -> None:
    clock = Clock()
    with metrics.ipam_call("kubernetes", "ADD"):
        assert addrs(make(store=Flaky(Backend(), 2), clock=clock).add(A)) == ["198.51.100.1"]
    assert rec.of("conflict") == [("conflict", "kubernetes", "pool", 1)] * 2
    assert rec.of("retry") == [("retry", "kubernetes", "conflict")] * 2
    rec.seen.clear()
    # .1 is reserved by a racer on the same network (no pool entry yet): lost once, then the lowest free
    # after the retry's point (0.5 of the range)
    store = MemoryStore(Backend())
    store.put_reservation(Reservation("198.51.100.1", B))
    with metrics.ipam_call("etcd", "ADD"):
        assert addrs(make(store=store).add(A)) == ["198.51.100.128"]
    assert rec.of("conflict") == [("conflict", "etcd", "reservation", 1)]


def test_the_agents_batches_count_races_once_under_their_callers_store(rec: Recorder) -> None:
    """The agent (ipam.batch): a batch runs on the pool combiner's own thread, in the context of the call
    that handed it over (ipam.combiner): its races are counted once per op, labelled with the caller's
    store, not with none (issue 45)."""
    store = MemoryStore(Backend())
    store.put_reservation(Reservation("198.51.100.1", B))  # a racer: .1 is lost once
    e = make(store=store)
    batch.install()
    try:
        with metrics.ipam_call("kubernetes", "ADD"):
            agent = Engine(e.store, e.conf, e.retry, reopen=lambda: contextlib.nullcontext(store),
                           execute=batch.run)
            got = addrs(agent.add(A))
        assert combiner.settle_all(30)
    finally:
        batch.uninstall()
    assert got == ["198.51.100.128"]
    assert rec.of("conflict") == [("conflict", "kubernetes", "reservation", 1)]


def conf(tmp_path: Path, rng: str = "198.51.100.0/24") -> dict[str, Any]:
    flat = tmp_path / "whereabouts.conf"
    flat.write_text("{}")
    ipam = {"type": "whereabouts", "range": rng, "datastore": "local", "local_db": str(tmp_path / "ipam.db"),
            "configuration_path": str(flat)}
    return {"cniVersion": "1.0.0", "name": "netA", "type": "macvlan", "ipam": ipam}


def call(command: str, cfg: dict[str, Any], cid: str) -> int:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/none",
           "CNI_IFNAME": f"net-{cid}", "CNI_PATH": "/usr/lib/cni", "CNI_ARGS": ARGS, "NODENAME": "node1"}
    return skel.run("whereabouts", env, io.BytesIO(jsonio.dumps(cfg)), io.BytesIO())


def test_whereabouts_calls_are_timed_per_store_with_their_code(rec: Recorder, tmp_path: Path) -> None:
    cfg = conf(tmp_path, "198.51.100.0/30")  # two addresses
    assert [call("ADD", cfg, f"c{i}") for i in range(3)] == [0, 0, 1]
    assert call("DEL", cfg, "c0") == 0
    assert rec.of("ipam") == [("ipam", "local", "ADD", 0), ("ipam", "local", "ADD", 0),
                              ("ipam", "local", "ADD", int(Code.POOL_EXHAUSTED)), ("ipam", "local", "DEL", 0)]


def test_plugin_call_never_imports_prometheus_client(tmp_path: Path) -> None:
    """An in-process whereabouts ADD and DEL in a fresh interpreter (`-X importtime`, and sys.modules,
    which also sees what importlib.import_module loads) run the hooks and import no exporter."""
    env = {**os.environ, "CNI_CONTAINERID": "c9", "CNI_NETNS": "/run/netns/none", "CNI_IFNAME": "net1",
           "CNI_PATH": "/usr/lib/cni", "CNI_ARGS": ARGS, "PYTHONPATH": PYTHONPATH, "PYCNI_AGENT": "off"}
    probe = ("import sys; from cni.__main__ import main; rc = main(['python', 'whereabouts']); "
             "sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)))")
    for command in ("ADD", "DEL"):
        p = subprocess.run([sys.executable, "-X", "importtime", "-c", probe], cwd=REPO,
                           input=jsonio.dumps(conf(tmp_path)), env={**env, "CNI_COMMAND": command},
                           capture_output=True, timeout=60, check=False)
        assert p.returncode == 0 and (command == "DEL" or b'"ips"' in p.stdout), p.stdout + p.stderr
        err = p.stderr.decode()
        loaded = set(err.rsplit("MODULES ", 1)[1].split()) | set(modules(err))
        assert {"cni.metrics", "ipam.retry", "ipam.exec_plain", "ipam.store.local"} <= loaded  # it works
        assert "ipam.combiner" not in loaded  # (the agent's: a plugin process never imports it)
        assert not {m for m in loaded if m.startswith(("prometheus_client", "cni.exporter", "wsgiref"))}


# ---- the agent ------------------------------------------------------------------------------------


def test_error_code_of_an_answer() -> None:
    assert server.error_code(0, b'{"cniVersion":"1.0.0"}\n') == 0
    assert server.error_code(1, b'{"cniVersion":"1.0.0","code":7,"msg":"x"}\n') == 7
    assert server.error_code(1, b"not json") == 999
    assert server.error_code(1, b'{"code":"7"}') == 999


def test_agent_counts_refused_callers(rec: Recorder, tmp_path: Path) -> None:
    import threading

    agent = server.Agent(str(tmp_path / "a.fifo"), "b1", allowed_uids=())
    agent.bind()
    t = threading.Thread(target=agent.serve, args=(1.0,), daemon=True)
    t.start()
    try:
        with pytest.raises(client.Unreachable, match="only root"):
            client.exchange(agent.path, "macvlan", "b1", "", b"{}")
    finally:
        agent.stop()
        t.join(30)
    assert rec.seen == [("refused", "uid")]


# ---- the exporter, scraped ------------------------------------------------------------------------


def test_agent_endpoint_serves_what_the_hooks_saw(served: list[Exporter]) -> None:
    exporter, url = serve(served, AGENT)
    sink = metrics.sink()
    assert sink is exporter
    sink.attach("macvlan", "ADD", 0.02, 0)
    sink.attach("macvlan", "ADD", 0.5, int(Code.INVALID_CONFIG))
    sink.attach("pycni-evil", "X" * 40, 0.1, 12345)  # unbounded values never become labels
    sink.refused("busy")
    sink.inflight(3)
    with metrics.ipam_call("kubernetes", "ADD"):
        metrics.retry("conflict")
        metrics.conflict("reservation", 2)
    got = scrape(url)
    hist = "pycni_attach_duration_seconds"
    assert value(got, hist + "_count", plugin="macvlan", command="ADD") == 2
    assert value(got, hist + "_sum", plugin="macvlan", command="ADD") == pytest.approx(0.52)
    assert value(got, hist + "_bucket", plugin="macvlan", command="ADD", le="0.025") == 1
    assert value(got, hist + "_count", plugin="other", command="other") == 1
    assert value(got, "pycni_attach_errors_total", plugin="macvlan", command="ADD", code="7") == 1
    assert value(got, "pycni_attach_errors_total", plugin="other", command="other", code="other") == 1
    assert value(got, "pycni_attach_errors_total", plugin="macvlan", command="ADD", code="0") is None
    assert value(got, "pycni_agent_refused_total", reason="busy") == 1
    assert value(got, "pycni_agent_inflight_requests") == 3
    assert value(got, "pycni_ipam_duration_seconds_count", store="kubernetes", command="ADD") == 1
    assert value(got, "pycni_ipam_retries_total", store="kubernetes", reason="conflict") == 1
    assert value(got, "pycni_ipam_conflicts_total", store="kubernetes", kind="reservation") == 2
    assert value(got, "pycni_build_info", component="agent", build="b-test") == 1
    names = {n for n, _, _ in got}
    assert "process_resident_memory_bytes" in names and "python_info" in names
    assert not [n for n in names if n.endswith("_created") or n.startswith("pycni_ipam_pool")]


def test_the_pod_watch_gauge_says_up_or_down_and_is_absent_while_the_watch_is_off(
        served: list[Exporter]) -> None:
    """pycni_podwatch_up (ipam/watchhealth.py sets it): no sample until the agent wants a watch and while
    it is off by configuration (an alert on 0 then fires only where a watch should run), 0 down, 1 up."""
    _, url = serve(served, AGENT)
    assert value(scrape(url), "pycni_podwatch_up") is None
    for up, want in ((False, 0.0), (True, 1.0), (False, 0.0), (None, None)):
        metrics.sink().watch_up(up)
        assert value(scrape(url), "pycni_podwatch_up") == want, up


def test_reconciler_endpoint_drops_pools_that_are_gone(served: list[Exporter]) -> None:
    exporter, url = serve(served, RECONCILER)
    exporter.pool("kubernetes", "198.51.100.0-24", 3, 254)
    exporter.pool("kubernetes", "blue-2001-db8---64", 1, 2**64 - 1)
    exporter.reconciled(1.5, True, {"allocation": 2, "reservation": 1})
    got = scrape(url)
    assert value(got, "pycni_ipam_pool_size", store="kubernetes", pool="198.51.100.0-24") == 254
    assert value(got, "pycni_ipam_pool_used", store="kubernetes", pool="198.51.100.0-24") == 3
    assert value(got, "pycni_ipam_pool_size", store="kubernetes", pool="blue-2001-db8---64") == 2.0**64
    assert value(got, "pycni_reconcile_freed_total", kind="reservation") == 1
    assert value(got, "pycni_reconcile_runs_total", result="ok") == 1
    assert (value(got, "pycni_reconcile_last_success_timestamp_seconds") or 0) > 1.7e9
    assert not [n for n, _, _ in got if n.startswith("pycni_attach")]
    exporter.pools_seen("kubernetes", {"198.51.100.0-24"})
    exporter.reconciled(0.5, False, {"allocation": 0, "reservation": 0})
    got = scrape(url)
    assert value(got, "pycni_ipam_pool_used", store="kubernetes", pool="blue-2001-db8---64") is None
    assert value(got, "pycni_ipam_pool_used", store="kubernetes", pool="198.51.100.0-24") == 3
    assert value(got, "pycni_reconcile_runs_total", result="error") == 1


# ---- the reconciler -------------------------------------------------------------------------------


def seeded_db(tmp_path: Path) -> str:
    path = str(tmp_path / "ipam.db")
    store = LocalStore(path)
    engine = Engine(store, from_dict({"datastore": "local", "range": "198.51.100.0/24",
                                      "network_name": "blue", "ipRanges": [{"range": "2001:db8::/120"}]}))
    for who in (A, B):
        engine.add(who)
    store.close()
    return path


class Pods:
    def __init__(self, *alive: PodInfo) -> None:
        self.alive = {(p.namespace, p.name): p for p in alive}

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        return self.alive.get((namespace, name))

    def close(self) -> None:
        pass


def test_reconcile_run_reports_every_pool_and_what_it_freed(rec: Recorder, tmp_path: Path) -> None:
    store = LocalStore(seeded_db(tmp_path))
    token = metrics.STORE.set("local")
    try:
        Reconciler(store, Pods(PodInfo("ns", "a", "uid-a"))).run()
    finally:
        metrics.STORE.reset(token)
        store.close()
    pools = {"blue-198.51.100.0-24", "blue-2001-db8---120"}
    # as the run leaves them: B's entries freed
    assert sorted(rec.of("pool")) == [("pool", "local", "blue-198.51.100.0-24", 1, 254),
                                      ("pool", "local", "blue-2001-db8---120", 1, 255)]
    assert rec.of("pools_seen") == [("pools_seen", "local", frozenset(pools))]
    # B's pod is gone: its two allocations and two reservations are freed
    assert rec.of("reconciled") == [("reconciled", True, {"allocation": 2, "reservation": 2})]


@contextlib.contextmanager
def reconciler_scraped(args: list[str], interval: float, wait: float) -> Iterator[list[Sample]]:
    """`python -m ipam ARGS reconcile ... --interval=INTERVAL --metrics=127.0.0.1:0` from source: its
    metrics, scraped once its first run is over (waiting up to `wait` s, however slow the machine); then
    SIGTERM, which it must answer with exit 0."""
    cmd = [sys.executable, "-m", "ipam", *args, f"--interval={interval:g}", "--metrics=127.0.0.1:0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": PYTHONPATH},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert line.startswith("metrics on http://127.0.0.1:"), line
        deadline = time.monotonic() + wait
        while True:
            got = scrape(line.split()[-1])
            if value(got, "pycni_reconcile_runs_total", result="ok") or time.monotonic() > deadline:
                break
            time.sleep(interval / 2)
        yield got
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_reconciler_process_serves_its_metrics(tmp_path: Path) -> None:
    db = seeded_db(tmp_path)
    pods = tmp_path / "pods.json"
    pods.write_text('[{"namespace": "ns", "name": "a", "uid": "uid-a"}]')
    with reconciler_scraped(["--local-db", db, "reconcile", f"--pods=file:{pods}"], 0.2, 60) as got:
        assert (value(got, "pycni_reconcile_runs_total", result="ok") or 0) >= 1
        assert value(got, "pycni_ipam_pool_size", store="local", pool="blue-198.51.100.0-24") == 254
        assert value(got, "pycni_ipam_pool_used", store="local", pool="blue-198.51.100.0-24") == 1  # B freed
        assert value(got, "pycni_reconcile_freed_total", kind="allocation") == 2
        assert value(got, "pycni_build_info", component="reconciler", build="source") == 1


# ---- flags ----------------------------------------------------------------------------------------


def test_agent_metrics_flag_env_default_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from cni.agent import main

    monkeypatch.delenv(main.METRICS_ENV, raising=False)
    assert main.parse([]).metrics == ("127.0.0.1", 9736)
    assert main.parse(["--metrics=off"]).metrics is None
    monkeypatch.setenv(main.METRICS_ENV, "[::1]:9999")
    assert main.parse([]).metrics == ("::1", 9999)
    with pytest.raises(SystemExit):
        main.parse(["--metrics=localhost:9736"])


def test_the_deferred_write_flags_are_gone() -> None:
    """The agent answers every call after its pool write: --defer-writes and --defer-idle are no more."""
    from cni.agent import main

    for gone in (["--defer-writes", "0.5"], ["--defer-idle", "2"]):
        with pytest.raises(SystemExit):
            main.parse(gone)


def test_a_taken_port_is_logged_and_bound_once_it_is_free(capfd: pytest.CaptureFixture[str]) -> None:
    import socket

    from cni.agent import main

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        main.serve_metrics(("127.0.0.1", port), "b1", every=0.05)
        exporter = metrics.sink()
        assert isinstance(exporter, EXPORTERS[AGENT])  # counting while there is no endpoint
        exporter.refused("busy")
        err = capfd.readouterr().err
        assert f"metrics not served on 127.0.0.1:{port}" in err and "metrics on" not in err
        taken.close()  # the old holder goes away: the agent binds it in the background
        deadline = time.monotonic() + 60
        while "metrics on" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
        assert f"metrics on http://127.0.0.1:{port}/metrics" in err
        got = scrape(f"http://127.0.0.1:{port}/metrics")
        assert value(got, "pycni_agent_refused_total", reason="busy") == 1
        exporter.close()
    finally:
        taken.close()
        metrics.install(None)
