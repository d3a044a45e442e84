"""The agent's pod watch (ipam/podwatch.py) on the real node, installed as docs/install.md shows for a
node whose CNI conf dir is not /etc/cni/net.d (the suite's node: tests/cluster/kubenode.py write_overlay
applies the page's overlay as shown, only its two directories set; issue 45: that overlay did not tell
the agent where the flat file is, and the watch never started): a pod deleted while its DEL cannot run
is freed by the node's agent within 2 s (FREED_WITHIN), every entry naming it included, and never a
live pod's entry; the agent's pycni_podwatch_up says 1.

The kubelet is stopped (as in test_reconciler.py), so nothing can run the pod's CNI DEL, and the pod is
force-deleted (the API object goes at once). Besides the entries its ADD made, the pod holds a copy of
its IPv4 entry at another offset of the pool, written by hand (an entry its DEL would never see: a
crashed writer's leftover). The agent's watch sees the deletion and frees all of them and the pod's
reservations (the reconciler Deployment frozen meanwhile, `ctr tasks pause`: its periodic run must not
be what frees them); the live pod keeps everything.
Measured: from the deletion (the DELETE with gracePeriodSeconds 0 that `kubectl delete --force
--grace-period=0` sends, made here through the API: kubectl's own start is not the watch's time) to the
pools and reservations observed free (polled through the API), and the API requests the watch made for
the deletion (the agent's pycni_podwatch_requests_total, by verb). The kubelet then comes back and
tears the orphaned sandbox down without an error (its DEL finds nothing left to free). A StatefulSet pod
replaced by one of the same name: tests/cluster/test_statefulset.py (the agent's watch runs there too,
and must keep the new pod's entries)."""

from __future__ import annotations

import json
import time

from ipam.kubeapi import Client, load_kubeconfig
from tests.cluster import kubenode
from tests.cluster.pods import (
    POOLS,
    SETTLE,
    Net,
    addresses,
    agent_metrics,
    frozen,
    pod,
    pool_owners,
    ready,
    reconciler_container,
    reservations,
    running_tasks,
    sandbox_failures,
    settled,
)

REQUESTS, EVENTS = "pycni_podwatch_requests_total", "pycni_podwatch_events_total"
FREED_WITHIN = 2.0  # seconds from a forced deletion to its addresses and reservations free (issue 45)
COPY_AT = "4000"  # an offset of the IPv4 pool (198.18.48.0/20) no test pod gets (lowest free first)


class Api:
    """The cluster's API with the admin's credentials, through pycni's own client (no process per call)."""

    def __init__(self, node: kubenode.Cluster) -> None:
        self.client = Client(load_kubeconfig(node.env["KUBECONFIG"]))

    def force_delete(self, ns: str, name: str) -> None:
        self.client.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})

    def holders(self) -> set[str]:
        """Every podref holding a pool entry or a reservation in the store's namespace."""
        base = f"/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{kubenode.NS}"
        pools = self.client.request("GET", f"{base}/ippools")["items"]
        held = {a["podref"] for p in pools for a in (p["spec"].get("allocations") or {}).values()}
        res = self.client.request("GET", f"{base}/overlappingrangeipreservations")["items"]
        return held | {r["spec"]["podref"] for r in res}

    def close(self) -> None:
        self.client.close()


def entries_of(node: kubenode.Cluster, pool: str, podref: str) -> dict[str, dict[str, str]]:
    obj = node.get("-n", kubenode.NS, "ippools.whereabouts.cni.cncf.io", pool)
    return {k: v for k, v in (obj["spec"].get("allocations") or {}).items() if v["podref"] == podref}


def test_a_pod_force_deleted_while_the_kubelet_is_stopped_is_freed_by_the_agent_within_seconds(
        net: Net) -> None:
    node, ns = net.node, net.ns
    gone, live = f"{ns}/gone", f"{ns}/live"
    node.apply([pod("gone", ns, "roce-shared"), pod("live", ns, "roce-shared")])
    ready(node, ns, "gone", "live")
    live_ips = addresses(node, ns, "live", "net1")
    kubenode.wait_for("both pods in the pools", lambda: all(
        {gone, live} <= pool_owners(node).get(p, set()) for p in POOLS), SETTLE)
    (entry,) = entries_of(node, POOLS[0], gone).values()
    patch = [{"op": "add", "path": f"/spec/allocations/{COPY_AT}", "value": entry}]
    node.kubectl("-n", kubenode.NS, "patch", "ippools.whereabouts.cni.cncf.io", POOLS[0], "--type=json",
                 "-p", json.dumps(patch))
    copies = entries_of(node, POOLS[0], gone)
    assert COPY_AT in copies and len(copies) == 2, copies
    held = {k for k, v in reservations(node).items() if v == gone}
    assert len(held) == 2
    before_requests, before_events = agent_metrics(node, REQUESTS), agent_metrics(node, EVENTS)
    assert agent_metrics(node, "pycni_podwatch_up") == {"": 1.0}

    # the reconciler Deployment frozen meanwhile: its periodic run (every 300 s) must not be what frees
    api = Api(node)
    with kubenode.stopped(node, "kubelet", SETTLE), frozen(node, reconciler_container(node)):
        try:
            started = time.monotonic()
            api.force_delete(ns, "gone")
            kubenode.wait_for("the deleted pod's entries and reservations freed",
                              lambda: gone not in api.holders(), SETTLE, every=0.02)
            took = time.monotonic() - started
        finally:
            api.close()
        assert settled(node, {gone})
        assert running_tasks(node, ns, "gone")  # its sandbox still runs: no DEL was made
        after_requests, after_events = agent_metrics(node, REQUESTS), agent_metrics(node, EVENTS)
        owners = pool_owners(node)
        assert all(live in owners[p] and gone not in owners[p] for p in POOLS), owners
        res = reservations(node)
        assert all(res[str(a.ip).replace(":", "-")] == live for a in live_ips), res
        assert not held & set(res), res

    sent = {verb: after_requests.get(verb, 0) - before_requests.get(verb, 0) for verb in after_requests}
    sent = {verb: n for verb, n in sent.items() if n}
    assert after_events.get("DELETED", 0) - before_events.get("DELETED", 0) >= 1
    # one sweep, with no GET of the pod (its entries carry its UID): LIST the pools and the reservations,
    # then per pool freed a GET and a PATCH, per reservation a GET of its pool and a DELETE (test_pod_watch
    # of tests/kubeapi counts them exactly); no LIST of pods (the watch resumed, never relisted)
    assert "list" not in sent and sent.get("patch") == 2 and sent.get("delete") == 2, sent
    print(f"\npod watch on the node: freed within {took:.2f} s of the deletion; requests: {sent}")
    assert took < FREED_WITHIN, f"freed {took:.2f} s after the deletion (at most {FREED_WITHIN} s)"

    # the kubelet back: it tears the orphaned sandbox down (a DEL with nothing left to free)
    kubenode.wait_for("the deleted pod's sandbox torn down", lambda: not running_tasks(node, ns, "gone"),
                      SETTLE)
    assert sandbox_failures(node, ns) == []
    ready(node, ns, "live")
    node.kubectl("-n", ns, "delete", "pod", "live", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("the live pod's addresses released", lambda: settled(node, {live}), SETTLE)
