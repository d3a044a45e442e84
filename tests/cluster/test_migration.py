"""Migration on a live node, both ways, NADs unchanged (the real-node version of
tests/kubeapi/test_migration.py, which covers mixed pools call by call on the API alone).

The node starts with pycni installed (the package fixture). A pod attached by pycni (`ours-1`) stays
while the node goes back to upstream whereabouts v0.9.4, the rollback docs/install.md describes: pycni's
installer rolled out with `--uninstall` (its plugins removed, the node's own macvlan put back), its
DaemonSet and reconciler deleted, the namespace, CRDs, pools and reservations kept; then upstream
installed as its DaemonSet's `install-cni.sh` would (`install_upstream`: its CRDs, its ServiceAccount and
ClusterRole, a kubeconfig with that ServiceAccount's token inline and the CA inline, the flat file
`whereabouts.d/whereabouts.conf` in the node's CNI conf dir, its binary as `whereabouts` in the node's
CNI bin dir). A pod attached by upstream (`up-1`, Debian's Go macvlan) reaches `ours-1`, and upstream's
DEL releases what pycni allocated for `ours-1`.

Then pycni's DaemonSet replaces upstream again (`kubectl apply -k` of the same overlay): `up-1` keeps
working (a new pycni pod reaches it), and pycni's DEL releases what upstream allocated for it. The
upstream node as it was just before that install becomes the state the uninstall test must give back
(upstream's binary, flat file and kubeconfig included: the installer keeps what it displaced).

What the test does not run: upstream's `ip-control-loop` (its DaemonSet's second process; pods deleted
without their DEL are not part of this test), node slices. Upstream's objects live in pycni's namespace
(its kubeconfig context names it), as a migration must keep them in one namespace."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.bundle_layouts import snapshot
from tests.cluster import kubenode
from tests.cluster.conftest import Installed
from tests.cluster.pods import (
    POOLS,
    SETTLE,
    Net,
    addresses,
    pinged,
    pod,
    pool_owners,
    ready,
    sandbox_failures,
    settled,
)
from tests.nsutil import RUN

# upstream's doc/crds/daemonset-install.yaml (v0.9.4): the ServiceAccount and ClusterRole its DaemonSet runs
# as; the ClusterRole and its binding are cluster-scoped, so they carry the run's prefix
UPSTREAM_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["whereabouts.cni.cncf.io"], "resources": ["ippools", "overlappingrangeipreservations"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["network-attachment-definitions"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
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


def test_pods_move_from_pycni_to_upstream_whereabouts_and_back_on_a_live_node(
        net: Net, installed: Installed) -> None:
    node, ns = net.node, net.ns
    nad_version = node.get("-n", ns, "network-attachment-definitions", "roce-shared")["metadata"][
        "resourceVersion"]
    node.apply([pod("ours-1", ns, "roce-shared")])
    ready(node, ns, "ours-1")
    ours1 = addresses(node, ns, "ours-1", "net1")
    assert sorted(a.version for a in ours1) == [4, 6], ours1
    kubenode.wait_for("ours-1 in the pools", lambda: in_pools(node, f"{ns}/ours-1"), SETTLE)

    # back to upstream whereabouts
    uninstall_pycni(node)
    assert not (node.cni_bin_dir / "whereabouts").exists() and not is_ours(node, "macvlan")
    back = False
    try:
        install_upstream(node)
        node.apply([pod("up-1", ns, "roce-shared")])
        ready(node, ns, "up-1")
        up1 = addresses(node, ns, "up-1", "net1")
        assert sorted(a.version for a in up1) == [4, 6] and not {a.ip for a in up1} & {a.ip for a in ours1}
        assert in_pools(node, f"{ns}/up-1")  # upstream writes its pools before it answers
        reach(node, ns, "up-1", ours1)  # the pycni-attached pod keeps working
        node.kubectl("-n", ns, "delete", "pod", "ours-1", "--wait=true", "--timeout=120s", timeout=180)
        kubenode.wait_for("upstream releasing what pycni allocated for ours-1",
                          lambda: settled(node, {f"{ns}/ours-1"}), SETTLE)
        assert in_pools(node, f"{ns}/up-1")
        upstream_node = {d: snapshot(Path(node.env[d])) for d in ("CNI_BIN_DIR", "CNI_CONF_DIR")}

        # pycni's DaemonSet replaces upstream again: same overlay, NADs unchanged
        reinstall_pycni(node, installed)
        back = True
    finally:
        if not back:  # the rest of the suite runs on pycni's install
            reinstall_pycni(node, installed)
    installed.before = upstream_node  # what the uninstall (tests/cluster/test_uninstall.py) must give back
    assert is_ours(node, "whereabouts") and is_ours(node, "macvlan")
    node.apply([pod("ours-2", ns, "roce-shared")])
    ready(node, ns, "ours-2")
    ours2 = addresses(node, ns, "ours-2", "net1")
    assert not {a.ip for a in ours2} & {a.ip for a in up1}
    reach(node, ns, "ours-2", up1)  # the upstream-attached pod keeps working
    node.kubectl("-n", ns, "delete", "pod", "up-1", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("pycni releasing what upstream allocated for up-1",
                      lambda: settled(node, {f"{ns}/up-1"}), SETTLE)
    kubenode.wait_for("ours-2 in the pools", lambda: in_pools(node, f"{ns}/ours-2"), SETTLE)
    node.kubectl("-n", ns, "delete", "pod", "ours-2", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("ours-2's addresses released", lambda: settled(node, {f"{ns}/ours-2"}), SETTLE)
    assert sandbox_failures(node, ns) == []
    assert node.get("-n", ns, "network-attachment-definitions", "roce-shared")["metadata"][
        "resourceVersion"] == nad_version
    node.kubectl("delete", *(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in upstream_rbac()[1:]))
