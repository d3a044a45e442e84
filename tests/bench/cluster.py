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
  discarded afterwards. Its flat file (admin kubeconfig) is in the run's directory.

    python -m tests.bench.cluster [-n PODS] [-m NETWORKS] [--only NAME,...]   (root)
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import kubenode
from tests.cluster.pods import pod
from tests.nsutil import REPO, RUN, is_root, sh

RANGE = "198.18.64.0/18"
POOL = "198.18.64.0-18"
IMPLS = ("pycni-agent", "pycni-no-agent", "upstream")
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
        node.apply([nad(f"bench-{i}", ns, network(impl, i, master, node, flat)) for i in range(m)])
        nets = ",".join(f"bench-{i}" for i in range(m))
        names = [f"p{j}" for j in range(n)]
        docs = [pod(name, ns, nets) for name in names]
        start = time.monotonic()
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
        start = time.monotonic()
        node.kubectl("-n", ns, "delete", "pods", "--all", "--wait=false")
        gone = released = float("nan")
        deadline = start + TIMEOUT
        while time.monotonic() < deadline:
            if math.isnan(gone) and not node.get("-n", ns, "pods")["items"]:
                gone = time.monotonic() - start
            if math.isnan(released) and pool_size(node) == 0:
                released = time.monotonic() - start
            if not (math.isnan(gone) or math.isnan(released)):
                break
            time.sleep(0.5)
        events = node.get("-n", ns, "events")["items"]
        failed += [e for e in events if e.get("reason") == "FailedKillPod"]
        per_pod = list(running.values())
        return {"impl": impl, "pods": n, "networks": m, "all_running_s": all_running,
                "p50_s": pct(per_pod, 0.5), "p99_s": pct(per_pod, 0.99), "not_running": n - len(running),
                "held_at_running": held, "all_gone_s": gone, "pool_empty_s": released,
                "failure_events": len(failed),
                "failure_samples": [e.get("message", "")[:300] for e in failed[:3]]}
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


def table(results: list[dict[str, Any]]) -> str:
    head = ("| implementation | pods x networks | all Running (s) | p50 / p99 per pod (s) | addresses held | "
            "all gone (s) | pool empty (s) | failures |\n|---|---|---|---|---|---|---|---|\n")
    rows = [f"| {r['impl']} | {r['pods']} x {r['networks']} | {r['all_running_s']:.1f} | "
            f"{r['p50_s']:.1f} / {r['p99_s']:.1f} | {r['held_at_running']} | {r['all_gone_s']:.1f} | "
            f"{r['pool_empty_s']:.1f} | {r['not_running'] + r['failure_events']} |" for r in results]
    return head + "\n".join(rows)


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
