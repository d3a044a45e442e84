"""`make bench-ipam-scale`: upstream whereabouts v0.9.4 and pycni's whereabouts side by side on one real
kube-apiserver (tests/kubeup.py), at pod scale. Not a timed test: it prints markdown tables and writes a
JSON result file.

Workload (flags): P pods x N networks per pod on K simulated nodes; each node starts C pods at a time and
a pod's N attachments run one after another (as Multus does them). Every attachment is one IPAM plugin
process: CNI_COMMAND=ADD, CNI_CONTAINERID = the pod's sandbox id, CNI_IFNAME=net1..netN, a dummy
CNI_NETNS (never created: IPAM only), CNI_ARGS with K8S_POD_NAMESPACE/K8S_POD_NAME/K8S_POD_UID,
NODENAME = the node, the network's config on stdin. Range modes: `shared` (every network uses
198.18.0.0/20, no network_name: one IPPool for all), `per-network` (network i: 198.19.i.0/24) and
`slices` (node slices, whereabouts' "fast IPAM": every network on 198.18.64.0/18 with `node_slice_size`
"/23" and one `network_name`, so all networks share one NodeSlicePool and each node allocates from its
own slice's IPPool, the node's pool for every network; 32 slices of 510 addresses, or /24 slices when
more than 32 nodes need one). Then the DEL phase, same shape, for every attachment the ADD phase started.

Layouts (--layouts 8x4,32x1,64x1, issue 44): the same run in several layouts of K nodes x C pods at once
per node, one after another within each run (each layout: every implementation, every mode), each
compared against the upstream of its own run and layout; per layout 2 pods for each of its K x C
workers unless --pods fixes the count (tests/bench/ipam_layouts.py: why, the summaries and the guard's
verdicts).

Slices, with `--slices-by controller` (the default) for every implementation alike: the simulated
nodes' Node objects and one NetworkAttachmentDefinition per network (its config as the calls get it) are
created in the run's namespace, upstream's v0.9.4 node-slice-controller (../shared/upstream `unpack
whereabouts-node-slice-controller`, admin kubeconfig, WHEREABOUTS_NAMESPACE = the run's namespace) is
started before the ADD phase, which begins once the NodeSlicePool gives every simulated node a slice;
the controller is stopped, the NADs and the Node objects deleted after the DEL phase (the NodeSlicePool
and the empty pools remain). pycni would assign the slices itself without a controller (`--slices-by
plugin`: pycni only, upstream's plugin needs the controller; `--slices-by own`: upstream through the
controller, pycni by the plugin, in the same runs); the controller's own requests (its informers' LIST
and WATCH, NodeSlicePool updates) fall in the phases' request deltas, a few per run.

Implementations, each in a fresh namespace (kubeup.Tenant) per range mode on the same server:
- upstream: the real binary (../shared/upstream `unpack whereabouts`), its flat file and inline-token
  kubeconfig in the temp dir, a ServiceAccount bound to upstream's ClusterRole rules (anchor notes 5.9:
  whereabouts objects, leases, pods, nodes, NADs, events), NODENAME set;
- pycni: the frozen `whereabouts` entry (dist/cni-bin) with PYCNI_AGENT=off (--source: `python -m cni
  whereabouts`), the tenant's node kubeconfig (tokenFile, rbac.yaml as shipped);
- pycni+agent: one `pycni-agent` per simulated node (own FIFO), every call through the shim with
  PYCNI_AGENT_FIFO set; the agents' logs must show they served every call (fallbacks are counted).

Per implementation, mode and phase: wall time, attachments/s, p50/p99 per call and per pod, API requests
per attachment split by verb/resource with 409/422 (deltas of apiserver_request_total), answers 504
(see answers_504: those of the server's timeout filter are recorded as 500 there), API-server CPU
seconds, where the machine's CPU went (the API server, its etcd, the plugin processes of the calls, the
agents, this harness: /proc and getrusage deltas; the phase's budget is CPUs x wall), failures (count,
distinct messages), speed against upstream, and a check of the objects (after
ADD: no address in two pool entries across the namespace's pools, every entry has its reservation and
vice versa, one entry per successful attachment holding the address the call returned; slices: every
simulated node has its own slice in the NodeSlicePool and each entry is in the pool of its node's
slice; after DEL: pools empty, no reservations). With agents, their start-up time and memory (PSS) idle
and after each phase. Then "one uncontended ADD" (and DEL): a process per call, median of --single (in
the first layout of the first run).

The request deltas are server-wide: the kube-apiserver's own requests (its identity Lease, a PUT every
10 s; its informers' WATCH restarts) are in them too, a few per minute; the details line leaves out
what is under 0.01 per attachment. No Pod objects are created (neither IPAM needs them for ADD/DEL).

Every phase has a time budget (--budget; attachments not started by then are reported as not done) and
every call a timeout. Everything written goes into a temp dir that is removed, except the JSON result.

    python -m tests.bench.ipam_scale [--pods 64 --networks 8 --nodes 8 --concurrency 4]
        [--layouts 8x4,32x1,64x1 [--pods-per-slot 2]] [--repeat N]
        [--mode shared|per-network|slices|both|all] [--impl upstream|pycni|pycni+agent ...]
        [--scenario 313] [--slices-by controller|plugin|own] [--source] [--budget S] [--json PATH]
    (both: shared and per-network; all: shared, per-network and slices; root for the agents; `make
    bundle` first)"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from tests import agentutil, kubeup
from tests.bench import ipam_layouts
from tests.bench.ipam import pct
from tests.bench.ipam_layouts import DUPLICATE, NOT_DELETED, Layout
from tests.kubeapi import wbupstream
from tests.nsutil import REPO

BUNDLE = REPO / "dist" / "cni-bin"
SHARED_RANGE = "198.18.0.0/20"
FULL_BASE = "198.18.16.0"  # --full-pool: the smallest network from here that holds the attachments
SETTLE = 60.0  # seconds the check after DEL waits for the objects to settle (nothing left, or a leak)
SINGLE_RANGE = "198.18.32.0/24"  # the uncontended ADDs: outside the workload ranges
SLICES_RANGE, SLICE_SIZE = "198.18.64.0/18", "/23"  # mode slices: 32 slices of 510 addresses
SLICES_NETWORK = "bench-slices"  # every network's network_name: one NodeSlicePool
SLICE_WAIT = 60.0  # seconds the node-slice-controller gets to give every simulated node a slice
CALL_TIMEOUT = 150.0  # upstream's own ADD limit is 2 min
# Paths our IPAM, our agent or upstream's IPAM would use when a config does not say otherwise: none may
# appear. (Not /var/lib/cni/pycni itself: the device plugins' locks live there, and other test runs on a
# shared machine make it.)
DEFAULT_PATHS = ("/var/lib/cni/pycni/whereabouts.db", "/var/lib/cni/pycni/whereabouts.db-wal",
                 "/var/lib/cni/pycni/pool-locks",
                 "/etc/cni/net.d/whereabouts.d", "/run/pycni/agent.fifo",
                 "/etc/kubernetes/cni/net.d/whereabouts.d", "/host/etc/cni/net.d/whereabouts.d")
UPSTREAM_RULES: list[dict[str, Any]] = [  # ClusterRole whereabouts-cni (doc/crds/daemonset-install.yaml)
    {"apiGroups": ["whereabouts.cni.cncf.io"],
     "resources": ["ippools", "overlappingrangeipreservations", "nodeslicepools"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "get"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"],
     "verbs": ["create", "patch", "update", "get"]},
]


# ---- the workload ---------------------------------------------------------------------------------


@dataclass
class Workload:
    pods: int = 64
    networks: int = 8
    nodes: int = 8
    concurrency: int = 4
    mode: str = "shared"  # or "per-network", "slices"
    budget: float = 600.0  # seconds per phase: no attachment starts after it
    call_timeout: float = CALL_TIMEOUT
    slice_controller: bool = True  # mode slices: upstream's node-slice-controller assigns (else the plugin)
    full: bool = False  # mode shared: a range whose range_end leaves exactly `attachments` addresses
    slice_size: str = SLICE_SIZE  # mode slices: the node_slice_size of every network

    @property
    def layout(self) -> str:
        return Layout(self.nodes, self.concurrency).label

    def node(self, pod: int) -> str:
        return f"node-{pod % self.nodes}"

    def range(self, net: int) -> str:
        if self.mode == "slices":
            return SLICES_RANGE
        if self.mode == "shared" and self.full:
            return full_range(self.attachments)[0]
        return SHARED_RANGE if self.mode == "shared" else f"198.19.{net}.0/24"

    def range_end(self) -> str:
        """A full pool's last address ("" otherwise): the pool holds exactly `attachments` addresses."""
        return full_range(self.attachments)[1] if self.mode == "shared" and self.full else ""

    @property
    def per_node(self) -> int:
        """The most attachments one node makes."""
        return -(-self.pods // self.nodes) * self.networks

    def slices_fit(self) -> str:
        """Why mode slices cannot hold this workload ("" when it can)."""
        net = ipaddress.ip_network(SLICES_RANGE)
        size = int(self.slice_size.lstrip("/"))
        slices, per_slice = 2 ** (size - net.prefixlen), 2 ** (32 - size) - 2
        if self.nodes > slices or self.per_node > per_slice:
            return (f"mode slices: {SLICES_RANGE} in {self.slice_size} slices is {slices} slices of "
                    f"{per_slice} addresses; {self.nodes} nodes with up to {self.per_node} attachments "
                    "each do not fit")
        return ""

    def unfit(self) -> str:
        """Why the range of this workload's mode cannot hold its attachments ("" when it can)."""
        if self.mode == "slices":
            return self.slices_fit()
        if self.mode == "per-network":
            if self.networks > 255 or self.pods > 254:
                return (f"mode per-network: 198.19.<network>.0/24 holds 254 pods on up to 255 networks, "
                        f"not {self.pods} pods on {self.networks}")
            return ""
        if not self.full and self.attachments > ipaddress.ip_network(SHARED_RANGE).num_addresses - 2:
            return f"mode shared: {SHARED_RANGE} does not hold {self.attachments} attachments"
        return ""

    @property
    def attachments(self) -> int:
        return self.pods * self.networks


def full_range(n: int) -> tuple[str, str]:
    """(the smallest network at FULL_BASE holding `n` host addresses, the range_end that leaves exactly
    `n` of them: the first usable address up to that one)."""
    prefix = 30
    while 2 ** (32 - prefix) - 2 < n:
        prefix -= 1
    net = ipaddress.ip_network(f"{FULL_BASE}/{prefix}")
    return str(net), str(net.network_address + n)


@dataclass
class Call:
    pod: int
    net: int  # 1..N (CNI_IFNAME net<N>)
    node: str
    ok: bool
    seconds: float
    start: float
    end: float
    ip: str = ""
    error: str = ""


@dataclass
class Pod:
    index: int
    namespace: str
    prefix: str  # tells the implementations' sandboxes apart

    @property
    def name(self) -> str:
        return f"pod-{self.index}"

    @property
    def sandbox(self) -> str:
        return f"{self.prefix}{self.index:08x}".rjust(64, "0")

    @property
    def uid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_OID, self.sandbox))


class Impl:
    """One IPAM implementation: how to run a call, its config, and the namespace it works in."""

    label = ""
    tenant: kubeup.Tenant

    def setup(self, tenant: kubeup.Tenant, scratch: Path) -> None:
        self.tenant = tenant
        self.scratch = scratch
        self.cni_path = scratch / "cni-path"  # empty: the IPAM delegates to nothing
        self.cni_path.mkdir(parents=True, exist_ok=True)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self, node: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}

    def ipam(self, rng: str) -> dict[str, Any]:
        raise NotImplementedError

    def served(self) -> Counter[str]:
        """Calls an agent answered, by command ('ADD', 'DEL'); empty without agents."""
        return Counter()

    def helper_pids(self) -> list[int]:
        """Long-lived processes of the implementation on the nodes (pycni's agents); none by default."""
        return []

    def helper_pss_mib(self) -> float | None:
        """The memory of helper_pids (proportional set size, MiB, summed); None without any."""
        pids = self.helper_pids()
        return round(sum(pss_mib(pid) for pid in pids), 1) if pids else None

    def close(self) -> None:
        pass


def pss_mib(pid: int) -> float:
    """Process `pid`'s proportional set size in MiB (its share of the pages it shares; 0 once gone)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0.0
    return sum(int(line.split()[1]) for line in text.splitlines() if line.startswith("Pss:")) / 1024


def network_config(impl: Impl, wl: Workload, net: int) -> bytes:
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": f"bench-net{net}", "type": "macvlan",
            "ipam": impl.ipam(wl.range(net))}
    if wl.mode == "slices":
        conf["ipam"].update(node_slice_size=wl.slice_size, network_name=SLICES_NETWORK)
    if wl.range_end():
        conf["ipam"]["range_end"] = wl.range_end()
    return json.dumps(conf).encode()


def call_env(impl: Impl, command: str, pod: Pod, net: int, node: str) -> dict[str, str]:
    return {
        **impl.env(node),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": pod.sandbox,
        "CNI_NETNS": f"/var/run/netns/bench-{pod.sandbox[-12:]}",  # a name only: never created or read
        "CNI_IFNAME": f"net{net}",
        "CNI_PATH": str(impl.cni_path),
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name};"
                    f"K8S_POD_INFRA_CONTAINER_ID={pod.sandbox};K8S_POD_UID={pod.uid}",
        "NODENAME": node,
    }


def error_text(stdout: bytes, stderr: bytes, rc: int) -> str:
    try:
        doc = json.loads(stdout)
        if isinstance(doc, dict) and "msg" in doc:
            details = f": {doc['details']}" if doc.get("details") else ""
            return f"code {doc.get('code')}: {doc['msg']}{details}"[:300]
    except ValueError:
        pass
    tail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [stdout.decode(errors="replace")]
    return f"rc {rc}: {tail[0][:300]}"


def one_call(impl: Impl, wl: Workload, command: str, pod: Pod, net: int, confs: dict[int, bytes],
             deadline: float) -> Call:
    node = wl.node(pod.index)
    timeout = max(1.0, min(wl.call_timeout, deadline + wl.call_timeout - time.monotonic()))
    start = time.perf_counter()
    try:
        proc = subprocess.run(impl.argv(), input=confs[net], capture_output=True, timeout=timeout,
                              env=call_env(impl, command, pod, net, node), cwd=impl.scratch, check=False)
    except subprocess.TimeoutExpired:
        end = time.perf_counter()
        return Call(pod.index, net, node, False, end - start, start, end,
                    error=f"timeout after {timeout:.0f} s")
    end = time.perf_counter()
    if proc.returncode != 0:
        return Call(pod.index, net, node, False, end - start, start, end,
                    error=error_text(proc.stdout, proc.stderr, proc.returncode))
    ip = ""
    if command == "ADD":
        try:
            ip = str(json.loads(proc.stdout)["ips"][0]["address"]).split("/")[0]
        except (ValueError, KeyError, IndexError, TypeError):
            return Call(pod.index, net, node, False, end - start, start, end,
                        error=f"no address in the result: {proc.stdout[:200]!r}")
    return Call(pod.index, net, node, True, end - start, start, end, ip=ip)


def run_phase(impl: Impl, wl: Workload, command: str, pods: list[Pod],
              nets: dict[int, list[int]] | None = None) -> tuple[list[Call], float]:
    """Every pod's attachments (`nets[pod]`, default 1..N) in order; K nodes with C workers each taking
    the node's next pod. No attachment starts after the phase budget. (calls, wall seconds)"""
    confs = {net: network_config(impl, wl, net) for net in range(1, wl.networks + 1)}
    queues: dict[str, queue.SimpleQueue[Pod]] = {f"node-{k}": queue.SimpleQueue() for k in range(wl.nodes)}
    for pod in pods:
        queues[wl.node(pod.index)].put(pod)
    calls: list[Call] = []
    lock = threading.Lock()
    start = time.monotonic()
    deadline = start + wl.budget

    def worker(q: queue.SimpleQueue[Pod]) -> None:
        while time.monotonic() < deadline:
            try:
                pod = q.get_nowait()
            except queue.Empty:
                return
            for net in (nets or {}).get(pod.index, range(1, wl.networks + 1)):
                if time.monotonic() >= deadline:
                    return
                c = one_call(impl, wl, command, pod, net, confs, deadline)
                with lock:
                    calls.append(c)

    threads = [threading.Thread(target=worker, args=(q,), daemon=True)
               for q in queues.values() for _ in range(wl.concurrency)]
    for t in threads:
        t.start()
    for t in threads:  # each call is bounded by its timeout, so this ends by deadline + call timeout
        t.join(wl.budget + 2 * wl.call_timeout)
    wall = time.monotonic() - start
    with lock:
        return list(calls), wall


# ---- what the server holds --------------------------------------------------------------------------


def _normal(ip: str) -> str:
    """An address as whereabouts names its reservation (IPv6 ':' -> '-', a trailing ':' gets a '0')."""
    text = str(ipaddress.ip_address(ip))
    return (text + "0" if text.endswith(":") else text).replace(":", "-")


def held(tenant: kubeup.Tenant) -> list[tuple[str, str, dict[str, Any]]]:
    """(pool, ip, entry) of every allocation in every IPPool of the namespace."""
    out = []
    for pool in tenant.objects("ippools"):
        net = ipaddress.ip_network(pool["spec"]["range"], strict=False)
        for offset, entry in (pool["spec"].get("allocations") or {}).items():
            out.append((pool["metadata"]["name"], str(net.network_address + int(offset)), entry))
    return out


def check_after_add(tenant: kubeup.Tenant, calls: list[Call], pods: dict[int, Pod],
                    overlapping: bool = True, network_name: str = "") -> list[str]:
    """Problems with the objects after an ADD phase ([] when consistent). With a `network_name` the
    reservations are named `<network_name>-<ip>` (as both implementations name them)."""
    problems: list[str] = []
    entries = held(tenant)
    seen: dict[str, str] = {}
    for pool, ip, _ in entries:
        if ip in seen:
            problems.append(f"{DUPLICATE}{ip} held twice ({seen[ip]}, {pool})")
        seen[ip] = pool
    ok = [c for c in calls if c.ok]
    returned = Counter(c.ip for c in ok)
    problems += [f"{DUPLICATE}{ip} returned to {n} attachments" for ip, n in returned.items() if n > 1]
    if len(entries) != len(ok):
        problems.append(f"{len(entries)} pool entries for {len(ok)} successful attachments")
    by_owner = {(e.get("id"), e.get("ifname")): ip for _, ip, e in entries}
    for c in ok:
        got = by_owner.get((pods[c.pod].sandbox, f"net{c.net}"))
        if got != c.ip:
            problems.append(f"pod-{c.pod} net{c.net} returned {c.ip}, its pool entry holds {got}")
    reservations = tenant.reservations()
    if overlapping:
        named = f"{network_name}-" if network_name else ""
        podref = {named + _normal(ip): e.get("podref") for _, ip, e in entries}
        for name, ref in podref.items():
            if name not in reservations:
                problems.append(f"{name} allocated without a reservation")
            elif reservations[name].get("podref") != ref:
                theirs = reservations[name].get("podref")
                problems.append(f"{name}: reservation for {theirs}, pool entry {ref}")
        problems += [f"reservation {n} without an allocation" for n in reservations if n not in podref]
    elif reservations:
        problems.append(f"{len(reservations)} reservations with overlapping ranges off")
    return problems


def slice_assignments(tenant: kubeup.Tenant) -> dict[str, str]:
    """node -> slice CIDR in the namespace's NodeSlicePool of SLICES_NETWORK ({} while it is absent)."""
    try:
        nsp = tenant.server.request("GET", tenant.path("nodeslicepools", SLICES_NETWORK))
    except kubeup.ApiFailure as e:
        if e.status == 404:
            return {}
        raise
    return {a["nodeName"]: a["sliceRange"] for a in (nsp.get("status") or {}).get("allocations") or []
            if a.get("nodeName")}


def check_slices(tenant: kubeup.Tenant, wl: Workload, calls: list[Call], pods: dict[int, Pod]) -> list[str]:
    """Mode slices, after ADD: every simulated node has a slice of its own, and each attachment's entry is
    in the IPPool of its node's slice (upstream's name `<network_name>-<node>-<slice>`), inside it."""
    problems: list[str] = []
    got = slice_assignments(tenant)
    nodes = [f"node-{k}" for k in range(wl.nodes)]
    problems += [f"{n} has no slice" for n in nodes if n not in got]
    twice = Counter(got.values())
    problems += [f"slice {r} assigned to {n} nodes" for r, n in twice.items() if n > 1]
    pool_of = {(e.get("id"), e.get("ifname")): pool for pool, _, e in held(tenant)}
    for c in calls:
        if not c.ok or c.node not in got:
            continue
        rng = got[c.node]
        want = f"{SLICES_NETWORK}-{c.node}-{rng.replace('/', '-')}"
        pool = pool_of.get((pods[c.pod].sandbox, f"net{c.net}"))
        if pool != want:
            problems.append(f"pod-{c.pod} net{c.net} on {c.node}: entry in pool {pool}, not {want}")
        if ipaddress.ip_address(c.ip) not in ipaddress.ip_network(rng):
            problems.append(f"pod-{c.pod} net{c.net} on {c.node}: {c.ip} outside its slice {rng}")
    return problems


def left_after_del(tenant: kubeup.Tenant) -> list[str]:
    problems = [f"{ip} still held in {pool} by {e.get('podref')}" for pool, ip, e in held(tenant)]
    problems += [f"reservation {n} left" for n in tenant.reservations()]
    return problems


def check_after_del(tenant: kubeup.Tenant, settle: float = SETTLE) -> list[str]:
    """What is left once the objects settle: every DEL answered success, so nothing may remain. Polled
    until nothing is left or `settle` seconds have passed (a write still landing is not a leak; what
    remains after that is)."""
    deadline = time.monotonic() + settle
    while (problems := left_after_del(tenant)) and time.monotonic() < deadline:
        time.sleep(1.0)
    return problems


# ---- figures --------------------------------------------------------------------------------------


@dataclass
class PhaseReport:
    impl: str
    mode: str
    phase: str
    attachments: int  # the phase's attachments, including those the budget left out
    done: int  # calls that succeeded
    attempted: int
    wall_s: float
    per_s: float
    call_p50_ms: float
    call_p99_ms: float
    pod_p50_ms: float
    pod_p99_ms: float
    api_requests: float  # resource requests (not /metrics and other non-resource paths)
    api_per_attachment: float
    api_409: float
    api_422: float
    api_other_errors: float
    api_split: dict[str, float]  # "VERB resource[ code>=400]" -> count
    api_cpu_s: float
    failures: int
    failure_messages: dict[str, int]
    agent_served: int | None
    problems: list[str] = field(default_factory=list)
    load_avg: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # etcd requests for pools ("update ippools", "get ippools"): each pool write the server had to redo
    # (the object changed under it meanwhile) is one more update
    etcd_split: dict[str, float] = field(default_factory=dict)
    # CPU seconds of the phase by whom (see measure): the machine's whole budget is CPUs x wall
    cpu_split: dict[str, float] = field(default_factory=dict)
    left: int | None = None  # DEL: pool entries and reservations left once the objects settled
    agent_ms: tuple[float, float] | None = None  # pycni+agent: p50/p99 of the calls as the agents timed them
    run: int = 0  # which run of --repeat: compared against that run's upstream
    layout: str = ""  # NODESxPODS (pods at once per node): compared against that layout's upstream
    # answers 504 (see answers_504): the handlers' own, and those of the server's timeout filter
    api_504: float = 0.0
    api_504_cut: float = 0.0
    duplicates: int = 0  # problems of the check after ADD that are an address held or returned twice
    agents_pss_mib: float | None = None  # the agents' memory (proportional set size) after the phase


class Measured(NamedTuple):
    requests: dict[tuple[str, ...], float]  # API requests by verb, resource and code
    api_cpu: float  # the API server's CPU seconds
    storage: dict[tuple[str, ...], float]  # its etcd requests by operation and resource
    cpu: dict[str, float]  # CPU seconds by whom
    terminations: dict[tuple[str, ...], float]  # requests the server answered itself (504, 429)


def measure(server: kubeup.KubeServer, impl: Impl) -> Measured:
    """The server's counters (one /metrics page) and CPU seconds so far by whom: the API server, its
    etcd, the plugin processes (this process' waited-for children: every call's process, shim or
    plugin), the implementation's agents, this harness."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = resource.getrusage(resource.RUSAGE_SELF)
    api = server.cpu_seconds()
    cpu = {"API server": api, "etcd": server.etcd_cpu_seconds(),
           "plugin processes": children.ru_utime + children.ru_stime,
           "agents": sum(kubeup.process_cpu_seconds(pid) for pid in impl.helper_pids()),
           "harness": own.ru_utime + own.ru_stime}  # fmt: skip
    text = server.metrics()
    return Measured(server.request_counts(text), api, server.storage_counts(text), cpu,
                    server.termination_counts(text))


def answers_504(before: Measured, after: Measured) -> tuple[float, float]:
    """Resource requests answered 504 between the two: (those a handler answered itself, counted in
    apiserver_request_total: a storage timeout, a resourceVersion the cache does not reach; those the
    server's timeout filter answered, apiserver_request_terminations_total). The handler behind the
    filter's answer goes on and records a code of its own in apiserver_request_total, mostly 500 and
    sometimes 504 (measured: 20 pool PATCHes past their deadline, 19 recorded as 500, 1 as 504): so the
    first count alone misses most of them, and the sum may count one twice. It is 0 only when no request
    was answered 504."""

    def delta(now: dict[tuple[str, ...], float], then: dict[tuple[str, ...], float]) -> float:
        return sum(v - then.get(k, 0.0) for k, v in now.items() if k[1] and k[2] == "504")

    return delta(after.requests, before.requests), delta(after.terminations, before.terminations)


def report(impl: Impl, wl: Workload, phase: str, calls: list[Call], wall: float, planned: int,
           before: Measured, after: Measured, problems: list[str], served: int | None) -> PhaseReport:
    delta = {k: v - before.requests.get(k, 0.0) for k, v in after.requests.items()
             if v - before.requests.get(k, 0.0) > 0}
    storage = {f"{op} {res}": v - before.storage.get((op, res), 0.0) for (op, res), v in after.storage.items()
               if res == "ippools" and v - before.storage.get((op, res), 0.0) > 0}  # fmt: skip
    resource = {k: v for k, v in delta.items() if k[1]}
    split: dict[str, float] = {}
    for (verb, res, code), v in resource.items():
        key = f"{verb} {res}" + (f" {code}" if code >= "400" else "")
        split[key] = split.get(key, 0.0) + v
    total = sum(resource.values())
    ok = [c for c in calls if c.ok]
    secs = [c.seconds for c in calls] or [0.0]
    per_pod: dict[int, list[Call]] = {}
    for c in calls:
        per_pod.setdefault(c.pod, []).append(c)
    full = [max(c.end for c in cs) - min(c.start for c in cs)
            for cs in per_pod.values() if len(cs) == wl.networks] or [0.0]
    failures = Counter(c.error for c in calls if not c.ok)
    handler_504, cut_504 = answers_504(before, after)
    return PhaseReport(
        impl.label, wl.mode, phase, planned, len(ok), len(calls), wall, len(ok) / wall if wall else 0.0,
        1000 * pct(secs, 50), 1000 * pct(secs, 99), 1000 * pct(full, 50), 1000 * pct(full, 99),
        total, total / max(1, len(calls)),
        sum(v for k, v in resource.items() if k[2] == "409"),
        sum(v for k, v in resource.items() if k[2] == "422"),
        sum(v for k, v in resource.items() if k[2] >= "400" and k[2] not in ("409", "422", "404")),
        dict(sorted(split.items(), key=lambda kv: -kv[1])), after.api_cpu - before.api_cpu,
        sum(failures.values()), dict(failures.most_common(10)), served, problems, os.getloadavg(), storage,
        {k: round(v - before.cpu.get(k, 0.0), 2) for k, v in after.cpu.items()},
        layout=wl.layout, api_504=handler_504, api_504_cut=cut_504,
        duplicates=sum(p.startswith(DUPLICATE) for p in problems),
        agents_pss_mib=impl.helper_pss_mib(),
    )


class SliceController:
    """Mode slices: the simulated nodes' Node objects, a NAD per network, and upstream's v0.9.4
    node-slice-controller for the tenant's namespace, as admin (as tests/kubeapi/test_node_slices.py)."""

    def __init__(self, impl: Impl, wl: Workload, tenant: kubeup.Tenant, scratch: Path) -> None:
        self.impl, self.wl, self.tenant, self.scratch = impl, wl, tenant, scratch
        self.log = scratch / "node-slice-controller.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.nads: list[str] = []
        self.assigned_s = 0.0

    def start(self) -> SliceController:
        """Nodes and NADs, then the controller; returns once every simulated node has a slice."""
        server, ns = self.tenant.server, self.tenant.namespace
        for k in range(self.wl.nodes):  # cluster-scoped; the controller frees slices of absent Nodes
            wbupstream.create_node(server, f"node-{k}")
        for net in range(1, self.wl.networks + 1):
            conf = json.loads(network_config(self.impl, self.wl, net))
            wbupstream.create_nad(self.tenant, conf)
            self.nads.append(conf["name"])
        kubeconfig = wbupstream.admin_kubeconfig(server, self.scratch / "controller.kubeconfig", ns)
        binary = kubeup.unpack("whereabouts-node-slice-controller") / "whereabouts-node-slice-controller"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "WHEREABOUTS_NAMESPACE": ns}
        start = time.monotonic()
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([str(binary), "-kubeconfig", str(kubeconfig)], env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        nodes = {f"node-{k}" for k in range(self.wl.nodes)}
        while not nodes <= slice_assignments(self.tenant).keys():
            if self.proc.poll() is not None or time.monotonic() - start > SLICE_WAIT:
                tail = self.log.read_text(errors="replace").splitlines()[-20:]
                raise RuntimeError(f"the node-slice-controller gave not every node a slice within "
                                   f"{SLICE_WAIT:g} s (exit {self.proc.poll()}):\n" + "\n".join(tail))
            time.sleep(0.1)
        self.assigned_s = time.monotonic() - start
        return self

    def stop(self) -> None:
        """The controller first (it would delete the NodeSlicePool with the last NAD), then the NADs:
        the next run's controller parses every NAD of the cluster."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        paths = [self.tenant.path("network-attachment-definitions", name, group="k8s.cni.cncf.io",
                                  version="v1") for name in self.nads]
        # and the Node objects: the next controller (another layout, fewer nodes) slices only its own
        paths += [f"/api/v1/nodes/node-{k}" for k in range(self.wl.nodes)]
        for path in paths:
            try:
                self.tenant.server.request("DELETE", path)
            except kubeup.ApiFailure as e:
                if e.status != 404:
                    raise


def run_workload(impl: Impl, wl: Workload, tenant: kubeup.Tenant, scratch: Path,
                 prefix: str, notes: dict[str, Any] | None = None) -> list[PhaseReport]:
    """The ADD phase, its check, the DEL phase, its check: two PhaseReports. Mode slices with
    wl.slice_controller: upstream's node-slice-controller runs around both phases (`notes` gets
    "slices_assigned_s", how long it took to give every node a slice)."""
    impl.setup(tenant, scratch)
    if wl.mode == "slices" and wl.slice_controller:
        controller = SliceController(impl, wl, tenant, scratch)
        try:
            controller.start()
            if notes is not None:
                notes["slices_assigned_s"] = controller.assigned_s
            return _run_workload(impl, wl, tenant, prefix)
        finally:
            controller.stop()
    return _run_workload(impl, wl, tenant, prefix)


def _run_workload(impl: Impl, wl: Workload, tenant: kubeup.Tenant, prefix: str) -> list[PhaseReport]:
    server = tenant.server
    pods = {i: Pod(i, tenant.namespace, prefix) for i in range(wl.pods)}
    out = []
    before_served = impl.served()
    marks = agent_marks(impl)
    before = measure(server, impl)
    adds, wall = run_phase(impl, wl, "ADD", list(pods.values()))

    def check_adds() -> list[str]:
        if wl.mode == "slices":
            return (check_after_add(tenant, adds, pods, network_name=SLICES_NETWORK)
                    + check_slices(tenant, wl, adds, pods))  # fmt: skip
        return check_after_add(tenant, adds, pods)

    after = measure(server, impl)
    served = impl.served()
    problems = check_adds()
    out.append(report(impl, wl, "ADD", adds, wall, wl.attachments, before, after, problems,
                      served["ADD"] - before_served["ADD"] if served else None))
    out[-1].agent_ms = agent_times(impl, "ADD", marks)
    started: dict[int, list[int]] = {}
    for c in sorted(adds, key=lambda c: c.net):
        started.setdefault(c.pod, []).append(c.net)
    marks = agent_marks(impl)
    before = measure(server, impl)
    dels, wall = run_phase(impl, wl, "DEL", [pods[i] for i in sorted(started)], started)
    after = measure(server, impl)
    served2 = impl.served()
    problems = check_after_del(tenant)
    left = len(problems)
    if len(dels) < len(adds):
        problems.append(f"{len(adds) - len(dels)}{NOT_DELETED}")
    out.append(report(impl, wl, "DEL", dels, wall, len(adds), before, after, problems,
                      served2["DEL"] - served["DEL"] if served2 else None))
    out[-1].left = left
    out[-1].agent_ms = agent_times(impl, "DEL", marks)
    return out


def agent_marks(impl: Impl) -> dict[tuple[str, str], int]:
    """How many calls of each command each agent has served so far (agent_times counts from there)."""
    if not isinstance(impl, Pycni):
        return {}
    return {(cmd, node): len(impl.inside_ms(cmd, node)) for node in impl.agents for cmd in ("ADD", "DEL")}


def agent_times(impl: Impl, command: str, marks: dict[tuple[str, str], int]) -> tuple[float, float] | None:
    """p50/p99 ms of the `command` calls the agents served since `marks`, as they timed them (their
    logs); None without agents or calls."""
    if not isinstance(impl, Pycni):
        return None
    inside = [ms for node in impl.agents for ms in impl.inside_ms(command, node)[marks[(command, node)]:]]
    return (pct(inside, 50), pct(inside, 99)) if inside else None


# ---- the implementations ----------------------------------------------------------------------------


def write_private(path: Path, text: str) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return path


class Upstream(Impl):
    label = "upstream"

    def __init__(self) -> None:
        self.binary = kubeup.unpack("whereabouts") / "whereabouts"

    def setup(self, tenant: kubeup.Tenant, scratch: Path) -> None:
        super().setup(tenant, scratch)
        server, ns = tenant.server, tenant.namespace
        server.service_account(ns, "whereabouts")
        role = f"whereabouts-cni-{ns}"
        server.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": role}, "rules": UPSTREAM_RULES})
        server.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "whereabouts", "namespace": ns}]})
        wb = scratch / "whereabouts.d"  # what install-cni.sh writes, with an inline token as it does
        wb.mkdir(exist_ok=True)
        kubeconfig = server.kubeconfig(wb / "whereabouts.kubeconfig", ns,
                                       token=server.token(ns, "whereabouts"))
        self.flat = write_private(wb / "whereabouts.conf", json.dumps({
            "datastore": "kubernetes", "configuration_path": str(wb),
            "kubernetes": {"kubeconfig": str(kubeconfig)}}))

    def argv(self) -> list[str]:
        return [str(self.binary)]

    def ipam(self, rng: str) -> dict[str, Any]:
        return {"type": "whereabouts", "range": rng, "configuration_path": str(self.flat)}


class Pycni(Impl):
    """pycni's whereabouts: frozen (`bundle`) or from source, in-process or through per-node agents."""

    def __init__(self, bundle: Path | None, agents: int = 0, scratch: Path | None = None,
                 agent_args: tuple[str, ...] = (), agent_timeout: float | None = None,
                 label: str = "") -> None:  # fmt: skip
        self.bundle = bundle
        self.agent_timeout = agent_timeout  # the shims' PYCNI_AGENT_TIMEOUT (None: the default)
        self.label = label or ("pycni+agent" if agents else "pycni")
        self.agents: dict[str, agentutil.Agent] = {}
        self.agents_start_s = 0.0  # how long starting them took, one after another
        if agents:
            assert scratch is not None
            where = scratch / "agents"
            where.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            with plugin_dir(bundle):
                try:
                    for k in range(agents):
                        node = f"node-{k}"
                        self.agents[node] = agentutil.Agent(
                            where / f"{node}.fifo", where / f"{node}.log", *agent_args).start()
                except BaseException:
                    self.close()
                    raise
            self.agents_start_s = time.monotonic() - start

    def setup(self, tenant: kubeup.Tenant, scratch: Path) -> None:
        super().setup(tenant, scratch)
        wb = scratch / "whereabouts.d"
        wb.mkdir(exist_ok=True)
        self.flat = write_private(wb / "whereabouts.conf", json.dumps({
            "datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}}))
        self.local_db = scratch / "state" / "whereabouts.db"  # never used by this store; not the default

    def argv(self) -> list[str]:
        if self.bundle is not None:
            return [str(self.bundle / "whereabouts")]
        return [sys.executable, "-m", "cni", "whereabouts"]

    def env(self, node: str) -> dict[str, str]:
        env = super().env(node)
        if self.bundle is None:
            env["PYTHONPATH"] = str(REPO)
        if self.agents:
            env["PYCNI_AGENT_FIFO"] = str(self.agents[node].fifo)
            if self.agent_timeout is not None:
                env["PYCNI_AGENT_TIMEOUT"] = str(self.agent_timeout)
        else:
            env["PYCNI_AGENT"] = "off"
        return env

    def ipam(self, rng: str) -> dict[str, Any]:
        return {"type": "whereabouts", "range": rng, "configuration_path": str(self.flat),
                "local_db": str(self.local_db)}

    def helper_pids(self) -> list[int]:
        return [agent.pid for agent in self.agents.values()]

    def served(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for agent in self.agents.values():
            for line in agent.served("served whereabouts "):
                out[line.split("served whereabouts ", 1)[1].split()[0]] += 1
        return out

    def inside_ms(self, command: str, node: str) -> list[float]:
        """How long `node`'s agent took for each `command` it served, in order (its log: '... in X ms')."""
        agent = self.agents.get(node)
        lines = agent.served(f"served whereabouts {command} ") if agent else []
        return [float(line.rsplit(" in ", 1)[1].split()[0]) for line in lines]

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.agents.clear()


@contextmanager
def plugin_dir(bundle: Path | None) -> Iterator[None]:
    """PYCNI_PLUGIN_DIR as agentutil reads it: the frozen agent from `bundle`, else from source."""
    saved = os.environ.pop("PYCNI_PLUGIN_DIR", None)
    if bundle is not None:
        os.environ["PYCNI_PLUGIN_DIR"] = str(bundle)
    try:
        yield
    finally:
        os.environ.pop("PYCNI_PLUGIN_DIR", None)
        if saved is not None:
            os.environ["PYCNI_PLUGIN_DIR"] = saved


# ---- one uncontended call -------------------------------------------------------------------------


def uncontended(impl: Impl, tenant: kubeup.Tenant, scratch: Path, runs: int, prefix: str) -> dict[str, Any]:
    """`runs` ADDs one after another on node-0 (a process each) into an existing pool, then their DELs:
    medians. The first ADD (it creates the pool) is not counted."""
    impl.setup(tenant, scratch)
    wl = Workload(pods=runs + 1, networks=1, nodes=1, concurrency=1, budget=300.0)
    conf = {1: json.dumps({"cniVersion": "1.0.0", "name": "bench-single", "type": "macvlan",
                           "ipam": impl.ipam(SINGLE_RANGE)}).encode()}
    deadline = time.monotonic() + wl.budget
    out: dict[str, Any] = {}
    for command in ("ADD", "DEL"):
        calls = [one_call(impl, wl, command, Pod(i, tenant.namespace, prefix), 1, conf, deadline)
                 for i in range(runs + 1) if time.monotonic() < deadline]
        failed = [c.error for c in calls if not c.ok]
        times = [c.seconds for c in calls[1:]] or [0.0]
        out[command] = {"median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times),
                        "runs": len(times), "failed": len(failed), "errors": sorted(set(failed))[:3]}
        if isinstance(impl, Pycni) and impl.agents:  # the same calls as the agent timed them
            inside = impl.inside_ms(command, "node-0")[-len(times):] or [0.0]
            out[command]["agent_median_ms"] = statistics.median(inside)
    out["left"] = check_after_del(tenant)
    return out


# ---- the report ----------------------------------------------------------------------------------


def table(reports: list[PhaseReport]) -> str:
    base = {(r.run, r.layout, r.mode, r.phase): r for r in reports if r.impl == "upstream"}
    rows = ["| run | layout | impl | mode | phase | done/planned | wall s | att/s | vs upstream "
            "| call p50/p99 ms | pod p50/p99 ms | API req/att | 409 | 422 | 504 | API CPU s | failures "
            "| agent served | left after DEL | check |",
            "|" + "---|" * 20]
    for r in reports:
        up = base.get((r.run, r.layout, r.mode, r.phase))
        cut = r.api_504 + r.api_504_cut
        ratio = f"{r.per_s / up.per_s:.2f}x" if up and up.per_s and r.impl != "upstream" else "-"
        check = "ok" if not r.problems else f"{len(r.problems)} PROBLEMS"
        served = "-" if r.agent_served is None else f"{r.agent_served}/{r.attempted}"
        pods = f"{r.pod_p50_ms:.0f}/{r.pod_p99_ms:.0f}" if r.pod_p99_ms else "- (no pod finished)"
        left = "-" if r.left is None else str(r.left)
        rows.append(
            f"| {r.run + 1} | {r.layout} | {r.impl} | {r.mode} | {r.phase} | {r.done}/{r.attachments} "
            f"| {r.wall_s:.1f} | {r.per_s:.1f} | {ratio} | {r.call_p50_ms:.0f}/{r.call_p99_ms:.0f} | {pods} "
            f"| {r.api_per_attachment:.1f} | {r.api_409:.0f} | {r.api_422:.0f} | {cut:g} "
            f"| {r.api_cpu_s:.1f} | {r.failures} | {served} | {left} | {check} |")
    return "\n".join(rows)


def medians(reports: list[PhaseReport]) -> str:
    """--repeat: per implementation, mode and phase, the median over the runs of its speed against the
    same run's upstream, and of its wall time (a figure that decides a design is a median of three)."""
    lines = ["| impl | mode | phase | runs | median wall s | median vs upstream | each run vs upstream |",
             "|---|---|---|---|---|---|---|"]
    for row in ipam_layouts.rows(reports):
        each = ", ".join(f"{x:.2f}x" for x in row.speed) or "-"
        med = "-" if row.median_speed is None else f"{row.median_speed:.2f}x"
        lines.append(f"| {row.impl} | {row.mode} | {row.phase} | {len(row.runs)} | {row.median_wall:.1f} "
                     f"| {med} | {each} |")
    return "\n".join(lines)


def details(reports: list[PhaseReport]) -> str:
    lines = []
    for r in reports:
        # >= 0.01 per attachment: the server's own requests (its identity Lease every 10 s, its
        # informers' WATCH restarts) stay in the JSON but out of this line
        per = ", ".join(f"{k} {v / max(1, r.attempted):.2f}" for k, v in r.api_split.items()
                        if v / max(1, r.attempted) >= 0.01)
        run = f" run {r.run + 1}" if any(x.run for x in reports) else ""
        lines.append(f"- {r.impl} {r.layout} {r.mode} {r.phase}{run} (load {r.load_avg[0]:.1f}): API per "
                     f"attachment: {per}")
        if r.api_504 or r.api_504_cut:
            lines.append(f"  - ANSWERS 504: {r.api_504:g} by the handlers, {r.api_504_cut:g} by the server's "
                         "timeout filter")
        if r.agent_ms is not None:
            lines.append(f"  - inside the agents: call p50/p99 {r.agent_ms[0]:.0f}/{r.agent_ms[1]:.0f} ms")
        if r.agents_pss_mib is not None:
            lines.append(f"  - the agents' memory after the phase: {r.agents_pss_mib:.0f} MiB (PSS, all "
                         "nodes)")
        writes = sum(v for k, v in r.api_split.items() if k.split()[0] in ("PATCH", "PUT", "POST")
                     and k.split()[1] == "ippools")  # fmt: skip
        if writes and r.etcd_split:
            etcd = ", ".join(f"{k} {v / writes:.2f}" for k, v in sorted(r.etcd_split.items()))
            lines.append(f"  - etcd requests per pool write: {etcd}")
        if r.cpu_split:
            split = ", ".join(f"{k} {v:.1f}" for k, v in r.cpu_split.items())
            whole = (os.cpu_count() or 1) * r.wall_s
            lines.append(f"  - CPU s: {split} (of {whole:.1f}: {os.cpu_count()} CPUs x the phase's wall)")
        lines += [f"  - failure x{n}: {msg}" for msg, n in r.failure_messages.items()]
        lines += [f"  - check: {p}" for p in r.problems[:10]]
    return "\n".join(lines)


def single_table(singles: dict[str, dict[str, Any]]) -> str:
    def ms(s: dict[str, Any]) -> str:
        inside = f" (agent {s['agent_median_ms']:.0f})" if "agent_median_ms" in s else ""
        return f"{s['median_ms']:.0f}{inside}"

    rows = ["| impl | ADD median ms | DEL median ms | runs | failed | left |", "|---|---|---|---|---|---|"]
    for label, s in singles.items():
        rows.append(f"| {label} | {ms(s['ADD'])} | {ms(s['DEL'])} "
                    f"| {s['ADD']['runs']} | {s['ADD']['failed'] + s['DEL']['failed']} "
                    f"| {len(s['left']) or 'none'} |")
    return "\n".join(rows)


def run_modes(
    impl: Impl, base: Workload, modes: list[str], slices_by: str, server: kubeup.KubeServer, where: Path,
    prefix: str, tag: str, slice_notes: dict[str, dict[str, Any]],
) -> list[PhaseReport]:  # fmt: skip
    """One implementation's workload (`base`, in each range mode) in every mode, each in a fresh
    namespace. Mode slices: upstream's node-slice-controller assigns the slices when `slices_by` is
    "controller", or "own" and the implementation is upstream; else the plugin does."""
    reports: list[PhaseReport] = []
    for mode in modes:
        controller = slices_by == "controller" or (slices_by == "own" and impl.label == "upstream")
        wl = replace(base, mode=mode, slice_controller=controller)
        tenant = kubeup.Tenant(server, where / mode / "kube", prefix="scale")
        print(f"  {impl.label} {wl.layout} {mode} in namespace {tenant.namespace}{tag} ...", flush=True)
        notes: dict[str, Any] = {}
        prefix_mode = f"{prefix}{modes.index(mode):x}"
        rs = run_workload(impl, wl, tenant, where / mode, prefix=prefix_mode, notes=notes)
        if mode == "slices":
            by = "controller" if controller else "plugin"
            slice_notes[f"{impl.label} {wl.layout}"] = {**notes, "assigned_by": by,
                                                        "assignments": slice_assignments(tenant)}
            if "slices_assigned_s" in notes:
                print(f"    the node-slice-controller gave every node a slice in "
                      f"{notes['slices_assigned_s']:.1f} s", flush=True)
        reports += rs
        for r in rs:
            cut = f", {r.api_504 + r.api_504_cut:g} ANSWERS 504" if r.api_504 or r.api_504_cut else ""
            print(f"    {r.phase}: {r.done}/{r.attachments} in {r.wall_s:.1f} s, {r.failures} failed{cut}, "
                  f"check {'ok' if not r.problems else r.problems[:3]}", flush=True)
    return reports


def workloads(args: argparse.Namespace, modes: list[str], budget: float) -> list[Workload] | str:
    """The workload of every layout (--layouts, else --nodes x --concurrency), or why they cannot run.
    Mode slices: one slice size for all, the harness's /23 unless the most nodes need smaller slices."""
    if args.layouts:
        try:
            layouts = ipam_layouts.parse_layouts(args.layouts)
        except ValueError as e:
            return str(e)
    else:
        layouts = [Layout(args.nodes, args.concurrency)]
    pods = args.pods if args.pods is not None or args.layouts else 64
    out = [Workload(ipam_layouts.pods_for(lay, pods, args.pods_per_slot), args.networks, lay.nodes,
                    lay.concurrency, modes[0], budget, full=args.full_pool) for lay in layouts]  # fmt: skip
    if "slices" in modes:
        size = ipam_layouts.slice_size(SLICES_RANGE, SLICE_SIZE, max(wl.nodes for wl in out),
                                       max(wl.per_node for wl in out))  # fmt: skip
        out = [replace(wl, slice_size=size or SLICE_SIZE) for wl in out]
    for wl in out:
        for mode in modes:
            why = replace(wl, mode=mode).unfit()
            if why:
                return f"layout {wl.layout}, {wl.pods} pods: {why}" if args.layouts else why
    return out


def layouts_report(reports: list[PhaseReport], wls: list[Workload]) -> dict[str, Any]:
    """--layouts: print a table per layout, the summary against the number of nodes and the guard's
    verdicts; return them for the JSON result."""
    layouts = [Layout(wl.nodes, wl.concurrency) for wl in wls]
    rows = ipam_layouts.rows(reports)
    verdicts = ipam_layouts.verdicts(rows, [lay.label for lay in layouts])
    met = ipam_layouts.guard_met(verdicts)
    runs = max(r.run for r in reports) + 1
    for lay, wl in zip(layouts, wls, strict=True):
        print(f"\n### {lay.nodes} nodes x {lay.concurrency} pod{'s' * (lay.concurrency > 1)} at once "
              f"({lay.in_flight} in flight): "
              f"{wl.pods} pods x {wl.networks} networks = {wl.attachments} attachments\n")
        print(ipam_layouts.layout_table(rows, lay.label))
    print(f"\n## Against the number of nodes: median of {runs} run{'s' * (runs > 1)}\n")
    print("Each implementation's median wall s / median API server CPU ms per attachment, ADD and DEL; "
          "speed against upstream: each run against its own run's upstream, their median.\n")
    print(ipam_layouts.summary_table(rows, verdicts, layouts))
    print("\n## The guard (issue 44), from the medians\n")
    print(ipam_layouts.verdict_table(verdicts))
    failed = sum(v.counts and not v.ok for v in verdicts)
    print(f"\nguard: {'MET' if met else 'NOT MET'} ({failed} of {sum(v.counts for v in verdicts)} checks "
          "not met)")
    shapes = [{"layout": wl.layout, "nodes": wl.nodes, "concurrency": wl.concurrency, "pods": wl.pods,
               "attachments": wl.attachments} for wl in wls]
    return {"layouts": shapes, "summary": [row.as_dict() for row in rows],
            "verdicts": [asdict(v) for v in verdicts], "guard_met": met}


def make_impl(label: str, wl: Workload, bundle: Path | None, where: Path) -> Impl:
    """upstream, or pycni (from `bundle`, or from source) with an agent per node of `wl` when the label
    says the calls go through agents."""
    if label == "upstream":
        return Upstream()
    nodes = wl.nodes if ipam_layouts.through_agent(label) else 0
    return Pycni(bundle, nodes, where, label=label)


def agents_started(impl: Pycni, run: int, wl: Workload) -> dict[str, Any]:
    """What starting an implementation's agents cost (printed, and for the JSON result)."""
    pss = impl.helper_pss_mib() or 0.0
    print(f"  {impl.label} {wl.layout}: {len(impl.agents)} agents started one after another in "
          f"{impl.agents_start_s:.1f} s, {pss:.0f} MiB (PSS) idle", flush=True)
    return {"run": run, "layout": wl.layout, "impl": impl.label, "agents": len(impl.agents),
            "start_s": round(impl.agents_start_s, 2), "pss_mib": pss}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, help="pods (default 64; with --layouts: --pods-per-slot pods for "
                                             "each of a layout's workers, unless --pods fixes one count)")
    ap.add_argument("--networks", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=4, help="pods a node starts at once")
    ap.add_argument("--layouts", metavar="KxC[,KxC...]",
                    help="several layouts in one invocation, each K nodes x C pods at once per node (e.g. "
                         "8x4,32x1,64x1; instead of --nodes and --concurrency): a table per layout, a "
                         "summary against the number of nodes and the guard's verdicts (issue 44)")
    ap.add_argument("--pods-per-slot", type=int, default=ipam_layouts.PODS_PER_SLOT,
                    help="with --layouts and no --pods: the pods each of a layout's K x C workers runs one "
                         "after another (default 2: 64 pods at 8x4 and 32x1, 128 at 64x1)")
    ap.add_argument("--mode", choices=("shared", "per-network", "slices", "both", "all"), default="both",
                    help="both: shared and per-network; all: shared, per-network and slices")
    ap.add_argument("--slices-by", choices=("controller", "plugin", "own"), default="controller",
                    help="mode slices: who assigns the slices (controller: upstream's node-slice-controller "
                         "for every implementation; plugin: pycni only, no controller; own: each its own "
                         "way, upstream through the controller, pycni by the plugin)")
    ap.add_argument("--impl", action="append", choices=("upstream", "pycni", "pycni+agent"),
                    help="default: all three")
    ap.add_argument("--scenario", choices=("313", "full1000"),
                    help="313: 128 pods x 16 networks, 240 s per phase; full1000: 1,000 pods x 1 network "
                         "on 16 nodes, 8 at once each, mode shared on a full pool (Spiderpool's benchmark)")
    ap.add_argument("--full-pool", action="store_true",
                    help="mode shared: range_end leaves exactly pods x networks addresses in the range")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole workload this many times")
    ap.add_argument("--budget", type=float, help="seconds per phase (default 600; scenario 313: 240)")
    ap.add_argument("--single", type=int, default=20, help="uncontended ADDs per implementation (0: none)")
    ap.add_argument("--source", action="store_true", help="pycni from source, not dist/cni-bin")
    ap.add_argument("--bundle", action="append", default=[], metavar="LABEL=DIR",
                    help="also pycni from another frozen bundle dir (another build), as impl "
                         "pycni:LABEL in every run (compare builds in one run): standalone, or through "
                         "per-node agents of that build when LABEL ends with +agent")
    ap.add_argument("--json", type=Path, default=REPO / "dist" / "bench" / "ipam-scale.json")
    args = ap.parse_args(argv)
    if args.scenario == "313":
        args.pods, args.networks = 128, 16
    if args.scenario == "full1000":
        if args.layouts:
            ap.error("--scenario full1000 is its own layout (16 nodes x 8): not with --layouts")
        args.pods, args.networks, args.nodes, args.concurrency, args.full_pool = 1000, 1, 16, 8, True
        args.mode = "shared" if args.mode == "both" else args.mode
    budget = args.budget or (240.0 if args.scenario == "313" else 600.0)
    impls = args.impl or ["upstream", "pycni", "pycni+agent"]
    others = {f"pycni:{spec.partition('=')[0]}": Path(spec.partition("=")[2]) for spec in args.bundle}
    for label, path in others.items():
        if not (path / "whereabouts").exists():
            print(f"--bundle {label}: no {path}/whereabouts", file=sys.stderr)
            return 2
    impls = [*impls, *others]
    modes = {"both": ["shared", "per-network"], "all": ["shared", "per-network", "slices"]}.get(
        args.mode, [args.mode])
    reason = kubeup.absent()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    wls = workloads(args, modes, budget)
    if isinstance(wls, str):
        print(wls, file=sys.stderr)
        return 2
    if "slices" in modes and args.slices_by == "plugin" and "upstream" in impls:
        print("--slices-by plugin: upstream's plugin cannot assign slices (pass --impl pycni ..., or "
              "--slices-by own)", file=sys.stderr)
        return 2
    bundle = None if args.source else BUNDLE
    if bundle is not None and not (bundle / "whereabouts").exists():
        print(f"missing {bundle}/whereabouts: run `make bundle` (or pass --source)", file=sys.stderr)
        return 2
    if any(ipam_layouts.through_agent(label) for label in impls) and os.geteuid() != 0:
        print("pycni+agent needs root (the agent serves root only)", file=sys.stderr)
        return 2
    before_paths = {p for p in DEFAULT_PATHS if os.path.lexists(p)}
    load0 = os.getloadavg()
    shape = ", ".join(f"{wl.pods} pods on {wl.nodes} nodes, {wl.concurrency} at once" for wl in wls)
    print(f"{os.cpu_count()} CPUs, load average at start {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{args.networks} networks per pod; {shape}; budget {budget:.0f} s per phase; pycni "
          f"{'from source' if bundle is None else bundle}")
    reports: list[PhaseReport] = []
    singles: dict[str, dict[str, Any]] = {}
    slice_notes: dict[str, dict[str, Any]] = {}
    agents: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pycni-ipam-scale-") as tmp:
        scratch = Path(tmp)
        server = kubeup.KubeServer.start(scratch)
        try:
            for run in range(args.repeat):
                for li, wl in enumerate(wls):
                    for n, label in enumerate(impls):
                        where = scratch / f"run{run}" / wl.layout / label
                        impl = make_impl(label, wl, others.get(label, bundle), where)
                        try:
                            if isinstance(impl, Pycni) and impl.agents:
                                agents.append(agents_started(impl, run, wl))
                            tag = f" (run {run + 1} of {args.repeat})" if args.repeat > 1 else ""
                            done = run_modes(impl, wl, modes, args.slices_by, server, where,
                                             f"{run:x}{li:x}{n:x}", tag, slice_notes)  # fmt: skip
                            for r in done:
                                r.run = run
                            reports += done
                            if args.single and run == 0 and li == 0:
                                tenant = kubeup.Tenant(server, where / "single" / "kube", prefix="single")
                                at = where / "single"
                                singles[label] = uncontended(impl, tenant, at, args.single, f"{n:x}f")
                        finally:
                            impl.close()
        finally:
            server.stop()
    load1 = os.getloadavg()
    created = sorted(p for p in DEFAULT_PATHS if os.path.lexists(p) and p not in before_paths)
    wl0 = wls[0]
    summary: dict[str, Any] = {}
    if args.layouts:
        print(f"\n## IPAM at scale in {len(wls)} layouts: {args.networks} networks per pod "
              f"(load {load0[0]:.2f} -> {load1[0]:.2f})")
        summary = layouts_report(reports, wls)
        print("\n## Every phase of every run\n")
    else:
        print(f"\n## IPAM at scale: {wl0.pods} pods x {args.networks} networks on {wl0.nodes} nodes, "
              f"{wl0.concurrency} at once (load {load0[0]:.2f} -> {load1[0]:.2f})\n")
    print(table(reports))
    if args.repeat > 1 and not args.layouts:
        print(f"\nMedians of {args.repeat} runs (each against the upstream of its own run):\n")
        print(medians(reports))
    if slice_notes:
        by = {"controller": "upstream's node-slice-controller (started before ADD, every node assigned "
                            "before the first call, stopped after DEL), for every implementation",
              "plugin": "the pycni plugin itself, on each node's first ADD (no controller)",
              "own": "upstream's node-slice-controller for upstream (started before ADD, stopped after "
                     "DEL), the pycni plugin itself for pycni (on each node's first ADD, no controller)"}
        print(f"\nslices: {SLICES_RANGE} in {wl0.slice_size} slices, network_name {SLICES_NETWORK}; "
              f"slices assigned by {by[args.slices_by]}")
    print()
    print(details(reports))
    if singles:
        print(f"\n## One uncontended call (a process each, median of {args.single})\n")
        print(single_table(singles))
    if created:
        print(f"\nDEFAULT PATHS APPEARED during the run (a config missed one, or another process on this "
              f"machine made them): {created}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "workload": {"pods": wl0.pods, "networks": args.networks, "nodes": wl0.nodes,
                     "concurrency": wl0.concurrency, "budget_s": budget, "modes": modes,
                     "pycni": "source" if bundle is None else str(bundle),
                     **({"slices": {"range": SLICES_RANGE, "slice_size": wl0.slice_size,
                                    "network_name": SLICES_NETWORK, "assigned_by": args.slices_by,
                                    "runs": slice_notes}} if "slices" in modes else {})},
        "load_avg": {"start": load0, "end": load1}, "cpus": os.cpu_count(), "repeat": args.repeat,
        **summary, "agents": agents,
        "phases": [asdict(r) for r in reports], "uncontended": singles, "default_paths_created": created,
    }, indent=1))
    print(f"\nresult: {args.json}")
    bad = any(r.problems or r.failures or r.api_504 or r.api_504_cut for r in reports) or created
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
