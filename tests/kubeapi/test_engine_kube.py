"""What the engine saves on the real kube-apiserver between calls of one node (ipam.engine._step,
ipam.nodelock snapshots, ipam.store.kube known reservations), counted request by request, and that
what it skips never costs correctness: an entry the snapshot does not hold is still found and freed."""

from __future__ import annotations

from pathlib import Path

from ipam.config import from_dict
from ipam.engine import Engine
from ipam.store.base import Allocation, PoolUpdate, Reservation
from tests.kubeapi.factory import counting_store, open_kube
from tests.kubeup import Tenant

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
B = Allocation("b" * 64, "ns/b", "net1", "uid-b", "blue", "node-1")
POOL = "198.51.100.0-24"


def _engine(tenant: Tenant, tmp: Path) -> tuple[Engine, list[tuple[str, str]]]:
    store, client = counting_store(tenant.node)
    conf = from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes",
                      "kubernetes": {"kubeconfig": str(tenant.node)},
                      "local_db": str(tmp / "state" / "whereabouts.db")})  # fmt: skip
    return Engine(store, conf), client.sent


def _sent(sent: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(method, resource) of each request: /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME]."""
    return [(method, path.split("/")[6]) for method, path in sent]


def test_a_del_after_this_nodes_add_reads_nothing(tenant: Tenant, tmp_path: Path) -> None:
    """The ADD leaves the pool as the server returned it beside the node lock and remembers the
    reservation it made: the DEL of that attachment is one pool PATCH and one reservation DELETE."""
    engine, sent = _engine(tenant, tmp_path)
    [(_, offset)] = engine.add(A)
    del sent[:]
    second, sent2 = _engine(tenant, tmp_path)  # another handle of the same process and node
    second.delete(A)
    assert _sent(sent2) == [("PATCH", "ippools"), ("DELETE", "overlappingrangeipreservations")]
    assert tenant.pools() == {POOL: {}} and tenant.reservations() == {}
    assert offset == 1


def test_an_entry_the_snapshot_lacks_is_read_and_freed(tenant: Tenant, tmp_path: Path) -> None:
    """B's entry and reservation were written by another writer after this node's last write (as
    upstream whereabouts would on this node during a migration): the DEL looks at the stored pool
    before concluding there is nothing to free, and frees both."""
    engine, _ = _engine(tenant, tmp_path)
    engine.add(A)
    other = open_kube(tenant.node)
    pool = other.get_pool(POOL)
    assert pool is not None
    other.put_reservation(Reservation("198.51.100.9", B))
    other.commit_pool(pool, PoolUpdate(put={"9": B}))
    again, sent = _engine(tenant, tmp_path)
    again.delete(B)
    assert ("GET", "ippools") in _sent(sent)
    assert set(tenant.pools()[POOL]) == {"1"}
    assert set(tenant.reservations()) == {"198.51.100.1"}
    again.delete(A)
    assert tenant.pools() == {POOL: {}} and tenant.reservations() == {}


def test_a_reservation_changed_since_it_was_known_is_read_before_it_is_freed(
    tenant: Tenant, tmp_path: Path
) -> None:
    """The remembered version is only a precondition: a reservation rewritten since (another writer
    refreshed it for the same attachment) is read and judged on what is stored."""
    engine, _ = _engine(tenant, tmp_path)
    engine.add(A)
    path = tenant.path("overlappingrangeipreservations", "198.51.100.1")
    obj = tenant.server.request("GET", path)
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"  # a new resourceVersion, same owner
    tenant.server.request("PUT", path, obj)
    again, sent = _engine(tenant, tmp_path)
    again.delete(A)
    assert _sent(sent) == [("PATCH", "ippools"), ("DELETE", "overlappingrangeipreservations"),
                           ("GET", "overlappingrangeipreservations"),
                           ("DELETE", "overlappingrangeipreservations")]  # fmt: skip
    assert tenant.pools() == {POOL: {}} and tenant.reservations() == {}


def test_a_nodes_slice_is_read_once_per_process_and_kept_for_a_while(tenant: Tenant, tmp_path: Path) -> None:
    """Node slices in the agent: the first call reads (here: creates) the NodeSlicePool, the next calls
    of the process within ipam.nodeslice._Known.KEEP use the slice they know (no request at all)."""
    from ipam import nodeslice

    store, client = counting_store(tenant.node)
    conf = from_dict({"range": "198.18.64.0/22", "node_slice_size": "/24", "datastore": "kubernetes",
                      "kubernetes": {"kubeconfig": str(tenant.node)},
                      "local_db": str(tmp_path / "state" / "whereabouts.db")})  # fmt: skip
    first = nodeslice.resolve(conf, store, "slicenet", "node-1", assign=True)
    assert [m for m, _ in client.sent] == ["GET", "POST"]  # absent: created with node-1 in slice 0
    del client.sent[:]
    again = nodeslice.resolve(conf, store, "slicenet", "node-1", assign=False)
    assert client.sent == [] and again.ranges == first.ranges
    assert first.ranges[0].cidr == "198.18.64.0/24"
    other = nodeslice.resolve(conf, store, "slicenet", "node-2", assign=True)  # another key: read
    assert other.ranges[0].cidr == "198.18.65.0/24" and client.sent
