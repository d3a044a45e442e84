"""What the cluster tests share about pods on the real node: the NADs of conf-examples/kubernetes/ as the
tests change them (`example_nad`, the module doc of test_pods.py says what and why), pods annotated with
them, and what the node's store holds for them."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml

from tests.cluster import kubenode
from tests.nsutil import REPO

EXAMPLES = REPO / "conf-examples" / "kubernetes"
NETWORKS = "k8s.v1.cni.cncf.io/networks"
STATUS = "k8s.v1.cni.cncf.io/network-status"
V4, V6 = ipaddress.ip_network("198.18.48.0/20"), ipaddress.ip_network("2001:db8:28::/64")
HOSTDEV_V4 = ipaddress.ip_network("198.18.32.0/20")  # hostdevice-pf.yaml's own range, unchanged
SETTLE = 180.0  # bounded wait for the kubelet, Multus and the plugins on a loaded 2-core machine


@dataclass
class Net:
    ns: str
    master: str  # the macvlan parent (veth, peer master + "p")
    device: str  # the host-device veth end the pod takes (peer device + "p")
    node: kubenode.Cluster


def example_nad(name: str, ns: str, changes: dict[str, Any], node: kubenode.Cluster,
                drop_annotations: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    conf = json.loads(doc["spec"]["config"])
    for key, value in changes.items():
        target = conf["ipam"] if key.startswith("ipam.") else conf
        target[key.removeprefix("ipam.")] = value
    conf["ipam"]["configuration_path"] = str(node.cni_conf_dir / "whereabouts.d" / "whereabouts.conf")
    conf["ipam"]["local_db"] = str(node.state_dir / "pycni" / "whereabouts.db")
    doc["metadata"]["namespace"] = ns
    if drop_annotations:
        doc["metadata"].pop("annotations", None)
    doc["spec"]["config"] = json.dumps(conf)
    return doc


def pod(name: str, ns: str, networks: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {NETWORKS: networks}},
            "spec": {"terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "c", "image": "kubenode.local/busybox:1.35",
                                     "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}}


def ready(node: kubenode.Cluster, ns: str, *names: str) -> None:
    node.kubectl("-n", ns, "wait", "--for=condition=Ready", *(f"pod/{n}" for n in names),
                 f"--timeout={SETTLE:.0f}s", timeout=SETTLE + 30)


def addresses(node: kubenode.Cluster, ns: str, name: str, ifname: str) -> list[ipaddress.IPv4Interface |
                                                                              ipaddress.IPv6Interface]:
    out = node.kubectl("-n", ns, "exec", name, "--", "ip", "-o", "addr", "show", "dev", ifname).stdout
    return [ipaddress.ip_interface(m) for m in re.findall(r"inet6? (\S+) .*scope global", out)]


def addresses_once_served(node: kubenode.Cluster, ns: str, name: str, ifname: str) -> list[
        ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    """`addresses`, awaited (bounded) until the kubelet serves `kubectl exec` for the pod: a kubelet just
    started again answers "pod does not exist" until it has synced its pods (the pod's Ready condition
    is still the old kubelet's)."""
    def probe() -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface] | None:
        try:
            return addresses(node, ns, name, ifname)
        except AssertionError:
            return None

    return kubenode.wait_for(f"kubectl exec into {ns}/{name}", probe, SETTLE)


def pool_owners(node: kubenode.Cluster) -> dict[str, set[str]]:
    """{pool name: the podrefs holding an address in it}, as the node's store wrote them."""
    pools = node.get("-n", kubenode.NS, "ippools.whereabouts.cni.cncf.io")["items"]
    return {p["metadata"]["name"]: {a["podref"] for a in (p["spec"].get("allocations") or {}).values()}
            for p in pools}


def reservations(node: kubenode.Cluster) -> dict[str, str]:
    items = node.get("-n", kubenode.NS, "overlappingrangeipreservations.whereabouts.cni.cncf.io")["items"]
    return {r["metadata"]["name"]: r["spec"]["podref"] for r in items}


def agent_served(node: kubenode.Cluster) -> dict[tuple[str, str], float]:
    """{(plugin, command): calls the agent served}, scraped from the node's address as Prometheus would;
    ("errors", "all"): those that failed."""
    url = f"http://{node.env['NODE_IP']}:9736/metrics"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {("errors", "all"): 0.0}
    for m in re.finditer(r'^pycni_attach_duration_seconds_count\{command="(\w+)",plugin="([\w-]+)"\} (\S+)$',
                         text, re.M):
        out[(m.group(2), m.group(1))] = float(m.group(3))
    for m in re.finditer(r'^pycni_attach_errors_total\{[^}]*\} (\S+)$', text, re.M):
        out[("errors", "all")] += float(m.group(1))
    return out


def pinged(node: kubenode.Cluster, ns: str, src: str, dst: str) -> bool:
    # an IPv6 address answers once its duplicate address detection is over: retried on the condition
    got = node.kubectl("-n", ns, "exec", src, "--", "ping", "-c", "1", "-W", "2", dst, check=False)
    return got.returncode == 0


def sandbox_failures(node: kubenode.Cluster, ns: str) -> list[str]:
    """The kubelet's events of failed sandbox set-ups or tear-downs (a CNI ADD or DEL that failed)."""
    events = node.get("-n", ns, "events")["items"]
    return [f"{e['reason']}: {e.get('message', '')}" for e in events
            if e.get("reason") in ("FailedCreatePodSandBox", "FailedKillPod")]


def settled(node: kubenode.Cluster, podrefs: set[str]) -> bool:
    held = set().union(*pool_owners(node).values()) | set(reservations(node).values())
    return not (held & podrefs)

def host_has(link: str) -> bool:
    got = subprocess.run(["ip", "link", "show", "dev", link], capture_output=True, check=False)
    return got.returncode == 0


POOLS = ("198.18.48.0-20", "2001-db8-28---64")  # the IPPools of V4 and V6, as the store names them


def running_tasks(node: kubenode.Cluster, ns: str, name: str) -> set[str]:
    """The containerd tasks still running for pod ns/name (its sandbox and containers)."""
    ids = set(node.ctr("containers", "ls", "-q", f'labels."io.kubernetes.pod.namespace"=={ns},'
                       f'labels."io.kubernetes.pod.name"=={name}').stdout.split())
    tasks = (line.split() for line in node.ctr("tasks", "ls").stdout.splitlines()[1:])
    return {t[0] for t in tasks if t[0] in ids and t[2] == "RUNNING"}


def held_by(node: kubenode.Cluster, podref: str) -> dict[str, list[tuple[str, str]]]:
    """{pool: [(offset, containerID)]} of the allocations the pools hold for `podref`."""
    pools = node.get("-n", kubenode.NS, "ippools.whereabouts.cni.cncf.io")["items"]
    out = {}
    for p in pools:
        entries = (p["spec"].get("allocations") or {}).items()
        out[p["metadata"]["name"]] = sorted((off, a["id"]) for off, a in entries if a["podref"] == podref)
    return out


def sandbox_of(node: kubenode.Cluster, uid: str) -> str:
    out = node.ctr("containers", "ls", "-q", f'labels."io.kubernetes.pod.uid"=={uid},'
                   'labels."io.cri-containerd.kind"==sandbox').stdout.split()
    assert len(out) == 1, out
    return out[0]


def force_delete(node: kubenode.Cluster, ns: str, name: str) -> None:
    """`--force --grace-period=0` with the kubelet stopped: the API object goes, its sandbox keeps running."""
    node.kubectl("-n", ns, "delete", "pod", name, "--force", "--grace-period=0", timeout=120)
    assert node.kubectl("-n", ns, "get", "pod", name, check=False).returncode != 0
    assert running_tasks(node, ns, name)  # its sandbox still runs: no DEL has been made


RECONCILE = ["/pycni/cni-bin/pycni-ipam", "--config=/etc/pycni/ipam.json", "reconcile", "--pods=kubernetes",
             "--interval=0"]  # the reconciler Deployment's command, one run


def reconciler_container(node: kubenode.Cluster) -> str:
    pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-reconciler")["items"]
    running = [p for p in pods if p["status"].get("phase") == "Running"]
    assert len(running) == 1, [p["metadata"]["name"] for p in pods]
    (status,) = running[0]["status"]["containerStatuses"]
    return str(status["containerID"]).removeprefix("containerd://")


def now() -> str:
    """The time as `kubectl logs --since-time` takes it (the node's clock is the host's)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reconciler_said(node: kubenode.Cluster, once: str, since: str) -> str:
    """What pycni's reconciler printed about a pod deleted while its DEL could not run: the output of
    the one run a test makes (RECONCILE) and the reconciler Deployment's own periodic runs since
    `since` (read once the kubelet is back: pod logs go through it). A periodic run may fall between
    the force-delete and the test's run and free the pod first, or judge it at the same time (one of
    the two writes wins its compare-and-swap); both are pycni's reconciler, so tests assert on the
    union (`freed_lines`, `freed_count`), never on which run won."""

    def fetch() -> list[str] | None:
        got = node.kubectl("-n", kubenode.NS, "logs", "deployment/pycni-reconciler", f"--since-time={since}",
                           check=False)
        return [got.stdout] if got.returncode == 0 else None

    return once + "\n" + kubenode.wait_for("the reconciler Deployment's log", fetch, SETTLE)[0]


def freed_lines(said: str) -> tuple[set[tuple[str, str, str, str]], set[tuple[str, str, str]]]:
    """The pool entries (ip, pool, podref, ifname) and reservations (name, podref, ifname) the runs in
    `said` (reconciler_said) freed or judged to free, each once."""
    entries = set(re.findall(r"^freeing (\S+) in pool (\S+) \((\S+) (\S+)\)", said, re.M))
    held = set(re.findall(r"^freeing reservation (\S+) \((\S+) (\S+)\)", said, re.M))
    return entries, held


def freed_count(said: str) -> int:
    """How many entries and reservations the runs in `said` freed in all (each is freed by one run: the
    others' compare-and-swap finds it gone)."""
    return sum(int(n) for n in re.findall(r"^freed (\d+) of \d+; kept \d+; left alone \d+$", said, re.M))


def agent_metrics(node: kubenode.Cluster, family: str) -> dict[str, float]:
    """{label value: sample} of one single-label counter family of the node's agent (e.g.
    pycni_podwatch_requests_total by verb), scraped from the node's address as Prometheus would."""
    url = f"http://{node.env['NODE_IP']}:9736/metrics"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
        text = resp.read().decode()
    pattern = rf'^{re.escape(family)}(?:\{{\w+="([^"]*)"\}})? (\S+)$'
    return {m.group(1) or "": float(m.group(2)) for m in re.finditer(pattern, text, re.M)}


def agent_container(node: kubenode.Cluster) -> str:
    """The containerd ID of the node's running pycni agent container."""
    pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    (status,) = (s for p in pods if p["status"].get("phase") == "Running"
                 for s in p["status"]["containerStatuses"] if s["name"] == "agent")
    return str(status["containerID"]).removeprefix("containerd://")


@contextmanager
def frozen(node: kubenode.Cluster, container: str) -> Iterator[None]:
    """A container paused for the block (cgroup freezer: `ctr tasks pause`), resumed after it, also on
    failure: the agent, so that its pod watch frees nothing meanwhile (tests of the reconciler; only
    while the kubelet is stopped: a plugin call would wait for a frozen agent), or the reconciler, so
    that its periodic run frees nothing meanwhile (tests of the pod watch)."""
    node.ctr("tasks", "pause", container)
    try:
        yield
    finally:
        node.ctr("tasks", "resume", container)
