"""A StatefulSet pod deleted and recreated under the same name (the bug whereabouts fixed in v0.9.2: the
old pod's DEL, coming after the new pod's ADD, freed by pod name what the new pod held). The pod is
force-deleted (`--force --grace-period=0`): the API object goes at once and the StatefulSet controller
creates the new `sts-0` while the kubelet is still tearing the old sandbox down, so the new pod's ADD can
come before the old pod's DEL. Once the old sandbox is gone, the pools and reservations hold exactly the
new pod's addresses, under the new sandbox's container ID, and the StatefulSet's deletion frees them.
The node agent's pod watch sees the old pod's deletion meanwhile: it frees what carries the old pod's
UID and keeps the new pod's entries (ipam/podwatch.py)."""

from __future__ import annotations

from typing import Any

from tests.cluster import kubenode
from tests.cluster.pods import (
    NETWORKS,
    POOLS,
    SETTLE,
    Net,
    addresses,
    agent_metrics,
    held_by,
    ready,
    reservations,
    running_tasks,
    sandbox_failures,
    sandbox_of,
    settled,
)


def statefulset(ns: str) -> dict[str, Any]:
    labels = {"app": "sts"}
    return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "sts", "namespace": ns},
            "spec": {"serviceName": "sts", "replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels, "annotations": {NETWORKS: "roce-shared"}},
                                  "spec": {"terminationGracePeriodSeconds": 2, "containers": [
                                      {"name": "c", "image": "kubenode.local/busybox:1.35",
                                       "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}}}}


def holders(node: kubenode.Cluster, ref: str) -> list[str]:
    """The container IDs of ref's allocations in POOLS, pool by pool."""
    held = held_by(node, ref)
    return [a[1] for p in POOLS for a in held.get(p, [])]


def uid_of(node: kubenode.Cluster, ns: str) -> str | None:
    got = node.kubectl("-n", ns, "get", "pod", "sts-0", "-o", "jsonpath={.metadata.uid}", check=False)
    return got.stdout.strip() or None


def test_a_statefulset_pod_recreated_under_its_name_keeps_a_correct_attachment(net: Net) -> None:
    node, ns = net.node, net.ns
    ref = f"{ns}/sts-0"
    node.apply([statefulset(ns)])
    kubenode.wait_for("sts-0 created", lambda: uid_of(node, ns), SETTLE)
    ready(node, ns, "sts-0")
    old_uid = uid_of(node, ns)
    assert old_uid
    old_tasks = running_tasks(node, ns, "sts-0")
    old_sandbox = sandbox_of(node, old_uid)
    # every call is answered after its pool write (docs/ipam.md): once the pod runs, its entries exist
    assert holders(node, ref) == [old_sandbox, old_sandbox]

    deleted = agent_metrics(node, "pycni_podwatch_events_total").get("DELETED", 0)
    node.kubectl("-n", ns, "delete", "pod", "sts-0", "--force", "--grace-period=0", timeout=120)
    new_uid = kubenode.wait_for("sts-0 recreated", lambda: (u := uid_of(node, ns)) != old_uid and u, SETTLE)
    ready(node, ns, "sts-0")
    kubenode.wait_for("the old sandbox torn down", lambda: not running_tasks(node, ns, "sts-0") & old_tasks,
                      SETTLE)
    new_sandbox = sandbox_of(node, new_uid)
    got = addresses(node, ns, "sts-0", "net1")
    assert sorted(a.version for a in got) == [4, 6], got
    kubenode.wait_for("the pools holding one entry each for sts-0, under the new sandbox",
                      lambda: holders(node, ref) == [new_sandbox, new_sandbox], SETTLE)
    # the agent's pod watch saw the old pod go (and freed what carried its UID, keeping the new pod's)
    kubenode.wait_for("the agent's pod watch seeing the old pod go", lambda: agent_metrics(
        node, "pycni_podwatch_events_total").get("DELETED", 0) > deleted, SETTLE)
    res = reservations(node)
    assert {k for k, v in res.items() if v == ref} == {str(a.ip).replace(":", "-") for a in got}, res
    assert sandbox_failures(node, ns) == []

    node.kubectl("-n", ns, "delete", "statefulset", "sts", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("sts-0 gone", lambda: uid_of(node, ns) is None, SETTLE)
    kubenode.wait_for("its addresses released", lambda: settled(node, {ref}), SETTLE)
