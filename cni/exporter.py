"""Prometheus metrics of the node-local agent and of the reconciler, served over HTTP (prometheus_client).

The only module that imports prometheus_client (ruff's banned-api says so), and only the agent
(cni.agent.main) and the reconciler (ipam.cli) import it: a plugin call never does (cni.metrics holds
the hooks, which drop everything until an Exporter is installed). README.md "Metrics" lists the names.

Each process has its own registry (not prometheus_client's global one), with the process collectors
(CPU, memory, descriptors, GC) and the families of its component only."""

from __future__ import annotations

import threading
import time

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cni import metrics
from cni.errors import CODES
from cni.registry import PLUGINS

AGENT, RECONCILER = "agent", "reconciler"
DEFAULT_PORTS = {AGENT: 9736, RECONCILER: 9737}
COMMANDS = frozenset({"ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"})
# a CNI call: from a few ms (agent, local store) to the 120 s an IPAM may wait behind conflicts
CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
RUN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)


def plugin_label(name: str) -> str:
    return name if name in PLUGINS else "other"


def command_label(name: str) -> str:
    return name if name in COMMANDS else "other"


def code_label(code: int) -> str:
    return str(code) if code in CODES else "other"


def default_address(component: str) -> str:
    return f"127.0.0.1:{DEFAULT_PORTS[component]}"


class Exporter(metrics.Sink):
    """The installed sink of one process and its HTTP endpoint: what both components export (build,
    conflicts); AgentExporter and ReconcilerExporter add their own families. An observation of a
    family the component does not have is dropped (metrics.Sink's no-op)."""

    component = ""

    def __init__(self, build: str = "") -> None:
        # no `_created` series (process-wide; only the agent or the reconciler runs this)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = reg = CollectorRegistry(auto_describe=True)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            reg.register(collector)
        self._server: object | None = None
        info = Gauge("pycni_build_info", "The pycni build of this process (value 1).",
                     ["component", "build"], registry=reg)
        info.labels(self.component, build or "unknown").set(1)
        self.conflicts = Counter("pycni_ipam_conflicts_total",
                                 "Compare-and-swap writes lost to another writer, by object: pool, or "
                                 "reservation (for an ADD: the address was reserved by a racer first).",
                                 ["store", "kind"], registry=reg)

    def serve(self, host: str, port: int) -> tuple[str, int]:
        """Serve /metrics on host:port (port 0: any free one) from a daemon thread; the bound address.
        OSError when it cannot bind."""
        server, _ = start_http_server(port, host, self.registry)
        self._server = server
        bound = server.server_address
        return str(bound[0]), int(bound[1])

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()  # type: ignore[attr-defined]
            server.server_close()  # type: ignore[attr-defined]

    def conflict(self, store: str, kind: str, n: int = 1) -> None:
        self.conflicts.labels(store, kind).inc(n)


class AgentExporter(Exporter):
    """The agent: its calls, and the IPAM calls they make."""

    component = AGENT

    def __init__(self, build: str = "") -> None:
        super().__init__(build)
        reg = self.registry
        self.attach_seconds = Histogram("pycni_attach_duration_seconds",
                                        "CNI calls served by the agent, from READY to the answer.",
                                        ["plugin", "command"], buckets=CALL_BUCKETS, registry=reg)
        self.attach_errors = Counter("pycni_attach_errors_total",
                                     "CNI calls served by the agent that failed, by CNI error code.",
                                     ["plugin", "command", "code"], registry=reg)
        self.refusals = Counter("pycni_agent_refused_total",
                                "Calls the agent did not take (the plugin ran them in-process).",
                                ["reason"], registry=reg)
        self.running = Gauge("pycni_agent_inflight_requests", "Calls the agent is executing.", registry=reg)
        self.ipam_seconds = Histogram("pycni_ipam_duration_seconds",
                                      "IPAM calls (whereabouts) served in the agent, store opening included.",
                                      ["store", "command"], buckets=CALL_BUCKETS, registry=reg)
        self.ipam_errors = Counter("pycni_ipam_errors_total",
                                   "IPAM calls served in the agent that failed, by CNI error code.",
                                   ["store", "command", "code"], registry=reg)
        self.retries = Counter("pycni_ipam_retries_total",
                               "Store operations attempted again, by reason (conflict: a compare-and-swap "
                               "write lost; busy, unavailable: the store).",
                               ["store", "reason"], registry=reg)
        self.watch_events = Counter("pycni_podwatch_events_total",
                                    "Events of the watch on this node's pods, by type (GONE: a 410, listed "
                                    "again).", ["type"], registry=reg)
        self.watch_requests = Counter("pycni_podwatch_requests_total",
                                      "API requests of the pod watch and its sweeps, by verb (list, watch, "
                                      "get, patch, delete).", ["verb"], registry=reg)
        self.watch_sweeps = Histogram("pycni_podwatch_sweep_duration_seconds",
                                      "Sweeps freeing what deleted pods held.", buckets=CALL_BUCKETS,
                                      registry=reg)
        self.watch_failed = Counter("pycni_podwatch_sweep_errors_total",
                                    "Sweeps that failed or gave up on a pool (the reconciler frees later).",
                                    registry=reg)
        self.watch_freed = Counter("pycni_podwatch_freed_total",
                                   "Allocations and reservations of deleted pods freed by the pod watch.",
                                   registry=reg)
        self.watch_state = WatchUp()
        reg.register(self.watch_state)

    def attach(self, plugin: str, command: str, seconds: float, code: int) -> None:
        p, c = plugin_label(plugin), command_label(command)
        self.attach_seconds.labels(p, c).observe(seconds)
        if code:
            self.attach_errors.labels(p, c, code_label(code)).inc()

    def refused(self, reason: str) -> None:
        self.refusals.labels(reason).inc()

    def inflight(self, n: int) -> None:
        self.running.set(n)

    def ipam(self, store: str, command: str, seconds: float, code: int) -> None:
        c = command_label(command)
        self.ipam_seconds.labels(store, c).observe(seconds)
        if code:
            self.ipam_errors.labels(store, c, code_label(code)).inc()

    def retry(self, store: str, reason: str) -> None:
        self.retries.labels(store, reason).inc()

    def watch_event(self, kind: str) -> None:
        known = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR", "GONE")
        self.watch_events.labels(kind if kind in known else "other").inc()

    def watch_request(self, verb: str) -> None:
        known = ("list", "watch", "get", "patch", "delete", "put", "post")
        self.watch_requests.labels(verb if verb in known else "other").inc()

    def watch_swept(self, seconds: float, ok: bool, freed: int) -> None:
        self.watch_sweeps.observe(seconds)
        if not ok:
            self.watch_failed.inc()
        self.watch_freed.inc(freed)

    def watch_up(self, up: bool | None) -> None:
        self.watch_state.up = up


class WatchUp(Collector):
    """`pycni_podwatch_up`: 1 while the pod watch works, 0 while it is wanted and does not (no flat file
    yet, the API server out of reach, credentials refused, a thread restarting); no sample while it is
    off by configuration (no NODENAME, --pod-watch=off, a store other than Kubernetes), so that an alert
    on 0 fires only where a watch should run."""

    NAME = "pycni_podwatch_up"
    HELP = "Whether the pod watch works: 1 up, 0 down (absent when it is off by configuration)."

    def __init__(self) -> None:
        self.up: bool | None = None

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.HELP)]

    def collect(self) -> list[GaugeMetricFamily]:
        up = self.up
        return [] if up is None else [GaugeMetricFamily(self.NAME, self.HELP, value=1.0 if up else 0.0)]


class ReconcilerExporter(Exporter):
    """The reconciler: every pool it lists, and its runs."""

    component = RECONCILER

    def __init__(self, build: str = "") -> None:
        super().__init__(build)
        reg = self.registry
        self._lock = threading.Lock()
        self._pools: dict[str, set[str]] = {}  # store -> pool names exported
        self.pool_size = Gauge("pycni_ipam_pool_size",
                               "Addresses of the pool's range (network and IPv4 broadcast not counted), "
                               "as of the last reconcile run.", ["store", "pool"], registry=reg)
        self.pool_used = Gauge("pycni_ipam_pool_used", "Addresses allocated in the pool, as of the last "
                               "reconcile run.", ["store", "pool"], registry=reg)
        self.run_seconds = Histogram("pycni_reconcile_duration_seconds", "Reconcile runs.",
                                     buckets=RUN_BUCKETS, registry=reg)
        self.runs = Counter("pycni_reconcile_runs_total", "Reconcile runs, by result (ok, error).",
                            ["result"], registry=reg)
        self.freed = Counter("pycni_reconcile_freed_total",
                             "Allocations and reservations freed because their pod is gone.", ["kind"],
                             registry=reg)
        self.last_success = Gauge("pycni_reconcile_last_success_timestamp_seconds",
                                  "When the last reconcile run without errors ended (Unix time).",
                                  registry=reg)

    def pool(self, store: str, name: str, used: int, size: int) -> None:
        with self._lock:
            self._pools.setdefault(store, set()).add(name)
        self.pool_size.labels(store, name).set(size)
        self.pool_used.labels(store, name).set(used)

    def pools_seen(self, store: str, names: set[str]) -> None:
        with self._lock:
            gone = self._pools.get(store, set()) - names
            self._pools[store] = set(names)
        for name in gone:
            self.pool_size.remove(store, name)
            self.pool_used.remove(store, name)

    def reconciled(self, seconds: float, ok: bool, freed: dict[str, int]) -> None:
        self.run_seconds.observe(seconds)
        self.runs.labels("ok" if ok else "error").inc()
        for kind, n in freed.items():
            self.freed.labels(kind).inc(n)
        if ok:
            self.last_success.set(time.time())


EXPORTERS: dict[str, type[Exporter]] = {AGENT: AgentExporter, RECONCILER: ReconcilerExporter}


def install(component: str, build: str = "") -> Exporter:
    """Create the component's exporter and install it as the process' sink (cni.metrics)."""
    exporter = EXPORTERS[component](build)
    metrics.install(exporter)
    return exporter


def url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"
