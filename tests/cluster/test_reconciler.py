"""The reconciler Deployment as shipped frees the address of a pod deleted while its DEL could not run,
and never a live pod's.

The node's kubelet is stopped (SIGTERM; the kit's own command line to start it again), so nothing can
run the pod's CNI DEL; the pod is force-deleted (`--force --grace-period=0`: the API object goes at
once). Containers keep running without the kubelet, the reconciler's among them. The Deployment runs the
reconciler at its start and then every 300 s; rather than waiting for its next turn, the test runs the
same command once (`--interval=0`) inside the Deployment's running container (`ctr tasks exec`: the
container's user, environment, ServiceAccount token and ConfigMap, as shipped): it frees exactly the
deleted pod's allocations and reservations, and keeps the live pod's. The kubelet then comes back and
tears the orphaned sandbox down (its DEL finds nothing left to free: no error), the live pod keeps its
addresses, and a new pod gets other ones. The node's agent, whose pod watch would free the pod within
seconds, is frozen meanwhile (`ctr tasks pause`), so that this tests the reconciler."""

from __future__ import annotations

from tests.cluster import kubenode
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
    now,
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


def test_the_reconciler_frees_a_pod_deleted_while_its_del_could_not_run_and_never_a_live_one(
        net: Net) -> None:
    node, ns = net.node, net.ns
    node.apply([pod("gone", ns, "roce-shared"), pod("live", ns, "roce-shared")])
    ready(node, ns, "gone", "live")
    gone = {str(a.ip) for a in addresses(node, ns, "gone", "net1")}
    live = addresses(node, ns, "live", "net1")
    assert len(gone) == 2 and len(live) == 2
    # every call is answered after its pool write (docs/ipam.md): once the pods run, their entries exist
    owners = pool_owners(node)
    assert all({f"{ns}/gone", f"{ns}/live"} <= owners.get(p, set()) for p in POOLS), owners
    container = reconciler_container(node)
    since = now()
    # the agent's pod watch would free the pod first (tests/cluster/test_pod_watch.py): frozen meanwhile
    with kubenode.stopped(node, "kubelet", SETTLE), frozen(node, agent_container(node)):
        force_delete(node, ns, "gone")
        out = node.ctr("tasks", "exec", "--exec-id", f"{RUN}-reconcile", container, *RECONCILE).stdout
    said = reconciler_said(node, out, since)  # a periodic run of the Deployment may have freed it first
    freed, freed_res = freed_lines(said)
    assert {(ip, ref, ifname) for ip, _, ref, ifname in freed} == {
        (ip, f"{ns}/gone", "net1") for ip in gone}, said
    assert {pool for _, pool, _, _ in freed} == set(POOLS), said
    assert freed_res == {(ip.replace(":", "-"), f"{ns}/gone", "net1") for ip in gone}, said
    assert freed_count(said) >= 4, said
    owners = pool_owners(node)
    assert all(f"{ns}/live" in owners[p] and f"{ns}/gone" not in owners[p] for p in POOLS), owners
    held = reservations(node)
    assert all(held[str(a.ip).replace(":", "-")] == f"{ns}/live" for a in live), held

    # the kubelet back: it tears the orphaned sandbox down (a DEL with nothing left to free)
    kubenode.wait_for("the deleted pod's sandbox torn down", lambda: not running_tasks(node, ns, "gone"),
                      SETTLE)
    ready(node, ns, "live")
    assert addresses_once_served(node, ns, "live", "net1") == live
    node.apply([pod("after", ns, "roce-shared")])
    ready(node, ns, "after")
    after = addresses(node, ns, "after", "net1")
    assert len(after) == 2 and not {a.ip for a in after} & {a.ip for a in live}, (after, live)
    assert sandbox_failures(node, ns) == []
    node.kubectl("-n", ns, "delete", "pod", "live", "after", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("the pods' addresses released",
                      lambda: settled(node, {f"{ns}/live", f"{ns}/after", f"{ns}/gone"}), SETTLE)
