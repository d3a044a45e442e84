"""pycni installed on a real node as an operator installs it: the overlay changes only what it lists,
the DaemonSet becomes Ready with the shipped probes, resources and security settings, and the installer
container put the bundle and the IPAM's node files where this node's containerd looks."""

from __future__ import annotations

import json
import os
import re
import stat
import urllib.request
from typing import Any

from tests.cluster import kubenode
from tests.cluster.conftest import Installed
from tests.unit import test_manifests as tm


def differences(a: Any, b: Any, path: str = "") -> set[str]:
    """JSON-pointer paths where a and b differ (lists element-wise; a longer list differs at its tail)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {p for k in a.keys() | b.keys() for p in differences(a.get(k), b.get(k), f"{path}/{k}")}
    if isinstance(a, list) and isinstance(b, list):
        return {p for i in range(max(len(a), len(b)))
                for p in differences(a[i] if i < len(a) else None, b[i] if i < len(b) else None,
                                     f"{path}/{i}")}  # fmt: skip
    return set() if a == b else {path}


def key(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata'].get('namespace', '')}/{doc['metadata']['name']}"


DS, CM = "DaemonSet/pycni-system/pycni-node", "ConfigMap/pycni-system/pycni-node"
WORKLOADS = (DS, "Deployment/pycni-system/pycni-reconciler")


def at(doc: Any, path: str) -> Any:
    for part in path.strip("/").split("/"):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def image_paths(docs: dict[str, Any]) -> set[tuple[str, str]]:
    return {(k, f"/spec/template/spec/containers/{i}/image")
            for k in WORKLOADS for i, _ in enumerate(docs[k]["spec"]["template"]["spec"]["containers"])}


def images(docs: dict[str, Any]) -> set[str]:
    return {c["image"] for k in WORKLOADS for c in docs[k]["spec"]["template"]["spec"]["containers"]}


def test_the_overlay_changes_exactly_what_it_lists(installed: Installed) -> None:
    """docs/install.md's overlay (this node's directories in its cni-dirs.yaml) changes the ConfigMap's
    two values, the four host paths that follow them and the image, nothing else, and everything that
    names a CNI directory then agrees (tests/unit/test_manifests.py node_dirs); the suite's own layer
    over it changes exactly what overlay_changes lists, and the image."""
    node = installed.cluster
    shipped = {key(d): d for d in kubenode.render(node, kubenode.MANIFESTS)}
    documented_docs = kubenode.render(node, installed.overlay / "my-overlay")
    documented = {key(d): d for d in documented_docs}
    ours = {key(d): d for d in kubenode.render(node, installed.overlay)}
    assert shipped.keys() == documented.keys() == ours.keys()
    spec = shipped[DS]["spec"]["template"]["spec"]
    volumes = {v["name"]: i for i, v in enumerate(spec["volumes"])}
    agent = next(i for i, c in enumerate(spec["containers"]) if c["name"] == "agent")
    mounts = {m["name"]: j for j, m in enumerate(spec["containers"][agent]["volumeMounts"])}
    host_paths = {f"/spec/template/spec/volumes/{volumes[n]}/hostPath/path" for n in ("cni-bin", "cni-conf")}
    host_paths |= {f"/spec/template/spec/containers/{agent}/volumeMounts/{mounts[n]}/mountPath"
                   for n in ("cni-bin", "cni-conf")}
    want = {(CM, "/data/cni-bin-dir"), (CM, "/data/cni-conf-dir")} | {(DS, p) for p in host_paths}
    got = {(k, p) for k in shipped for p in differences(shipped[k], documented[k])}
    assert got == want | image_paths(shipped)
    assert tm.node_dirs(documented_docs) == {"bin": str(node.cni_bin_dir), "conf": str(node.cni_conf_dir)}

    ds = shipped[DS]
    for path, name in kubenode.EXPECTED_NAMES.items():  # each index names what the change says it does
        assert at(ds, path)["name"] == name, (path, at(ds, path)["name"])
    want = set()
    appended: dict[str, int] = {}  # list -> items the overlay appended to it so far
    for op, path, _, why in kubenode.overlay_changes(node):
        assert why and op in ("replace", "add")
        if op == "add" and path.endswith("/-"):
            index = len(at(ds, path[:-2])) + appended.get(path, 0)
            appended[path] = appended.get(path, 0) + 1
            want.add((DS, f"{path[:-2]}/{index}"))
        else:
            want.add((DS, path))
    got = {(k, p) for k in documented for p in differences(documented[k], ours[k])}
    assert got == want | image_paths(shipped)
    assert images(shipped) == {tm.container("DaemonSet")["image"]}  # pycni:<version>: docker.io/library
    assert images(ours) == {installed.tag}


def test_the_daemonset_is_ready_with_the_shipped_probes_resources_and_security(installed: Installed) -> None:
    node = installed.cluster
    ds = node.get("-n", kubenode.NS, "daemonset", "pycni-node")
    assert ds["status"]["desiredNumberScheduled"] == 1
    assert ds["status"]["numberReady"] == 1 == ds["status"]["updatedNumberScheduled"]
    shipped = {c["name"]: c for c in tm.by_kind("DaemonSet")[0]["spec"]["template"]["spec"]["containers"]}
    live = {c["name"]: c for c in ds["spec"]["template"]["spec"]["containers"]}
    assert live.keys() == shipped.keys() == {"installer", "agent"}
    for name, c in shipped.items():
        for field in ("readinessProbe", "resources", "securityContext", "env", "ports"):
            if field in c:
                # the API server fills in defaults (probe timeouts, protocol): every shipped field is there
                assert subset(c[field], live[name][field]), (name, field, c[field], live[name][field])
    pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    assert len(pods) == 1
    statuses = {s["name"]: s for s in pods[0]["status"]["containerStatuses"]}
    assert all(s["ready"] for s in statuses.values()), statuses
    assert all(s["restartCount"] == 0 for s in statuses.values()), statuses


def subset(want: Any, got: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and all(k in got and subset(v, got[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(got, list) and len(want) == len(got) and all(map(subset, want, got))
    return bool(want == got or str(want) == str(got))


def test_the_installer_put_the_bundle_and_node_files_where_containerd_looks(installed: Installed) -> None:
    node = installed.cluster
    from cni.registry import PLUGINS

    for plugin in PLUGINS:
        entry = node.cni_bin_dir / plugin
        assert entry.is_symlink() and os.readlink(entry).startswith(".pycni/"), entry
        assert os.access(entry, os.X_OK)
    sub = node.cni_conf_dir / "whereabouts.d"
    flat = json.loads((sub / "whereabouts.conf").read_text())
    assert flat["datastore"] == "kubernetes"
    assert flat["kubernetes"]["kubeconfig"] == str(sub / "whereabouts.kubeconfig")
    kc = json.loads((sub / "whereabouts.kubeconfig").read_text())
    assert kc["users"][0]["user"] == {"tokenFile": str(sub / "pycni-sa-token")}
    assert kc["clusters"][0]["cluster"]["server"] == "https://" + node.env["KUBERNETES_SERVICE_IP"] + ":443"
    for f in sub.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert (sub / "nodename").read_text() == node.env["NODE_NAME"]


def reconcile_runs(node: kubenode.Cluster) -> dict[str, float] | None:
    """{result: runs} from the reconciler's metrics on its pod address (None until it has one)."""
    pods = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-reconciler")["items"]
    ip = pods[0]["status"].get("podIP") if len(pods) == 1 else None
    if not ip:
        return None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{ip}:9737/metrics", timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r'^pycni_reconcile_runs_total\{result="(\w+)"\} (\S+)$', text, re.M)}


def test_the_reconciler_reaches_the_api_in_cluster_without_cluster_dns(installed: Installed) -> None:
    """The Deployment as shipped: its first run (at start) lists the pools through the `kubernetes`
    Service's address from its environment; this node has no cluster DNS."""
    node = installed.cluster
    runs = kubenode.wait_for("a reconcile run", lambda: (r := reconcile_runs(node)) and sum(r.values()) and r,
                             180)
    assert runs.get("ok", 0) >= 1 and runs.get("error", 0) == 0, runs


def test_the_daemonset_needs_no_mount_propagation(installed: Installed) -> None:
    """The CRI refuses a HostToContainer/Bidirectional hostPath mount whose containing mount is private
    ("/" on a node without systemd). The kit makes "/" shared while a cluster runs, so this node cannot
    show that refusal: the live spec is checked instead (tests/test_pods.py shows the agent serving pods
    whose namespaces were mounted after it started, which it can only open through the descriptor the
    shim passes: its mounts are private)."""
    ds = installed.cluster.get("-n", kubenode.NS, "daemonset", "pycni-node")
    mounts = [m for c in ds["spec"]["template"]["spec"]["containers"] for m in c["volumeMounts"]]
    assert {m.get("mountPropagation", "None") for m in mounts} == {"None"}, mounts
