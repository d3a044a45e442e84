"""The node's kubelet, then its containerd, restarted with pods running (SIGTERM, and started again with
the kit's own command line): the pods stay Ready, the pools hold exactly one entry per pod and network
(no address leaked by a re-ADD), matching what the pods have; once the pods are deleted every address is
released, the host-device is back in the host namespace and no pod namespace is left behind (a device in
a namespace nobody tears down would be lost with it)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster import kubenode
from tests.cluster.pods import (
    HOSTDEV_V4,
    POOLS,
    SETTLE,
    Net,
    addresses_once_served,
    held_by,
    host_has,
    pod,
    ready,
    sandbox_failures,
    sandbox_of,
    settled,
)

PODS = {"rs-a": "roce-shared", "rs-b": "roce-shared,hostdev-pf"}


def netns_of(node: kubenode.Cluster, sandbox: str) -> Path:
    spec = json.loads(node.ctr("containers", "info", sandbox).stdout)["Spec"]
    (path,) = [n["path"] for n in spec["linux"]["namespaces"] if n["type"] == "network"]
    return Path(path)


def in_pools(node: kubenode.Cluster, ns: str, name: str) -> bool:
    """The pools hold one entry per network for the pod, under its current sandbox (the agent writes
    pools a moment after it answers: awaited, not read once)."""
    sandbox = sandbox_of(node, node.get("-n", ns, "pod", name)["metadata"]["uid"])
    held = held_by(node, f"{ns}/{name}")
    pools = (*POOLS, str(HOSTDEV_V4).replace("/", "-")) if name == "rs-b" else POOLS
    return (all([c for _, c in held.get(p, [])] == [sandbox] for p in pools)
            and sum(len(v) for v in held.values()) == len(pools))


def consistent(node: kubenode.Cluster, ns: str) -> None:
    """Every pod Ready with its addresses, the pools holding exactly one entry per pod and network under
    its current sandbox."""
    ready(node, ns, *PODS)
    for name in PODS:
        assert len(addresses_once_served(node, ns, name, "net1")) == 2
        kubenode.wait_for(f"the pools holding {name} once per network", lambda n=name: in_pools(node, ns, n),
                          SETTLE)


def test_kubelet_and_containerd_restarts_leak_nothing(net: Net) -> None:
    node, ns = net.node, net.ns
    node.apply([pod(name, ns, networks) for name, networks in PODS.items()])
    ready(node, ns, *PODS)
    consistent(node, ns)
    assert not host_has(net.device)
    sandboxes = {name: sandbox_of(node, node.get("-n", ns, "pod", name)["metadata"]["uid"]) for name in PODS}
    netns = {netns_of(node, s) for s in sandboxes.values()}
    assert all(p.exists() for p in netns), netns

    for component in ("kubelet", "containerd"):
        with kubenode.stopped(node, component, SETTLE):
            pass  # stopped, and at once started again
        consistent(node, ns)

    node.kubectl("-n", ns, "delete", "pod", *PODS, "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("the pods' addresses released", lambda: settled(node, {f"{ns}/{n}" for n in PODS}),
                      SETTLE)
    kubenode.wait_for(f"{net.device} back in the host namespace", lambda: host_has(net.device), SETTLE)
    kubenode.wait_for("the pods' namespaces removed", lambda: not any(p.exists() for p in netns), SETTLE)
    assert sandbox_failures(node, ns) == []
