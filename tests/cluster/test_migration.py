"""Migration on a live node, both ways, NADs unchanged (the real-node version of
tests/kubeapi/test_migration.py, which covers mixed pools call by call on the API alone).

The node starts with pycni installed (the package fixture). Two pods attached by pycni (`ours-1`,
`ours-gone`) stay while the node goes back to upstream whereabouts v0.9.4, the rollback docs/install.md
describes: pycni's installer rolled out with `--uninstall` (its plugins removed, the node's own macvlan put
back), its DaemonSet and reconciler deleted, the namespace, CRDs, pools and reservations kept; then upstream
installed as its DaemonSet (doc/crds/daemonset-install.yaml) would be, both of its processes:
- its CNI install, as `install-cni.sh` does it, from the host (`install_upstream`: its CRDs, its
  ServiceAccount and ClusterRole, a kubeconfig with that ServiceAccount's token inline and the CA inline,
  the flat file `whereabouts.d/whereabouts.conf` in the node's CNI conf dir, its binary as `whereabouts` in
  the node's CNI bin dir);
- its pod-deletion reconciler `ip-control-loop` as a DaemonSet with upstream's own pod spec (ServiceAccount,
  hostNetwork, privileged, env NODENAME and WHEREABOUTS_NAMESPACE, `-log-level debug`, resources, the CNI
  dirs at /host/opt/cni/bin and /host/etc/cni/net.d). There is no upstream image here: its image is the
  binary built from upstream's sources (../shared/upstream) alone, at upstream's path `/ip-control-loop`,
  and its container runs only that (the install above stands for the command's first lines). It talks to
  the API server through the `kubernetes` Service with its projected token, as upstream's does.
Pods attached by upstream (`up-1`, `up-gone`; Debian's Go macvlan) reach `ours-1`. With the kubelet stopped
(nothing can run a DEL) `ours-gone` is force-deleted: upstream's ip-control-loop frees its entries (pycni's
"lean" pool entries) and reservations, reports them (IPAddressGarbageCollected events), and leaves every
entry and reservation of the live pods of both sides as they were. Then upstream's DEL releases what pycni
allocated for `ours-1`.

Then pycni's DaemonSet replaces upstream's again (upstream's DaemonSet deleted, `kubectl apply -k` of the
same overlay): `up-1` keeps working (a new pycni pod reaches it); with the kubelet stopped `up-gone` is
force-deleted and pycni's reconciler (its Deployment's command, run once in its container) frees exactly
upstream's entries and reservations of it, no live pod's; pycni's DEL releases what upstream allocated for
`up-1`. The upstream node as it was just before that install becomes the state the uninstall test must give
back (upstream's binary, flat file and kubeconfig included: the installer keeps what it displaced).

What the test does not run: upstream's token-watcher.sh (the token it writes lasts the test) and node
slices. Upstream's objects live in pycni's namespace (its kubeconfig context names it, its DaemonSet runs
there), as a migration must keep them in one namespace."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.bundle_layouts import snapshot
from tests.cluster import kubenode
from tests.cluster.conftest import Installed
from tests.cluster.pods import (
    POOLS,
    RECONCILE,
    SETTLE,
    Net,
    addresses,
    addresses_once_served,
    force_delete,
    freed_count,
    freed_lines,
    held_by,
    now,
    pinged,
    pod,
    pool_owners,
    ready,
    reconciler_container,
    reconciler_said,
    reservations,
    running_tasks,
    sandbox_failures,
    settled,
)
from tests.nsutil import RUN

# upstream's doc/crds/daemonset-install.yaml (v0.9.4): the ServiceAccount and ClusterRole its DaemonSet runs
# as (its rules as written there); the ClusterRole and its binding are cluster-scoped: the run's prefix
UPSTREAM_RULES: list[dict[str, Any]] = [
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
SA = "whereabouts"


def upstream_rbac() -> list[dict[str, Any]]:
    role = f"{RUN}-whereabouts-cni"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": kubenode.NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
         "rules": UPSTREAM_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": kubenode.NS}]},
    ]


def install_upstream(node: kubenode.Cluster) -> None:
    """What upstream's DaemonSet does on a node (script/install-cni.sh), from the host: the kubeconfig
    (server from the `kubernetes` Service, CA and ServiceAccount token inline, context namespace), the flat
    file naming it (host paths), both 0600, then the binary copied into the CNI bin dir."""
    node.kubectl("apply", "-f", str(kubenode.UPSTREAM / "whereabouts-crds"))
    node.apply(upstream_rbac())
    token = node.kubectl("-n", kubenode.NS, "create", "token", SA, "--duration=2h").stdout.strip()
    ca = base64.b64encode(Path(node.env["CA_FILE"]).read_bytes()).decode()
    sub = node.cni_conf_dir / "whereabouts.d"
    sub.mkdir(mode=0o755, exist_ok=True)
    kubeconfig = (
        "# Kubeconfig file for Multus CNI plugin.\napiVersion: v1\nkind: Config\nclusters:\n- name: local\n"
        f"  cluster:\n    server: https://{node.env['KUBERNETES_SERVICE_IP']}:443\n"
        f"    certificate-authority-data: {ca}\nusers:\n- name: whereabouts\n  user:\n"
        f'    token: "{token}"\ncontexts:\n- name: whereabouts-context\n  context:\n    cluster: local\n'
        f"    user: whereabouts\n    namespace: {kubenode.NS}\ncurrent-context: whereabouts-context\n")
    flat = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(sub / "whereabouts.kubeconfig")},
            "reconciler_cron_expression": "30 4 * * *"}
    for name, text in (("whereabouts.kubeconfig", kubeconfig), ("whereabouts.conf", json.dumps(flat))):
        fd = os.open(sub / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    binary = Path(subprocess.run([str(kubenode.UPSTREAM / "unpack"), "whereabouts"], capture_output=True,
                                 text=True, check=True, timeout=300).stdout.strip()) / "whereabouts"
    tmp = node.cni_bin_dir / f".{RUN}-whereabouts"
    shutil.copy2(binary, tmp)
    os.replace(tmp, node.cni_bin_dir / "whereabouts")


CONTROLLER = "whereabouts"  # upstream's DaemonSet (and its container), named as upstream names it
CONTROLLER_IMAGE = "kubenode.local/whereabouts-controller:v0.9.4"


def controller_image(node: kubenode.Cluster) -> None:
    """An image holding upstream's `ip-control-loop` binary at the path of upstream's image
    (`/ip-control-loop`), imported into the node's containerd: there is no upstream image here, only the
    binary built from upstream's sources (../shared/upstream/README.md)."""
    cache = subprocess.run([str(kubenode.UPSTREAM / "unpack"), "whereabouts-controller"], capture_output=True,
                           text=True, check=True, timeout=300).stdout.strip()
    tar = node.host.parent / f"{RUN}-whereabouts-controller.tar"
    subprocess.run([str(kubenode.UPSTREAM / "mkimage"), str(tar), CONTROLLER_IMAGE,
                    '{"Cmd": ["/ip-control-loop"]}', f"{cache}/whereabouts-controller=/ip-control-loop"],
                   capture_output=True, check=True, timeout=300)
    try:
        node.ctr("images", "import", str(tar))
    finally:
        tar.unlink()


def controller_daemonset(node: kubenode.Cluster) -> dict[str, Any]:
    """Upstream's DaemonSet (doc/crds/daemonset-install.yaml, v0.9.4) as it runs `ip-control-loop`: the
    same ServiceAccount, hostNetwork, privileged, tolerations, env (NODENAME, WHEREABOUTS_NAMESPACE),
    resources, flags (`-log-level debug`) and hostPath mounts at /host/opt/cni/bin and /host/etc/cni/net.d
    (this node's CNI dirs, as the pycni overlay points its own). Its container runs only the controller:
    the first two lines of upstream's command (install-cni.sh, token-watcher.sh) are install_upstream's,
    done from the host."""
    labels = {"tier": "node", "app": "whereabouts"}
    volumes = [("cnibin", node.cni_bin_dir, "/host/opt/cni/bin"),
               ("cni-net-dir", node.cni_conf_dir, "/host/etc/cni/net.d")]
    field = {"NODENAME": "spec.nodeName", "WHEREABOUTS_NAMESPACE": "metadata.namespace"}
    container = {
        "name": CONTROLLER, "image": CONTROLLER_IMAGE, "imagePullPolicy": "Never",
        "command": ["/ip-control-loop", "-log-level", "debug"],
        "env": [{"name": k, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": v}}}
                for k, v in field.items()],
        "resources": {"requests": {"cpu": "100m", "memory": "100Mi"},
                      "limits": {"cpu": "100m", "memory": "200Mi"}},
        "securityContext": {"privileged": True},
        "volumeMounts": [{"name": n, "mountPath": m} for n, _, m in volumes]}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": CONTROLLER, "namespace": kubenode.NS, "labels": labels},
        "spec": {"selector": {"matchLabels": {"name": CONTROLLER}},
                 "updateStrategy": {"type": "RollingUpdate"},
                 "template": {"metadata": {"labels": {**labels, "name": CONTROLLER}},
                              "spec": {"hostNetwork": True, "serviceAccountName": SA,
                                       "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
                                       "containers": [container],
                                       "volumes": [{"name": n, "hostPath": {"path": str(h)}}
                                                   for n, h, _ in volumes]}}}}


def controller_log(node: kubenode.Cluster) -> str:
    return node.kubectl("-n", kubenode.NS, "logs", f"daemonset/{CONTROLLER}").stdout


def start_controller(node: kubenode.Cluster, ns: str) -> None:
    """The DaemonSet rolled out, then proof that its pod watch delivers: a pod deleted after its start
    is logged by its delete handler ("deleted pod [ns/name]"). A deletion before its informers have
    listed would never reach it."""
    node.apply([controller_daemonset(node)])
    node.kubectl("-n", kubenode.NS, "rollout", "status", f"daemonset/{CONTROLLER}", "--timeout=300s",
                 timeout=330)
    probe = pod("watch-probe", ns, "roce-shared")
    probe["metadata"]["annotations"] = {}  # the cluster network only: nothing for the controller to free
    node.apply([probe])
    ready(node, ns, "watch-probe")
    node.kubectl("-n", ns, "delete", "pod", "watch-probe", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("upstream's ip-control-loop seeing a pod deletion",
                      lambda: f"deleted pod [{ns}/watch-probe]" in controller_log(node), SETTLE)


def stop_controller(node: kubenode.Cluster) -> None:
    """Upstream's DaemonSet deleted, as docs/install.md's move to pycni does, and awaited until its pod is
    gone (`--cascade=foreground`: the DaemonSet goes after its pod). `kubectl delete` alone returns while
    the pod terminates, and upstream's ip-control-loop, which does not act on SIGTERM
    (tests/kubeapi/wbupstream.py), goes on freeing deleted pods' addresses until the kubelet kills it at
    the end of its grace period: a pod force-deleted meanwhile would be freed by upstream, not pycni."""
    node.kubectl("-n", kubenode.NS, "delete", "daemonset", CONTROLLER, "--ignore-not-found", "--wait=true",
                 "--cascade=foreground", "--timeout=300s", timeout=330)
    assert not node.get("-n", kubenode.NS, "pods", "-l", f"name={CONTROLLER}")["items"]


def uninstall_pycni(node: kubenode.Cluster) -> None:
    """docs/install.md's rollback: the installer rolled out with --uninstall, then the DaemonSet and the
    reconciler deleted (namespace, CRDs, pools and reservations stay)."""
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": "--uninstall"}]
    ds = "daemonset/pycni-node"
    node.kubectl("-n", kubenode.NS, "patch", ds, "--type=json", "-p", json.dumps(patch))
    node.kubectl("-n", kubenode.NS, "rollout", "status", ds, "--timeout=300s", timeout=330)
    node.kubectl("-n", kubenode.NS, "delete", ds, "deployment/pycni-reconciler",
                 "--wait=true", "--timeout=300s", timeout=330)


def reinstall_pycni(node: kubenode.Cluster, installed: Installed) -> None:
    node.kubectl("apply", "-k", str(installed.overlay))
    for what in ("daemonset/pycni-node", "deployment/pycni-reconciler"):
        node.kubectl("-n", kubenode.NS, "rollout", "status", what, "--timeout=300s", timeout=330)


def is_ours(node: kubenode.Cluster, name: str) -> bool:
    entry = node.cni_bin_dir / name
    return entry.is_symlink() and os.readlink(entry).startswith(".pycni/")


def in_pools(node: kubenode.Cluster, ref: str) -> bool:
    owners = pool_owners(node)
    return all(ref in owners.get(p, set()) for p in POOLS)


def reach(node: kubenode.Cluster, ns: str, src: str, dst: list[Any]) -> None:
    for a in dst:  # IPv4 and IPv6 (an IPv6 address answers once its duplicate address detection is over)
        kubenode.wait_for(f"{src} pings {a.ip}", lambda a=a: pinged(node, ns, src, str(a.ip)), 60)


def holdings(node: kubenode.Cluster, refs: list[str]) -> dict[str, Any]:
    """What the store holds for each podref: its pool entries (offset, container id) and reservations."""
    held = reservations(node)
    return {ref: (held_by(node, ref), sorted(name for name, owner in held.items() if owner == ref))
            for ref in refs}


def collected(node: kubenode.Cluster, ns: str, name: str) -> set[str]:
    """The addresses upstream's ip-control-loop reported freeing for pod ns/name (its
    IPAddressGarbageCollected events: "successful cleanup of IP address [IP] from network NAD")."""
    events = node.get("-n", ns, "events", "--field-selector", f"involvedObject.name={name}")["items"]
    return {m for e in events if e.get("reason") == "IPAddressGarbageCollected"
            for m in re.findall(r"\[(\S+)\]", e.get("message", ""))}


def test_pods_move_from_pycni_to_upstream_whereabouts_and_back_on_a_live_node(
        net: Net, installed: Installed) -> None:
    node, ns = net.node, net.ns
    nad_version = node.get("-n", ns, "network-attachment-definitions", "roce-shared")["metadata"][
        "resourceVersion"]
    node.apply([pod("ours-1", ns, "roce-shared"), pod("ours-gone", ns, "roce-shared")])
    ready(node, ns, "ours-1", "ours-gone")
    ours1 = addresses(node, ns, "ours-1", "net1")
    gone = {str(a.ip) for a in addresses(node, ns, "ours-gone", "net1")}
    assert sorted(a.version for a in ours1) == [4, 6] and len(gone) == 2, (ours1, gone)
    kubenode.wait_for("ours-1 and ours-gone in the pools",
                      lambda: in_pools(node, f"{ns}/ours-1") and in_pools(node, f"{ns}/ours-gone"), SETTLE)

    # back to upstream whereabouts: its CNI install and its DaemonSet's ip-control-loop
    uninstall_pycni(node)
    assert not (node.cni_bin_dir / "whereabouts").exists() and not is_ours(node, "macvlan")
    back = False
    try:
        install_upstream(node)
        controller_image(node)
        start_controller(node, ns)
        node.apply([pod("up-1", ns, "roce-shared"), pod("up-gone", ns, "roce-shared")])
        ready(node, ns, "up-1", "up-gone")
        up1 = addresses(node, ns, "up-1", "net1")
        up_gone = {str(a.ip) for a in addresses(node, ns, "up-gone", "net1")}
        assert sorted(a.version for a in up1) == [4, 6] and not {a.ip for a in up1} & {a.ip for a in ours1}
        assert in_pools(node, f"{ns}/up-1") and in_pools(node, f"{ns}/up-gone")  # written before it answers
        reach(node, ns, "up-1", ours1)  # the pycni-attached pod keeps working

        # a pycni-attached pod deleted while its DEL cannot run: upstream's ip-control-loop frees its
        # (lean) entries and reservations, and nothing of the live pods of either side
        live = [f"{ns}/ours-1", f"{ns}/up-1", f"{ns}/up-gone"]
        kept = holdings(node, live)
        with kubenode.stopped(node, "kubelet", SETTLE):
            force_delete(node, ns, "ours-gone")
            kubenode.wait_for("upstream's ip-control-loop freeing what pycni allocated for ours-gone",
                              lambda: settled(node, {f"{ns}/ours-gone"}), SETTLE)
            assert holdings(node, live) == kept
            kubenode.wait_for("its IPAddressGarbageCollected events",
                              lambda: collected(node, ns, "ours-gone") == gone, SETTLE)
        kubenode.wait_for("ours-gone's sandbox torn down", lambda: not running_tasks(node, ns, "ours-gone"),
                          SETTLE)
        ready(node, ns, "ours-1", "up-1", "up-gone")
        assert addresses_once_served(node, ns, "ours-1", "net1") == ours1
        assert holdings(node, live) == kept
        log = controller_log(node)
        assert "failed to cleanup allocation" not in log, log
        assert not [e for e in node.get("-n", ns, "events")["items"]
                    if e.get("reason") == "IPAddressGarbageCollectionFailed"]

        node.kubectl("-n", ns, "delete", "pod", "ours-1", "--wait=true", "--timeout=120s", timeout=180)
        kubenode.wait_for("upstream releasing what pycni allocated for ours-1",
                          lambda: settled(node, {f"{ns}/ours-1"}), SETTLE)
        assert in_pools(node, f"{ns}/up-1")
        upstream_node = {d: snapshot(Path(node.env[d])) for d in ("CNI_BIN_DIR", "CNI_CONF_DIR")}

        # pycni's DaemonSet replaces upstream's again: same overlay, NADs unchanged
        stop_controller(node)
        reinstall_pycni(node, installed)
        back = True
    finally:
        if not back:  # the rest of the suite runs on pycni's install
            stop_controller(node)
            reinstall_pycni(node, installed)
    installed.before = upstream_node  # what the uninstall (tests/cluster/test_uninstall.py) must give back
    assert is_ours(node, "whereabouts") and is_ours(node, "macvlan")
    node.apply([pod("ours-2", ns, "roce-shared")])
    ready(node, ns, "ours-2")
    ours2 = addresses(node, ns, "ours-2", "net1")
    assert not {a.ip for a in ours2} & {a.ip for a in up1}
    reach(node, ns, "ours-2", up1)  # the upstream-attached pod keeps working
    kubenode.wait_for("ours-2 in the pools", lambda: in_pools(node, f"{ns}/ours-2"), SETTLE)

    # an upstream-attached pod deleted while its DEL cannot run: pycni's reconciler (its Deployment's
    # command, once, in its container) frees upstream's entries and reservations, and no live pod's
    live = [f"{ns}/up-1", f"{ns}/ours-2"]
    kept = holdings(node, live)
    assert in_pools(node, f"{ns}/up-gone") and set(reservations(node).values()) >= {f"{ns}/up-gone"}
    container = reconciler_container(node)
    since = now()
    with kubenode.stopped(node, "kubelet", SETTLE):
        force_delete(node, ns, "up-gone")
        out = node.ctr("tasks", "exec", "--exec-id", f"{RUN}-reconcile", container, *RECONCILE).stdout
        assert holdings(node, live) == kept, out
    said = reconciler_said(node, out, since)  # a periodic run of the Deployment may have freed it first
    freed, freed_res = freed_lines(said)
    assert freed == {(ip, POOLS[":" in ip], f"{ns}/up-gone", "net1") for ip in up_gone}, said
    assert freed_res == {(ip.replace(":", "-"), f"{ns}/up-gone", "net1") for ip in up_gone}, said
    assert freed_count(said) >= 4, said
    assert settled(node, {f"{ns}/up-gone"})
    kubenode.wait_for("up-gone's sandbox torn down", lambda: not running_tasks(node, ns, "up-gone"), SETTLE)
    ready(node, ns, "up-1", "ours-2")
    assert addresses_once_served(node, ns, "up-1", "net1") == up1
    assert holdings(node, live) == kept

    node.kubectl("-n", ns, "delete", "pod", "up-1", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("pycni releasing what upstream allocated for up-1",
                      lambda: settled(node, {f"{ns}/up-1"}), SETTLE)
    node.kubectl("-n", ns, "delete", "pod", "ours-2", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("ours-2's addresses released", lambda: settled(node, {f"{ns}/ours-2"}), SETTLE)
    assert sandbox_failures(node, ns) == []
    assert node.get("-n", ns, "network-attachment-definitions", "roce-shared")["metadata"][
        "resourceVersion"] == nad_version
    node.kubectl("delete", *(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in upstream_rbac()[1:]))
