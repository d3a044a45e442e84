"""bundler/manifests/flowcontrol.yaml on the real kube-apiserver: the API server's priority and fairness
puts exactly the pool writes (PATCH of ippools) of pycni's two ServiceAccounts in pycni's own priority
level, where at most a few run at once and the rest wait in a FIFO queue; every other request of theirs,
and another namespace's pool writes, stay where the server's defaults put them. The effect on the
server (fewer writes redone because the object changed under them) is measured by `make
bench-ipam-scale` (README: IPAM at scale), not asserted here."""

from __future__ import annotations

import re
from pathlib import Path

from ipam import rbac
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from tests.kubeapi.factory import counting_store
from tests.kubeup import KubeServer, Tenant

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
B = Allocation("b" * 64, "ns/b", "net1", "uid-b", "blue", "node-1")
POOL = "198.51.100.0-24"
DISPATCHED = re.compile(r'^apiserver_flowcontrol_dispatched_requests_total\{(.*)\} (\S+)$', re.M)


def dispatched(server: KubeServer, level: str) -> float:
    """Requests the server has run in priority level `level` so far."""
    total = 0.0
    for labels, value in DISPATCHED.findall(server.metrics()):
        if f'priority_level="{level}"' in labels:
            total += float(value)
    return total


def test_only_pool_writes_of_the_node_and_the_reconciler_run_in_pycnis_priority_level(
    kube: KubeServer, tmp_path: Path
) -> None:
    tenant = Tenant(kube, tmp_path / "a", flowcontrol=True)
    other = Tenant(kube, tmp_path / "b", flowcontrol=True)  # its own level: never this namespace's
    level = f"pycni-pool-writes-{tenant.namespace}"
    node, _ = counting_store(tenant.node)
    reconciler, _ = counting_store(tenant.reconciler, role=rbac.RECONCILER)
    elsewhere, _ = counting_store(other.node)
    try:
        start = dispatched(kube, level)
        version = node.commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"1": A}))  # a POST
        node.put_reservation(Reservation("198.51.100.1", A))
        pool = node.get_pool(POOL)
        assert pool is not None and node.recent_pool(POOL, version) is not None
        assert dispatched(kube, level) == start  # creating, reading, reservations: not pool writes
        node.commit_pool(pool, PoolUpdate(put={"2": B}))  # the node's PATCH
        assert dispatched(kube, level) == start + 1
        stored = reconciler.get_pool(POOL)
        assert stored is not None
        reconciler.commit_pool(stored, PoolUpdate(remove=frozenset({"2"})))  # the reconciler's PATCH
        assert dispatched(kube, level) == start + 2
        theirs = elsewhere.commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put={"1": A}))
        mine = elsewhere.get_pool(POOL)
        assert mine is not None and mine.version == theirs
        elsewhere.commit_pool(mine, PoolUpdate(put={"3": B}))
        assert dispatched(kube, level) == start + 2
        assert dispatched(kube, f"pycni-pool-writes-{other.namespace}") >= 1
    finally:
        for store in (node, reconciler, elsewhere):
            store.close()
