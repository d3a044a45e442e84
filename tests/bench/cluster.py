"""`make bench-cluster`: pod start-up on a real single-node cluster (../shared/upstream kube-node-up, Multus
thin plugin, kubelet, containerd), side by side in one run. Not a timed test: it prints a markdown table
and writes a JSON result file (dist/bench/cluster.json).

Workload: N pods x M secondary networks, created at once (one `kubectl apply` of N pods, each annotated
with the M networks). Every network is macvlan (mode bridge, on a veth of the run's) + whereabouts IPAM on
the Kubernetes store, all M on one shared range (198.18.64.0/18, no network_name: one IPPool). Measured:
from the apply to every pod Running (per pod: when the poll first saw it Running; p50/p99), the addresses
the pool then holds (N x M expected), then from one `kubectl delete` of all of them to every pod gone and
to the pool empty; failures (pods not Running in time, FailedCreatePodSandBox/FailedKillPod events).

Implementations, each in a fresh namespace, one after the other on the same cluster:
- pycni-agent: pycni installed as an operator does (the image imported, `kubectl apply -k` of the test
  overlay of tests/cluster/kubenode.py), its DaemonSet with the agent;
- pycni-no-agent: the same install with the agent container removed from the DaemonSet (rolled out;
  the shims find no agent and run the plugins in-process);
- upstream (last): Debian's Go macvlan (/usr/lib/cni/macvlan) copied into the node's CNI bin dir as
  `bench-go-macvlan`, and upstream whereabouts v0.9.4 (../shared/upstream `unpack whereabouts`) as
  `whereabouts` (upstream's plugin refuses any other type name), in place of pycni's entry: pycni's
  DaemonSet is deleted first (its files stay, `kubectl delete` alone never uninstalls) and the cluster is
  discarded afterwards. Its flat file (admin kubeconfig) is in the run's directory;
- floor (after upstream, nothing of pycni running): the node's floor, the same N pods (same image, one
  apply, through Multus and the cluster network as the others) with no networks annotation, so no
  secondary network at all: what starting the pods costs the node alone. Printed after the table: each
  side's all-Running minus the floor's (the secondary networks' share) and upstream's all-Running over
  the floor's (the most any plugin could gain over upstream on this node).

    python -m tests.bench.cluster [-n PODS] [-m NETWORKS] [--only NAME,...]   (root)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import kubenode
from tests.cluster.pods import pod
from tests.nsutil import REPO, RUN, is_root, sh

RANGE = "198.18.64.0/18"
POOL = "198.18.64.0-18"
IMPLS = ("pycni-agent", "pycni-no-agent", "upstream", "floor")
TIMEOUT = 900.0


def nad(name: str, ns: str, conf: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": ns}, "spec": {"config": json.dumps(conf)}}


def network(impl: str, i: int, master: str, node: kubenode.Cluster, flat: Path) -> dict[str, Any]:
    ipam: dict[str, Any] = {"range": RANGE}
    if impl == "upstream":
        ipam |= {"type": "whereabouts", "configuration_path": str(flat)}
        kind = "bench-go-macvlan"
    else:
        ipam |= {"type": "whereabouts",
                 "configuration_path": str(node.cni_conf_dir / "whereabouts.d" / "whereabouts.conf"),
                 "local_db": str(node.state_dir / "pycni" / "whereabouts.db")}
        kind = "macvlan"
    return {"cniVersion": "0.3.1", "name": f"bench-{i}", "type": kind, "master": master, "mode": "bridge",
            "ipam": ipam}


def pool_size(node: kubenode.Cluster) -> int:
    """Allocations in the shared range's IPPool, wherever the implementation keeps it (pycni: its
    namespace; upstream: the namespace its kubeconfig context implies)."""
    pools = node.get("-A", "ippools.whereabouts.cni.cncf.io")["items"]
    return sum(len(p["spec"].get("allocations") or {}) for p in pools if p["metadata"]["name"] == POOL)


# containerd's own log lines (info level) for a pod's sandbox: the kubelet's RunPodSandbox asked (it runs the
# CNI ADD through Multus) and returned
SANDBOX = re.compile(r'^time="([^"]+)" level=\w+ msg="RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),'
                     r'Uid:[^,]*,Namespace:([^,]+),[^"]*?( returns[^"]*)?"', re.M)


def when(stamp: str) -> float:
    """containerd's RFC 3339 time (nanoseconds) as epoch seconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    t = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC).timestamp()
    return t + float("0." + (frac or "0"))


def sandbox_phases(node: kubenode.Cluster, ns: str, since: int, t0: float) -> dict[str, list[float]]:
    """From containerd's log after byte `since`: per pod of `ns`, when the kubelet asked for its sandbox
    (seconds after t0, the apply) and how long the set-up took (the CNI ADD through Multus and every
    network, plus creating the sandbox container)."""
    with (node.dir / "containerd.log").open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    start: dict[str, float] = {}
    asked, took = [], []
    for m in SANDBOX.finditer(text):
        stamp, name, pod_ns, ret = m.groups()
        if pod_ns != ns:
            continue
        if ret is None:
            start.setdefault(name, when(stamp))
        elif name in start:
            asked.append(start[name] - t0)
            took.append(when(stamp) - start[name])
    return {"asked": asked, "took": took}


# Multus's verbose log: one "Add:" line per delegate once it answered (1 s resolution), the cluster network
# (eth0) first, then the NADs' networks in order
MULTUS_ADD = re.compile(r"^(\S+) \[verbose\] Add: ([^:]+):([^:]+):[^:]*:\S+?\(\S+?\):(\S+) ", re.M)


def secondary_seconds(node: kubenode.Cluster, ns: str, since: int) -> list[float]:
    """Per pod of `ns`: from Multus's line for the cluster network to its line for the last secondary
    network (the secondary delegates' ADDs one after the other, and Multus between them)."""
    with (node.cni_conf_dir.parent / "multus.log").open("rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for m in MULTUS_ADD.finditer(text):
        stamp, pod_ns, name, ifname = m.groups()
        if pod_ns != ns:
            continue
        t = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        if ifname == "eth0":
            first[name] = t
        else:
            last[name] = max(t, last.get(name, t))
    return [last[n] - first[n] for n in last if n in first]


TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int, children: bool = False) -> float:
    """CPU seconds of process `pid` (with `children`: plus those of the descendants it has reaped: for
    containerd, the CNI plugins it ran: Multus and every delegate Multus ran)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
    return ticks / TICK


def cpu_seconds(node: kubenode.Cluster) -> dict[str, float]:
    """CPU seconds so far of the node's components, the agent, and the whole machine (busy, all CPUs)."""
    named: dict[str, int] = {}
    for line in (node.dir / "pids.named").read_text().splitlines():
        if line.strip():
            name, pid = line.split()
            named[name] = int(pid)
    out = {"containerd + the CNI plugins it ran": proc_cpu(named.get("containerd", 0), children=True),
           "kubelet": proc_cpu(named.get("kubelet", 0)),
           "kube-apiserver": proc_cpu(int(node.env["KUBE_APISERVER_PID"])),
           "etcd": proc_cpu(int(node.env["ETCD_PID"]))}
    agents = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    ids = {s["containerID"].removeprefix("containerd://") for p in agents
           for s in p["status"].get("containerStatuses", []) if s["name"] == "agent" and s.get("containerID")}
    tasks = (line.split() for line in node.ctr("tasks", "ls").stdout.splitlines()[1:])
    out["pycni agent"] = sum(proc_cpu(int(t[1])) for t in tasks if t[0] in ids)
    busy = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    out["machine (all CPUs)"] = (sum(map(int, busy)) - int(busy[3]) - int(busy[4])) / TICK
    return out


API_REQUEST = re.compile(r'^apiserver_request_total\{([^}]*)\} (\S+)$', re.M)


def api_requests(node: kubenode.Cluster) -> dict[str, float]:
    """{"VERB resource": requests} the API server has answered so far (its own metrics)."""
    out: dict[str, float] = {}
    for m in API_REQUEST.finditer(node.kubectl("get", "--raw", "/metrics").stdout):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        key = f"{labels.get('verb', '')} {labels.get('resource', '')}"
        out[key] = out.get(key, 0.0) + float(m.group(2))
    return out


def agent_seconds(node: kubenode.Cluster) -> dict[str, tuple[float, float]]:
    """{plugin ADD: (calls, seconds)} the agent on the node's address served (empty without an agent)."""
    url = f"http://{node.env['NODE_IP']}:9736/metrics"
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, tuple[float, float]] = {}
    for kind in ("count", "sum"):
        for m in re.finditer(rf'^pycni_attach_duration_seconds_{kind}\{{command="ADD",plugin="([\w-]+)"\}} '
                             r"(\S+)$", text, re.M):
            calls, secs = out.get(m.group(1), (0.0, 0.0))
            out[m.group(1)] = (float(m.group(2)), secs) if kind == "count" else (calls, float(m.group(2)))
    return out


def failure_kinds(events: list[dict[str, Any]]) -> dict[str, int]:
    """Failed sandboxes by what failed: the words after Multus's "[ns/pod/uid]: " (e.g. "error waiting for
    pod", Multus' own GET of the pod timing out) or after the plugin's name."""
    out: dict[str, int] = {}
    for e in events:
        msg = e.get("message", "")
        tail = re.split(r"\]: |failed \((?:add|delete)\): ", msg)[-1]
        kind = f"{e.get('reason')}: {tail.split(':')[0][:60]}"
        out[kind] = out.get(kind, 0) + int(e.get("count", 1))
    return out


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def run(impl: str, node: kubenode.Cluster, n: int, m: int, master: str, work: Path) -> dict[str, Any]:
    ns = f"{RUN}-b-{impl}"
    flat = work / "whereabouts.conf"
    flat.write_text(json.dumps({"datastore": "kubernetes",
                                "kubernetes": {"kubeconfig": node.env["KUBECONFIG"]}}))
    node.kubectl("create", "namespace", ns)
    try:
        if impl != "floor":
            node.apply([nad(f"bench-{i}", ns, network(impl, i, master, node, flat)) for i in range(m)])
        nets = ",".join(f"bench-{i}" for i in range(m))
        names = [f"p{j}" for j in range(n)]
        docs = [pod(name, ns, nets) for name in names]
        if impl == "floor":  # the cluster network only
            for doc in docs:
                del doc["metadata"]["annotations"]
        log_at = (node.dir / "containerd.log").stat().st_size
        multus_at = (node.cni_conf_dir.parent / "multus.log").stat().st_size
        served = agent_seconds(node)
        requests = api_requests(node)
        cpu = cpu_seconds(node)
        start, wall = time.monotonic(), time.time()
        node.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        running: dict[str, float] = {}
        deadline = start + TIMEOUT
        while len(running) < n and time.monotonic() < deadline:
            for p in node.get("-n", ns, "pods")["items"]:
                if p["status"].get("phase") == "Running" and p["metadata"]["name"] not in running:
                    running[p["metadata"]["name"]] = time.monotonic() - start
            if len(running) < n:
                time.sleep(0.5)
        all_running = time.monotonic() - start if len(running) == n else float("nan")
        events = node.get("-n", ns, "events")["items"]
        failed = [e for e in events if e.get("reason") in ("FailedCreatePodSandBox", "FailedKillPod")]
        held = pool_size(node)
        phases = sandbox_phases(node, ns, log_at, wall)
        secondary = secondary_seconds(node, ns, multus_at)
        after = agent_seconds(node)
        now = api_requests(node)
        cpu_used = {k: round(v - cpu.get(k, 0.0), 1) for k, v in cpu_seconds(node).items()}
        made = {k: v - requests.get(k, 0.0) for k, v in now.items() if v - requests.get(k, 0.0) >= 1}
        in_agent = {k: (c - served.get(k, (0, 0))[0], t - served.get(k, (0, 0))[1])
                    for k, (c, t) in after.items()}
        start = time.monotonic()
        node.kubectl("-n", ns, "delete", "pods", "--all", "--wait=false")
        gone = released = float("nan")
        pooled = impl != "floor"  # the floor's pods hold no address: no pool to wait for
        deadline = start + TIMEOUT
        while time.monotonic() < deadline:
            if math.isnan(gone) and not node.get("-n", ns, "pods")["items"]:
                gone = time.monotonic() - start
            if pooled and math.isnan(released) and pool_size(node) == 0:
                released = time.monotonic() - start
            if not (math.isnan(gone) or (pooled and math.isnan(released))):
                break
            time.sleep(0.5)
        events = node.get("-n", ns, "events")["items"]
        failed += [e for e in events if e.get("reason") == "FailedKillPod"]
        per_pod = list(running.values())
        return {"impl": impl, "pods": n, "networks": 0 if impl == "floor" else m,
                "all_running_s": all_running,
                "p50_s": pct(per_pod, 0.5), "p99_s": pct(per_pod, 0.99), "not_running": n - len(running),
                "held_at_running": held, "all_gone_s": gone, "pool_empty_s": released,
                "failure_events": sum(int(e.get("count", 1)) for e in failed),
                "sandbox_asked_p50_s": pct(phases["asked"], 0.5),
                "sandbox_asked_p99_s": pct(phases["asked"], 0.99),
                "sandbox_setup_p50_s": pct(phases["took"], 0.5),
                "sandbox_setup_p99_s": pct(phases["took"], 0.99),
                "secondary_p50_s": pct(secondary, 0.5), "secondary_p99_s": pct(secondary, 0.99),
                "api_requests": round(sum(made.values())), "cpu_s": cpu_used,
                "api_requests_top": dict(sorted(made.items(), key=lambda kv: -kv[1])[:8]),
                "agent_add_mean_s": {k: t / c for k, (c, t) in in_agent.items() if c},
                "load_avg": os.getloadavg(),
                "failure_kinds": failure_kinds(failed),
                "failure_samples": [e.get("message", "")[-300:] for e in failed[:3]]}
    finally:  # pods a failed run left (a DEL that keeps failing) must not hold the namespace: forced
        node.kubectl("-n", ns, "delete", "pods", "--all", "--force", "--grace-period=0", check=False)
        node.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s", check=False, timeout=400)


def without_agent(node: kubenode.Cluster) -> None:
    ds = node.get("-n", kubenode.NS, "daemonset", "pycni-node")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    patch = [{"op": "remove", "path": f"/spec/template/spec/containers/{names.index('agent')}"}]
    node.kubectl("-n", kubenode.NS, "patch", "daemonset", "pycni-node", "--type=json", "-p",
                 json.dumps(patch))
    node.kubectl("-n", kubenode.NS, "rollout", "status", "daemonset/pycni-node", "--timeout=300s",
                 timeout=330)


def upstream_binaries(node: kubenode.Cluster) -> None:
    """pycni's DaemonSet gone (so nothing re-installs its entries), Go macvlan and upstream whereabouts in
    the node's bin dir (this cluster is discarded after the run)."""
    node.kubectl("-n", kubenode.NS, "delete", "daemonset", "pycni-node", "--wait=true", "--timeout=300s",
                 timeout=330)
    cache = Path(subprocess.run([str(kubenode.UPSTREAM / "unpack"), "whereabouts"], capture_output=True,
                                text=True, check=True).stdout.strip())
    shutil.copy2("/usr/lib/cni/macvlan", node.cni_bin_dir / "bench-go-macvlan")
    wa = node.cni_bin_dir / "whereabouts"
    wa.unlink()
    shutil.copy2(cache / "whereabouts", wa)


def num(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def running_time(results: list[dict[str, Any]], impl: str) -> float:
    return next((float(r["all_running_s"]) for r in results if r["impl"] == impl), float("nan"))


def table(results: list[dict[str, Any]]) -> str:
    """The table, then, with the floor measured, each side's all-Running above the floor's (the
    secondary networks' share) and upstream's over the floor's (the best ratio any plugin could reach)."""
    floor = running_time(results, "floor")
    head = ("| implementation | pods x networks | all Running (s) | above the floor (s) | "
            "p50 / p99 per pod (s) | addresses held | all gone (s) | pool empty (s) | failures | "
            "sandbox asked p50 / p99 (s) | sandbox set-up p50 / p99 (s) | secondary networks p50 / p99 (s) | "
            "API requests |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = [f"| {r['impl']} | {r['pods']} x {r['networks']} | {num(r['all_running_s'])} | "
            f"{num(r['all_running_s'] - floor)} | "
            f"{num(r['p50_s'])} / {num(r['p99_s'])} | {r['held_at_running']} | {num(r['all_gone_s'])} | "
            f"{num(r['pool_empty_s'])} | {r['not_running'] + r['failure_events']} | "
            f"{num(r['sandbox_asked_p50_s'])} / {num(r['sandbox_asked_p99_s'])} | "
            f"{num(r['sandbox_setup_p50_s'])} / {num(r['sandbox_setup_p99_s'])} | "
            f"{num(r['secondary_p50_s'], 0)} / {num(r['secondary_p99_s'], 0)} | {r['api_requests']} |"
            for r in results]
    upstream, against = running_time(results, "upstream"), []
    for impl in ("pycni-agent",):
        mine = running_time(results, impl)
        against.append((upstream / mine, f"upstream / {impl}, all Running: {upstream / mine:.2f}x"))
    ratios = [line for value, line in (
        *against,
        (upstream / floor, f"upstream / floor, all Running: {upstream / floor:.2f}x (the best ratio any "
                           "plugin could reach on this node)")) if not math.isnan(value)]
    return head + "\n".join(rows) + ("\n\n" + "\n".join(ratios) if ratios else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench-cluster", description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--pods", type=int, default=32)
    ap.add_argument("-m", "--networks", type=int, default=4)
    ap.add_argument("--only", default=",".join(IMPLS), help="comma-separated subset of " + ", ".join(IMPLS))
    args = ap.parse_args(argv)
    only = [i for i in IMPLS if i in args.only.split(",")]
    if not is_root():
        print("bench-cluster: needs root (a real node)", file=sys.stderr)
        return 2
    if reason := kubenode.absent():
        print(f"bench-cluster: {reason}", file=sys.stderr)
        return 2
    work = kubenode.short_workdir()
    lock = kubenode.KubeProxyLock()
    lock.acquire()
    node: kubenode.Cluster | None = None
    master = f"{RUN}bm"
    results: list[dict[str, Any]] = []
    try:
        node = kubenode.up(work)
        tag = f"{kubenode.REGISTRY}:{RUN}"
        archive = kubenode.image_archive(tag, work / "image")
        node.ctr("images", "import", str(archive))
        archive.unlink()
        overlay = kubenode.write_overlay(node, tag, work / "overlay")
        node.kubectl("apply", "-k", str(overlay))
        node.kubectl("-n", kubenode.NS, "rollout", "status", "daemonset/pycni-node", "--timeout=300s")
        sh("ip", "link", "add", master, "type", "veth", "peer", "name", master + "p")
        for link in (master, master + "p"):
            sh("ip", "link", "set", link, "up")
        for impl in only:
            if impl == "pycni-no-agent":
                without_agent(node)
            if impl == "upstream":
                upstream_binaries(node)
            results.append(run(impl, node, args.pods, args.networks, master, work))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        sh("ip", "link", "del", master, check=False)
        if node is not None:
            kubenode.down(node.dir)
        lock.release()
        shutil.rmtree(work, ignore_errors=True)
    out = REPO / "dist" / "bench" / "cluster.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
