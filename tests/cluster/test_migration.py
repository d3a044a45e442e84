"""Migration on a live node, both ways, NADs unchanged (the real-node version of
tests/kubeapi/test_migration.py, which covers mixed pools call by call on the API alone).

The node starts with pycni installed (the package fixture). Two pods attached by pycni (`ours-1`,
`ours-gone`) stay while the node goes back to upstream whereabouts v0.9.4, the rollback docs/install.md
describes: pycni's installer rolled out with `--uninstall` (its plugins removed, the node's own macvlan put
back), its DaemonSet and reconciler deleted, the namespace, CRDs, pools and reservations kept; then upstream
installed as its DaemonSet does it: its CRDs and doc/crds/daemonset-install.yaml of v0.9.4 (ServiceAccount,
ClusterRole and binding, ConfigMap, DaemonSet) applied with only the changes this node needs (each said in
`upstream_docs`: the namespace, the run's names for cluster-scoped objects, the image, the hostPaths of the
node's CNI dirs, and the conf dir mounted a second time at "/host" + its host path with CNI_CONF_DIR naming
it, because install-cni.sh derives the host paths it writes from its mount path). Its container runs
upstream's command as written (`SLEEP=false source /install-cni.sh`, `/token-watcher.sh &`,
`/ip-control-loop -log-level debug`): upstream's own scripts (tests/cluster/upstream, unchanged) write the
kubeconfig with the pod's projected ServiceAccount token and the CA inline, the flat file
`whereabouts.d/whereabouts.conf` and the `nodename` file, and copy the binary into the node's CNI bin dir;
the token watcher runs beside the controller. There is no upstream image here: `upstream_image` makes one as
upstream's Dockerfile does (binaries and scripts at "/"), from the binaries built from upstream's sources
(../shared/upstream) and Debian's static busybox as its shell and tools. The controller talks to the API
server through the `kubernetes` Service with the pod's token, the node's plugin with the token the install
wrote, as upstream's do.
Pods attached by upstream (`up-1`, `up-gone`; Debian's Go macvlan) reach `ours-1`. With the kubelet stopped
(nothing can run a DEL) `ours-gone` is force-deleted: upstream's ip-control-loop frees its entries (pycni's
"lean" pool entries) and reservations, reports them (IPAddressGarbageCollected events), and leaves every
entry and reservation of the live pods of both sides as they were. Then upstream's DEL releases what pycni
allocated for `ours-1`.

Then pycni's DaemonSet replaces upstream's again (upstream's DaemonSet deleted, `kubectl apply -k` of the
same overlay): `up-1` keeps working (a new pycni pod reaches it); with the kubelet stopped `up-gone` is
force-deleted and pycni's reconciler (its Deployment's command, run once in its container; pycni's agent,
whose pod watch would free them first, frozen meanwhile) frees exactly upstream's entries and
reservations of it, no live pod's; pycni's DEL releases what upstream allocated for
`up-1`. The upstream node as it was just before that install becomes the state the uninstall test must give
back (upstream's binary, flat file, kubeconfig and nodename file included: the installer keeps what
it displaced).

What the test does not run: node slices (upstream's node-slice-controller, and its binary in the image),
and a token rotation under the token watcher (it runs, but nothing makes the kubelet renew the pod's
token meanwhile).
Upstream's objects live in pycni's namespace (its kubeconfig context names it, its DaemonSet runs there),
as a migration must keep them in one namespace."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests import kubeup
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
    agent_container,
    force_delete,
    freed_count,
    freed_lines,
    frozen,
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

INPUTS = Path(__file__).parent / "upstream"  # upstream's files, unchanged (upstream/NOTICE)
IMAGE = "kubenode.local/whereabouts:v0.9.4"
CONTROLLER = "whereabouts"  # upstream's DaemonSet and its container, as upstream names them
SCRIPTS = ("install-cni.sh", "lib.sh", "token-watcher.sh")
# every program the DaemonSet's command and the scripts run (busybox sh's builtins included): busybox applets
SCRIPT_COMMANDS = ("sh", "[", "awk", "base64", "cat", "chmod", "cp", "date", "echo", "md5sum", "mkdir",
                   "printf", "sed", "sleep", "touch", "tr", "true")
INSTALLED = "Done configuring CNI.  Sleep=false"  # install-cni.sh's last line (SLEEP=false)
WATCHING = "Sleep and Watching for service account token and CA file changes..."  # token-watcher.sh's first


def upstream_image(node: kubenode.Cluster) -> None:
    """Upstream's image as its Dockerfile makes it (the binaries and scripts at "/", CMD /install-cni.sh),
    imported into the node's containerd. There is no upstream image here: its binaries are the ones built
    from upstream's sources (../shared/upstream), its scripts are upstream's (INPUTS), and its shell and
    tools are Debian's static busybox with every applet linked in /bin (upstream's Alpine base is busybox
    too)."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.split()
    assert not set(SCRIPT_COMMANDS) - set(applets), set(SCRIPT_COMMANDS) - set(applets)
    bins = kubeup.unpack("whereabouts", "whereabouts-controller")
    files = [f"{busybox}=/bin/busybox", f"{bins}/whereabouts=/whereabouts",
             f"{bins}/whereabouts-controller=/ip-control-loop", *(f"{INPUTS / s}=/{s}" for s in SCRIPTS)]
    links = [arg for a in applets if a != "busybox" for arg in ("--link", f"bin/{a}=busybox")]
    tar = node.host.parent / f"{RUN}-whereabouts.tar"
    subprocess.run([str(kubenode.UPSTREAM / "mkimage"), str(tar), IMAGE, '{"Cmd": ["/install-cni.sh"]}',
                    *files, *links], capture_output=True, check=True, timeout=300)
    try:
        node.ctr("images", "import", str(tar))
    finally:
        tar.unlink()


def upstream_docs(node: kubenode.Cluster) -> list[dict[str, Any]]:
    """doc/crds/daemonset-install.yaml (ServiceAccount, ClusterRole and binding, ConfigMap, DaemonSet) with
    the changes this node needs, each said below; the rest (the container's command, env, resources,
    securityContext, hostNetwork, tolerations, upstream's two mounts) runs as written."""
    docs = [d for d in yaml.safe_load_all((INPUTS / "daemonset-install.yaml").read_text()) if d]
    conf = f"/host{node.cni_conf_dir}"
    for doc in docs:
        meta = doc["metadata"]
        if "namespace" in meta:
            # pycni's namespace, not kube-system: a migration keeps both sides' objects in one namespace
            # (the kubeconfig install-cni.sh writes names the pod's, WHEREABOUTS_NAMESPACE)
            meta["namespace"] = kubenode.NS
        if doc["kind"] == "ClusterRoleBinding":
            doc["subjects"][0]["namespace"] = kubenode.NS
            doc["roleRef"]["name"] = f"{RUN}-{doc['roleRef']['name']}"
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{RUN}-{meta['name']}"  # cluster-scoped: the run's names
        if doc["kind"] != "DaemonSet":
            continue
        spec = doc["spec"]["template"]["spec"]
        container = spec["containers"][0]
        container["image"] = IMAGE  # upstream's binaries and scripts, imported (upstream_image)
        paths = {"cnibin": node.cni_bin_dir, "cni-net-dir": node.cni_conf_dir}
        for volume in spec["volumes"]:
            # containerd's bin_dir and conf_dir on this node are $CNI_BIN_DIR and $CNI_CONF_DIR
            volume["hostPath"]["path"] = str(paths[volume["name"]])
        # lib.sh writes into the flat file the kubeconfig's host path as $CNI_CONF_DIR without "/host";
        # with upstream's mount alone that is /etc/cni/net.d/..., which this node does not have. So the
        # conf dir is also mounted at "/host" + its host path and CNI_CONF_DIR names that mount (on a node
        # whose conf dir is /etc/cni/net.d that is upstream's mount: nothing to add). Upstream's mount
        # stays: ip-control-loop reads the flat file at /host/etc/cni/net.d, a fixed path.
        if conf != "/host/etc/cni/net.d":
            container["volumeMounts"].append({"name": "cni-net-dir", "mountPath": conf})
            container["env"].append({"name": "CNI_CONF_DIR", "value": conf})
    return docs


def controller_log(node: kubenode.Cluster) -> str:
    return node.kubectl("-n", kubenode.NS, "logs", f"daemonset/{CONTROLLER}").stdout


def install_upstream(node: kubenode.Cluster, ns: str) -> None:
    """Upstream's CRDs and daemonset-install.yaml applied, its DaemonSet rolled out, then awaited: its
    command's install-cni.sh done (kubeconfig, flat file, nodename, binary copied), token-watcher.sh
    started, and ip-control-loop's pod watch delivering: a pod deleted after its start is logged by its
    delete handler ("deleted pod [ns/name]"; a deletion before its informers have listed would never
    reach it)."""
    node.kubectl("apply", "-f", str(kubenode.UPSTREAM / "whereabouts-crds"))
    upstream_image(node)
    node.apply(upstream_docs(node))
    node.kubectl("-n", kubenode.NS, "rollout", "status", f"daemonset/{CONTROLLER}", "--timeout=300s",
                 timeout=330)
    kubenode.wait_for("upstream's install-cni.sh done and its token-watcher.sh started",
                      lambda: INSTALLED in (log := controller_log(node)) and WATCHING in log, SETTLE)
    flat = json.loads((node.cni_conf_dir / "whereabouts.d" / "whereabouts.conf").read_text())
    assert Path(flat["kubernetes"]["kubeconfig"]).is_file(), flat  # a host path: the plugin reads it there
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
        install_upstream(node, ns)
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
    # pycni's agent frozen meanwhile: its pod watch would free them first (tests/cluster/test_pod_watch.py)
    with kubenode.stopped(node, "kubelet", SETTLE), frozen(node, agent_container(node)):
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
    node.kubectl("delete", *(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in upstream_docs(node)
                             if "namespace" not in d["metadata"]))  # upstream's cluster-scoped objects
