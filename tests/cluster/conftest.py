"""The cluster suite's fixtures: one real cluster per session (tests/cluster/kubenode.py), pycni
installed on it once. Package-scoped: the cluster goes (kube-node-down, "/" back to private, the
kube-proxy lock released) as soon as the last test of tests/cluster has run, not at the end of a
`pytest tests` session. Runs in `make test`'s source pass only (the frozen passes collect tests/integration
and tests/e2e; tests/conftest.py deselects tests/cluster anyway when PYCNI_PLUGIN_DIR is set): the image
is always made from the frozen bundle, so a frozen pass would only repeat it. Skipped, saying so, only
when ../shared (the cluster kit) is absent; root gating is tests/conftest.py's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bundle_layouts import snapshot
from tests.cluster import kubenode
from tests.cluster.pods import V4, V6, Net, example_nad
from tests.nsutil import RUN, sh


@pytest.fixture(scope="package")
def cluster() -> Iterator[kubenode.Cluster]:
    reason = kubenode.absent()
    if reason:
        pytest.skip(reason)
    work = kubenode.short_workdir()
    lock = kubenode.KubeProxyLock()
    lock.acquire()
    node: kubenode.Cluster | None = None
    try:
        node = kubenode.up(work)
        yield node
    finally:
        if node is not None:
            kubenode.down(node.dir)
        lock.release()
        shutil.rmtree(work, ignore_errors=True)


@dataclass
class Installed:
    cluster: kubenode.Cluster
    tag: str
    overlay: Path
    before: dict[str, dict[str, tuple[str, ...]]]  # the node's CNI dirs before the last install


@pytest.fixture(scope="package")
def installed(cluster: kubenode.Cluster) -> Installed:
    """pycni as an operator installs it: image imported into the node's containerd, `kubectl apply -k`
    of the overlay, the DaemonSet rolled out (both containers Ready through the shipped probes)."""
    tag = f"{kubenode.REGISTRY}:{RUN}"
    archive = kubenode.image_archive(tag, cluster.host.parent / "image")
    cluster.ctr("images", "import", str(archive))
    archive.unlink()
    overlay = kubenode.write_overlay(cluster, tag, cluster.host.parent / "overlay")
    before = {d: snapshot(Path(cluster.env[d])) for d in ("CNI_BIN_DIR", "CNI_CONF_DIR")}
    cluster.kubectl("apply", "-k", str(overlay))
    cluster.kubectl("-n", kubenode.NS, "rollout", "status", "daemonset/pycni-node", "--timeout=300s")
    return Installed(cluster, tag, overlay, before)


@pytest.fixture(scope="module")
def net(installed: Installed, request: pytest.FixtureRequest) -> Iterator[Net]:
    """The test module's namespace (per-run name, from the module's) with the two NADs, and the links
    they name (per-run names; one module at a time holds them)."""
    node = installed.cluster
    ns = f"{RUN}-" + request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")
    master, device = f"{RUN}mv", f"{RUN}hd"
    try:
        sh("ip", "link", "add", master, "mtu", "9000", "type", "veth", "peer", "name", master + "p",
           "mtu", "9000")
        sh("ip", "link", "add", device, "type", "veth", "peer", "name", device + "p")
        for link in (master, master + "p", device + "p"):
            sh("ip", "link", "set", link, "up")
        node.kubectl("create", "namespace", ns)
        node.apply([
            example_nad("roce-shared-macvlan.yaml", ns, {
                "master": master, "ipam.range": str(V4),
                "ipam.exclude": ["198.18.48.0/28", "198.18.63.255/32"], "ipam.gateway": "198.18.48.1",
                "ipam.ipRanges": [{"range": str(V6)}]}, node),
            example_nad("hostdevice-pf.yaml", ns, {
                "device": device, "stateDir": str(node.state_dir / "pycni" / "devices")}, node,
                drop_annotations=True),
        ])
        yield Net(ns, master, device, node)
    finally:
        # pods first (their DELs release the addresses and give the device back), then the links
        try:
            node.drop_namespace(ns)
        finally:
            for link in (master, device, device + "p"):
                sh("ip", "link", "del", link, check=False)
