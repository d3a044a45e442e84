"""`make bench-thick`: what N pods at once do to Multus thick (v4.3.0, upstream's DaemonSet with its 100m
CPU / 50Mi limits: tests/cluster/thick.py) on a real single-node cluster when the plugins run inside
multus-daemon's container, side by side in one run. Not a timed test: it prints a markdown table and
writes dist/bench/thick.json.

Workload: N pods (default 6 and 12) created at once (one `kubectl apply`), each with one secondary network:
macvlan (mode bridge, on a veth of the run's) + whereabouts IPAM on the Kubernetes store (one shared range,
one IPPool). Measured per round: pods Running within the timeout (default 180 s) and the time until all
were, multus-daemon's restarts and OOM kills during the round (its container's restartCount, and the
terminations whose reason was OOMKilled, polled), the failure events (FailedCreatePodSandBox /
FailedKillPod), then from one `kubectl delete` of the pods to all gone (at most 120 s) and what the pool
still holds then and up to 60 s later (until it is empty); multus-daemon's memory cgroup (peak since its
start), and with the agent its cgroup's peak and the CPU seconds it used in the round.
Between rounds the multus-daemon pod is replaced (its restart count and crash-loop back-off start again).

Sides, one after the other on the same cluster (as tests/bench/cluster.py does them):
- pycni-agent: pycni's DaemonSet with its agent (every call served by the agent: the plugin entries only
  hand their calls over);
- pycni-no-agent: the DaemonSet without its agent container: every plugin runs in-process inside
  multus-daemon's container (its memory and CPU counted against the daemon's limits);
- upstream: Debian's Go macvlan + upstream whereabouts v0.9.4, also inside multus-daemon's container.

    python -m tests.bench.thick [-n 6,12] [--rounds 1] [--only pycni-agent,pycni-no-agent,upstream]
        [--timeout 180] [--daemon-memory 160Mi]   (root)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.bench.cluster import nad, network, pool_size, proc_cpu, upstream_binaries
from tests.cluster import kubenode, thick
from tests.cluster.pods import pod
from tests.nsutil import REPO, RUN, is_root, sh

SIDES = ("pycni-agent", "pycni-no-agent", "upstream")


class DaemonWatch:
    """multus-daemon's restarts and OOM kills seen by polling its container status (the kubelet keeps
    only the last termination: each poll that sees the restart count move counts that one)."""

    def __init__(self, node: kubenode.Cluster) -> None:
        self.node = node
        self.restarts = 0
        self.ooms = 0
        self.last = self._status()

    def _status(self) -> tuple[str, int, str]:
        for p in thick.daemon_pods(self.node):
            for c in p["status"].get("containerStatuses", []):
                reason = c.get("lastState", {}).get("terminated", {}).get("reason", "")
                return str(p["metadata"]["uid"]), int(c.get("restartCount", 0)), str(reason)
        return "", 0, ""

    def poll(self) -> None:
        uid, count, reason = self._status()
        if uid == self.last[0] and count > self.last[1]:
            self.restarts += count - self.last[1]
            self.ooms += reason == "OOMKilled"  # the last of them; more between two polls are not seen
        self.last = (uid, count, reason) if uid else self.last


def agent_up(node: kubenode.Cluster) -> bool:
    """The DaemonSet's one pod is the one `kubectl set env` made (its agent has the env) and its agent
    is Ready."""
    pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    if len(pods) != 1 or "deletionTimestamp" in pods[0]["metadata"]:
        return False
    (agent,) = (c for c in pods[0]["spec"]["containers"] if c["name"] == "agent")
    return any(e["name"] == "KUBERNETES_SERVICE_HOST" for e in agent.get("env", [])) and any(
        c["name"] == "agent" and c.get("ready") for c in pods[0]["status"].get("containerStatuses") or [])


def container_pid(node: kubenode.Cluster, ns: str, selector: str, name: str) -> int:
    """The host pid of container `name` of the (one) pod matching `selector` (0: none running)."""
    ids = {s["containerID"].removeprefix("containerd://")
           for p in node.get("-n", ns, "pods", "-l", selector)["items"]
           for s in p["status"].get("containerStatuses", []) if s["name"] == name and s.get("containerID")}
    tasks = (line.split() for line in node.ctr("tasks", "ls").stdout.splitlines()[1:])
    return next((int(t[1]) for t in tasks if t[0] in ids and t[2] == "RUNNING"), 0)


def memory(pid: int) -> dict[str, float]:
    """The memory cgroup (v1) of process `pid`: its peak charge since the container started, and the
    anonymous memory (rss) and page cache it holds now, MiB."""
    if not pid:
        return {}
    path = next(line.split(":", 2)[2] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if line.split(":", 2)[1] == "memory")
    group = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    return {"peak_mib": int((group / "memory.max_usage_in_bytes").read_text()) / 2**20,
            "rss_mib": int(stat["total_rss"]) / 2**20, "cache_mib": int(stat["total_cache"]) / 2**20}


def without_agent(node: kubenode.Cluster) -> None:
    """pycni's DaemonSet without its agent container, awaited until its one pod is the new one (only the
    installer) and Running (not `rollout status`: the installer's readiness probe, 1 s, times out on this
    busy machine)."""
    ds = node.get("-n", kubenode.NS, "daemonset", "pycni-node")
    names = [c["name"] for c in ds["spec"]["template"]["spec"]["containers"]]
    patch = [{"op": "remove", "path": f"/spec/template/spec/containers/{names.index('agent')}"}]
    node.kubectl("-n", kubenode.NS, "patch", "daemonset", "pycni-node", "--type=json", "-p",
                 json.dumps(patch))

    def replaced() -> bool:
        pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
        return len(pods) == 1 and pods[0]["status"].get("phase") == "Running" and [
            c["name"] for c in pods[0]["spec"]["containers"]] == ["installer"]

    kubenode.wait_for("pycni's DaemonSet pod without its agent", replaced, 300)


def fresh_daemon(node: kubenode.Cluster) -> None:
    """The multus-daemon pod replaced (a restart count of 0, no crash-loop back-off) and Ready."""
    node.kubectl("-n", thick.NS, "delete", "pod", "-l", "name=multus", "--wait=true", "--timeout=120s",
                 timeout=150)
    node.kubectl("-n", thick.NS, "rollout", "status", f"daemonset/{thick.DS}", "--timeout=300s", timeout=330)
    def ready() -> bool:
        pods = thick.daemon_pods(node)
        return len(pods) == 1 and pods[0]["status"].get("phase") == "Running" and all(
            c.get("ready") for c in pods[0]["status"].get("containerStatuses") or [{}])

    kubenode.wait_for("the new multus-daemon Ready", ready, 120)


def run(side: str, node: kubenode.Cluster, n: int, master: str, work: Path, timeout: float,
        round_: int) -> dict[str, Any]:
    ns = f"{RUN}-t-{side}-{n}-{round_}"
    flat = work / "whereabouts.conf"
    flat.write_text(json.dumps({"datastore": "kubernetes",
                                "kubernetes": {"kubeconfig": node.env["KUBECONFIG"]}}))
    fresh_daemon(node)
    node.kubectl("create", "namespace", ns)
    try:
        impl = "upstream" if side == "upstream" else "pycni"
        node.apply([nad("bench-0", ns, network(impl, 0, master, node, flat))])
        names = [f"p{j}" for j in range(n)]
        watch = DaemonWatch(node)
        agent = container_pid(node, kubenode.NS, "app.kubernetes.io/name=pycni-node", "agent")
        agent_cpu = proc_cpu(agent)
        start = time.monotonic()
        docs = [pod(name, ns, "bench-0") for name in names]
        node.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        running: set[str] = set()
        all_running = float("nan")
        while time.monotonic() < start + timeout:
            running = {p["metadata"]["name"] for p in node.get("-n", ns, "pods")["items"]
                       if p["status"].get("phase") == "Running"}
            watch.poll()
            if len(running) == n:
                all_running = time.monotonic() - start
                break
            time.sleep(1.0)
        events = node.get("-n", ns, "events")["items"]
        failed = sum(int(e.get("count", 1)) for e in events
                     if e.get("reason") in ("FailedCreatePodSandBox", "FailedKillPod"))
        held = pool_size(node)
        daemon_mem = memory(container_pid(node, thick.NS, "name=multus", "kube-multus"))
        agent_mem, agent_cpu = memory(agent), proc_cpu(agent) - agent_cpu
        start = time.monotonic()
        node.kubectl("-n", ns, "delete", "pods", "--all", "--wait=false")
        gone = float("nan")
        while time.monotonic() < start + min(timeout, 120.0):
            watch.poll()
            if not node.get("-n", ns, "pods")["items"]:
                gone = time.monotonic() - start
                break
            time.sleep(1.0)
        at_gone = pool_size(node)
        empty = float("nan")  # then up to 60 s more for the pool to empty (a DEL still running, retried)
        start = time.monotonic()
        while time.monotonic() < start + 60.0:
            if pool_size(node) == 0:
                empty = time.monotonic() - start
                break
            watch.poll()
            time.sleep(1.0)
        return {"side": side, "pods": n, "round": round_, "running": len(running),
                "left_in_pool_when_gone": at_gone, "pool_empty_after_gone_s": empty,
                "all_running_s": all_running, "daemon_restarts": watch.restarts, "oom_kills": watch.ooms,
                "failure_events": failed, "held_at_end_of_wait": held, "all_gone_s": gone,
                "left_in_pool": pool_size(node), "multus_daemon_memory": daemon_mem,
                "agent_memory": agent_mem, "agent_cpu_s": agent_cpu if agent else None}
    finally:  # what a crash-looping daemon left: forced, the namespace gone, the pool emptied for the next
        node.kubectl("-n", ns, "delete", "pods", "--all", "--force", "--grace-period=0", check=False)
        node.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s", check=False, timeout=400)
        node.kubectl("-n", kubenode.NS, "delete", "ippools.whereabouts.cni.cncf.io", "--all", check=False)
        node.kubectl("-n", kubenode.NS, "delete", "overlappingrangeipreservations.whereabouts.cni.cncf.io",
                     "--all", check=False)
        node.kubectl("-n", "default", "delete", "ippools.whereabouts.cni.cncf.io", "--all", check=False)
        node.kubectl("-n", "default", "delete", "overlappingrangeipreservations.whereabouts.cni.cncf.io",
                     "--all", check=False)


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| side | pods | round | Running | all Running (s) | multus-daemon restarts | OOM kills | "
            "failure events | in pool when gone, 60 s later | multus-daemon peak MiB | "
            "agent peak MiB, CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = "-" if math.isnan(r["all_running_s"]) else f"{r['all_running_s']:.0f}"
        peak = r["multus_daemon_memory"].get("peak_mib", float("nan"))
        agent = f"{r['agent_memory']['peak_mib']:.0f}, {r['agent_cpu_s']:.1f}" if r["agent_memory"] else "-"
        rows.append(f"| {r['side']} | {r['pods']} | {r['round']} | {r['running']}/{r['pods']} | {t} | "
                    f"{r['daemon_restarts']} | {r['oom_kills']} | {r['failure_events']} | "
                    f"{r.get('left_in_pool_when_gone', '?')}, {r['left_in_pool']} | {peak:.0f} | {agent} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench-thick", description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--pods", default="6,12")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--only", default=",".join(SIDES))
    ap.add_argument("--daemon-memory", default="", help="multus-daemon's memory request = limit instead "
                    "of upstream's 50Mi (e.g. 160Mi)")
    args = ap.parse_args(argv)
    sides = [s for s in SIDES if s in args.only.split(",")]
    counts = [int(x) for x in args.pods.split(",")]
    if not is_root():
        print("bench-thick: needs root (a real node)", file=sys.stderr)
        return 2
    if reason := kubenode.absent():
        print(f"bench-thick: {reason}", file=sys.stderr)
        return 2
    work = kubenode.short_workdir()
    node: kubenode.Cluster | None = None
    master = f"{RUN}tm"
    results: list[dict[str, Any]] = []
    try:
        # no kube-proxy (so no host-wide lock: it runs beside the cluster suite): the in-cluster clients
        # on the host network (pycni's installer, which writes the plugins' kubeconfig, and multus-daemon)
        # are told the API server's own address instead of the `kubernetes` Service's
        node = kubenode.up(work, kube_proxy=False)
        api = kubenode.api_env(node)
        tag = f"{kubenode.REGISTRY}:{RUN}"
        archive = kubenode.image_archive(tag, work / "image")
        node.ctr("images", "import", str(archive))
        archive.unlink()
        overlay = kubenode.write_overlay(node, tag, work / "overlay")
        node.kubectl("apply", "-k", str(overlay))
        node.kubectl("-n", kubenode.NS, "set", "env", "daemonset/pycni-node", "--all",
                     *(f"{k}={v}" for k, v in api.items()))
        kubenode.wait_for("pycni's agent with the API server's address", lambda: agent_up(node), 300)
        sh("ip", "link", "add", master, "type", "veth", "peer", "name", master + "p")
        for link in (master, master + "p"):
            sh("ip", "link", "set", link, "up")
        fifo = str(node.agent_fifo_dir / "agent.fifo")
        thick.install(thick.prepare(node), {"PYCNI_AGENT_FIFO": fifo, **api}, args.daemon_memory)
        for side in sides:
            if side == "pycni-no-agent":
                without_agent(node)
            if side == "upstream":
                upstream_binaries(node)
            for n in counts:
                for r in range(args.rounds):
                    results.append(run(side, node, n, master, work, args.timeout, r)
                                   | {"daemon_memory_limit": args.daemon_memory or thick.MEMORY_LIMIT})
                    print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    finally:
        sh("ip", "link", "del", master, check=False)
        if node is not None:
            kubenode.down(node.dir)  # the cluster is discarded: thick's objects and files with it
        shutil.rmtree(work, ignore_errors=True)
    out = REPO / "dist" / "bench" / "thick.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
