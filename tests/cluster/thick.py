"""Multus thick (v4.3.0) on the real node as users run it, in place of the kit's Multus thin plugin, and
back (shared by tests/cluster/test_thick.py and tests/bench/thick.py).

Upstream's deployments/multus-daemonset-thick.yml (tests/cluster/upstream/multus-thick, unchanged) is
applied with only the changes this node needs, each said in `docs`. There is no upstream image here:
`image` makes one as images/Dockerfile.thick does (upstream's binaries at /usr/src/multus-cni/bin/,
entrypoint multus-daemon, working dir "/") from the binaries built from upstream's sources, with
Debian's static busybox as its shell (upstream's debian:stable-slim base has one) and the base image's
/var/run -> /run link (without it multus-daemon finds no netns).

The switch (`install`) is what an operator moving a node from thin to thick does: the node's own network
(the kit's `kubenode` conflist, which thin Multus kept in its confDir) goes into the CNI conf dir as
kube-node-up writes it without MULTUS=1 (10-kubenode.conflist: the "primary" network multus-daemon's
`multusConfigFile: auto` wraps), then the thick DaemonSet: its init container installs multus-shim in
the bin dir and the daemon overwrites 00-multus.conf with its own (type multus-shim, the primary network
as its delegate). `uninstall` puts the node back as it was (thin's 00-multus.conf, byte for byte; the
shim and the conflist gone; the daemon's files in the test's own directory)."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests import kubeup
from tests.cluster import kubenode
from tests.nsutil import RUN

INPUTS = Path(__file__).parent / "upstream" / "multus-thick"  # upstream's, unchanged (upstream/NOTICE)
IMAGE = "kubenode.local/multus-thick:v4.3.0"
NS = "kube-system"  # upstream's namespace, kept
DS = "kube-multus-ds"
BIN = "/usr/src/multus-cni/bin"  # where upstream's Dockerfile puts its binaries
SHIM = "multus-shim"
PRIMARY = "10-kubenode.conflist"  # the name kube-node-up gives the node's network without MULTUS=1
MULTUS_CONF = "00-multus.conf"
MEMORY_LIMIT = "50Mi"  # upstream's limit for the kube-multus container (requests = limits)


@dataclass
class Thick:
    node: kubenode.Cluster
    dir: Path  # the test's own directory standing for the node's /run, /var/lib/cni/multus, ...
    thin_conf: bytes  # the kit's thin 00-multus.conf, put back by `uninstall`
    thin_mode: int

    @property
    def socket_dir(self) -> Path:
        return self.dir / "run" / "multus"


def image(node: kubenode.Cluster) -> None:
    """Upstream's image as images/Dockerfile.thick makes it, imported into the node's containerd."""
    busybox = shutil.which("busybox") or "/bin/busybox"
    bins = kubeup.unpack("multus-daemon", "multus-shim")
    files = [f"{busybox}=/bin/busybox", f"{bins}/multus-daemon={BIN}/multus-daemon",
             f"{bins}/{SHIM}={BIN}/{SHIM}"]
    # sh for the init container's copy (install_multus: see docs) and a shell for `kubectl exec`
    links = [arg for a in ("sh", "cp", "mv", "rm", "cat", "ls") for arg in ("--link", f"bin/{a}=busybox")]
    tar = node.host.parent / f"{RUN}-multus-thick.tar"
    config = {"Entrypoint": [f"{BIN}/multus-daemon"], "WorkingDir": "/"}
    subprocess.run([str(kubenode.UPSTREAM / "mkimage"), str(tar), IMAGE, json.dumps(config), *files, *links,
                    "--link", "var/run=/run"], capture_output=True, check=True, timeout=300)
    try:
        node.ctr("images", "import", str(tar))
    finally:
        tar.unlink()


def docs(thick: Thick, env: dict[str, str] | None = None, memory: str = "") -> list[dict[str, Any]]:
    """deployments/multus-daemonset-thick.yml with the changes this node needs, each said below; the rest
    (the daemon's command, its config, resources 100m CPU / 50Mi, privileged, hostNetwork, hostPID,
    tolerations, the mounts' container paths) runs as written. `env`: more environment for the
    kube-multus container (the agent's FIFO of the test: see `install`); `memory`: another memory
    request = limit for it than upstream's 50Mi (tests/bench/thick.py --daemon-memory)."""
    node = thick.node
    out = []
    for doc in yaml.safe_load_all((INPUTS / "multus-daemonset-thick.yml").read_text()):
        if not doc or doc["kind"] == "CustomResourceDefinition":
            continue  # the kit's apiserver has the NAD CRD already (the same one, from multus-daemonset.yml)
        meta = doc["metadata"]
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            meta["name"] = f"{RUN}-{meta['name']}"  # cluster-scoped: the run's names
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] = f"{RUN}-{doc['roleRef']['name']}"
        if doc["kind"] == "ConfigMap":
            conf = json.loads(doc["data"]["daemon-config.json"])
            # the shim's socket: the daemon listens in socketDir (/host/run/multus/, the host-run mount
            # below, which here is the test's directory, not the host's /run); the shim, which reads the
            # config the daemon writes (00-multus.conf: this config), looks in daemonSocketDir, default
            # /run/multus/: it is told the host path of that directory
            conf["daemonSocketDir"] = f"{thick.socket_dir}/"
            # where the delegates are: binDir, default /opt/cni/bin (the runtime's CNI_PATH does not reach
            # the daemon); this node's is $CNI_BIN_DIR (mounted at that path too: see the DaemonSet)
            conf["binDir"] = str(node.cni_bin_dir)
            doc["data"]["daemon-config.json"] = json.dumps(conf, indent=4)
        out.append(doc)
        if doc["kind"] != "DaemonSet":
            continue
        spec = doc["spec"]["template"]["spec"]
        for c in (*spec["containers"], *spec["initContainers"]):
            c["image"] = IMAGE  # made as upstream's Dockerfile makes it (`image`), no registry
        (init,) = spec["initContainers"]
        # install_multus (a Go program of upstream's image) is not among the binaries built here; this is
        # what it does for `-t thick`: copy multus-shim into the bin dir atomically (a temp name, then a
        # rename). (Its second copy, the passthru plugin, is for passthru NADs, which this node has none of.)
        init["command"] = ["sh", "-c", f"cp {BIN}/{SHIM} /host/opt/cni/bin/{SHIM}.temp && "
                           f"mv -f /host/opt/cni/bin/{SHIM}.temp /host/opt/cni/bin/{SHIM}"]
        (daemon,) = spec["containers"]
        if env:
            daemon["env"] += [{"name": k, "value": v} for k, v in env.items()]
        if memory:
            daemon["resources"]["requests"]["memory"] = daemon["resources"]["limits"]["memory"] = memory
        paths = {
            # containerd's conf_dir and bin_dir on this node are $CNI_CONF_DIR and $CNI_BIN_DIR
            "cni": node.cni_conf_dir, "cnibin": node.cni_bin_dir,
            # the kubelet's root dir on this node is $DIR/kubelet, not /var/lib/kubelet
            "host-var-lib-kubelet": node.dir / "kubelet",
            # the daemon's socket dir, its cache, the device-info dir and its conf dir: the test's own
            # directory, never the host's /run, /var/lib/cni/multus, /run/k8s.cni.cncf.io or /etc/cni
            "host-run": thick.dir / "run", "host-var-lib-cni-multus": thick.dir / "var-lib-cni-multus",
            "host-run-k8s-cni-cncf-io": thick.dir / "run-k8s-cni-cncf-io",
            "multus-conf-dir": thick.dir / "etc-cni-multus-net.d",
        }  # hostroot ("/") and host-run-netns (/run/netns, where containerd puts the pods' netns) stay
        for volume in spec["volumes"]:
            if volume["name"] in paths:
                volume["hostPath"]["path"] = str(paths[volume["name"]])
        # upstream's own comment on the cnibin mount: "multus-daemon expects that cnibin path must be
        # identical between pod and container host" (it looks a delegate up in binDir in its own mounts,
        # then execs it chrooted into the host's "/"): this node's bin dir, mounted at its host path
        (cnibin,) = (m for m in daemon["volumeMounts"] if m["name"] == "cnibin")
        cnibin["mountPath"] = str(node.cni_bin_dir)
    return out


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Atomically (a temp name in the same directory, then a rename), as the kit and the daemon write."""
    tmp = path.with_name(f".{path.name}.{RUN}")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    tmp.rename(path)


def multus_conf(node: kubenode.Cluster) -> dict[str, Any]:
    return dict(json.loads((node.cni_conf_dir / MULTUS_CONF).read_text()))


def prepare(node: kubenode.Cluster) -> Thick:
    """What `uninstall` needs to put the node back, taken before `install` changes anything."""
    path = node.cni_conf_dir / MULTUS_CONF
    thin = Thick(node, node.host / "multus-thick", path.read_bytes(), path.stat().st_mode & 0o7777)
    assert json.loads(thin.thin_conf)["type"] == "multus", thin.thin_conf  # the kit's thin plugin
    return thin


def install(thin: Thick, env: dict[str, str] | None = None, memory: str = "") -> None:
    """Thin Multus replaced by thick (see the module doc), awaited until the daemon runs, the shim is in
    the bin dir and the daemon's 00-multus.conf is the node's CNI config (type multus-shim, the node's
    network as its delegate). `env`, `memory`: see `docs`."""
    node = thin.node
    for sub in ("run", "var-lib-cni-multus", "run-k8s-cni-cncf-io", "etc-cni-multus-net.d"):
        (thin.dir / sub).mkdir(parents=True, exist_ok=True)
    _write(node.cni_conf_dir / PRIMARY, (node.dir / "cni" / "kubenode.conflist").read_bytes())
    image(node)
    node.apply(docs(thin, env, memory))
    node.kubectl("-n", NS, "rollout", "status", f"daemonset/{DS}", "--timeout=300s", timeout=330)
    kubenode.wait_for("multus-daemon's 00-multus.conf (type multus-shim) in the conf dir",
                      lambda: multus_conf(node).get("type") == SHIM, 120)
    assert (node.cni_bin_dir / SHIM).is_file()
    conf = multus_conf(node)
    # the daemon's own path of the primary network (v4.3.0 writes the absolute path as clusterNetwork)
    assert conf.get("clusterNetwork") == f"/host/etc/cni/net.d/{PRIMARY}", conf


def uninstall(thick: Thick) -> None:
    """The thick DaemonSet and its objects deleted (the DaemonSet after its pod is gone: `--cascade=
    foreground`), the shim and the primary conflist removed, thin's 00-multus.conf put back."""
    node = thick.node
    node.kubectl("-n", NS, "delete", "daemonset", DS, "--ignore-not-found", "--wait=true",
                 "--cascade=foreground", "--timeout=300s", timeout=330)
    rest = [d for d in docs(thick) if d["kind"] != "DaemonSet"]
    node.kubectl("delete", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(rest))
    for stale in (node.cni_bin_dir / SHIM, node.cni_conf_dir / PRIMARY):
        stale.unlink(missing_ok=True)
    _write(node.cni_conf_dir / MULTUS_CONF, thick.thin_conf, thick.thin_mode)


def daemon_pods(node: kubenode.Cluster) -> list[dict[str, Any]]:
    return list(node.get("-n", NS, "pods", "-l", "name=multus")["items"])


def daemon_restarts(node: kubenode.Cluster) -> tuple[int, int]:
    """(restarts, of which OOM kills seen as the last state) of the kube-multus containers."""
    restarts = ooms = 0
    for p in daemon_pods(node):
        for c in p["status"].get("containerStatuses", []):
            restarts += int(c.get("restartCount", 0))
            ooms += c.get("lastState", {}).get("terminated", {}).get("reason") == "OOMKilled"
    return restarts, ooms


def daemon_log(node: kubenode.Cluster, previous: bool = False) -> str:
    got = node.kubectl("-n", NS, "logs", f"daemonset/{DS}", "-c", "kube-multus",
                       *(["--previous"] if previous else []), check=False)
    return got.stdout


def delegate_calls(log: str, ns: str, network: str, verb: str) -> list[str]:
    """The pods of `ns` in multus-daemon's verbose lines of the delegate calls of `network`, one per call
    (pkg/multus/multus.go: "Add: ns:pod:uid:NAD(network):ifname {conf}" once a delegate ADD returned,
    "Del: ns:pod:uid:network:ifname {conf}" as a delegate DEL starts)."""
    tag = f"({network}):" if verb == "Add" else f":{network}:"
    out = []
    for line in log.splitlines():
        _, sep, tail = line.partition(f"{verb}: {ns}:")
        if sep and tag in tail.split(" {", 1)[0]:
            out.append(tail.split(":", 1)[0])
    return out
