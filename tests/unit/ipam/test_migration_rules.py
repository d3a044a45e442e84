"""Migration from/to upstream whereabouts in one pool (issue 12): what our DEL, GC, reconciler and the
owners annotation do with objects upstream wrote or rewrote.

Upstream (v0.9.4) writes pool entries without our annotations, reservations without spec.containerid,
takes an entry over for a kubelet re-ADD (same podref+ifname, new container id) leaving its reservation
as it was, and never touches annotations. Each test builds such a state the way upstream leaves it."""

from __future__ import annotations

import io
from typing import Any

from ipam import cli
from ipam.config import from_dict
from ipam.engine import Engine, Retry
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.podsource import PodInfo
from ipam.reconciler import Reconciler
from ipam.store import crd, etcd
from ipam.store.names import network_name_of, reservation_address, reservation_name
from tests.memstore import Backend, MemoryStore

POOL = "198.51.100.0-24"
OURS = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")
UPSTREAM = Allocation("cu", "ns/u", "net1")  # an upstream entry: no extras
UP_RES = Allocation("", "ns/u", "net1")  # an upstream reservation: no container id


def make(ipam: dict[str, Any] | None = None, store: MemoryStore | None = None) -> Engine:
    conf = from_dict({"datastore": "local", **(ipam or {"range": "198.51.100.0/24"})})  # a memory store
    return Engine(store or MemoryStore(Backend()), conf, Retry(rand=lambda: 0.5))


def upstream_add(e: Engine, key: str, owner: Allocation, res: Allocation | None = None) -> None:
    """The pool entry and reservation as upstream's ADD writes them."""
    pool = e.store.get_pool(POOL) or Pool(POOL, "198.51.100.0/24")
    e.store.commit_pool(pool, PoolUpdate(put={key: owner}))
    name = f"198.51.100.{key}"
    if e.store.get_reservation(name) is None:
        e.store.put_reservation(Reservation(name, res or owner._replace(container_id="")))


def upstream_takeover(e: Engine, key: str, container_id: str) -> Allocation:
    """Upstream's kubelet re-ADD: the entry's id rewritten; the reservation (same podref) left alone."""
    pool = e.store.get_pool(POOL)
    assert pool is not None
    old = pool.allocations[key]
    new = Allocation(container_id, old.podref, old.ifname)
    e.store.commit_pool(pool, PoolUpdate(put={key: new}))
    return new


def pool_ids(e: Engine) -> set[str]:
    pool = e.store.get_pool(POOL)
    return set() if pool is None else {a.container_id for a in pool.allocations.values()}


def reservations(e: Engine) -> dict[str, Allocation]:
    return {r.name: r.owner for r in e.store.iter_reservations()}


# ---- fix 1: our DEL of an upstream allocation frees its reservation -----------------------------


def test_del_of_an_upstream_allocation_frees_pool_entry_and_reservation() -> None:
    e = make()
    upstream_add(e, "1", UPSTREAM)
    e.delete(Allocation("cu", "ns/u", "net1", "uid-u", "netA", "node1"))
    assert pool_ids(e) == set() and reservations(e) == {}


def test_del_without_pod_arguments_still_frees_the_upstream_reservation() -> None:
    """The reservation is matched against the freed pool entry, not against the DEL's CNI_ARGS."""
    e = make()
    upstream_add(e, "1", UPSTREAM)
    e.delete(Allocation("cu", "", "net1"))
    assert pool_ids(e) == set() and reservations(e) == {}


def test_del_never_frees_a_reservation_of_another_pod_or_interface() -> None:
    e = make()
    upstream_add(e, "1", UPSTREAM, res=Allocation("", "ns/other", "net1"))
    upstream_add(e, "2", Allocation("cu2", "ns/u", "net2"), res=Allocation("", "ns/u", "net9"))
    upstream_add(e, "3", Allocation("cu3", "ns/u3", "net1"), res=Allocation("cx", "ns/x", "net1", "uid-x"))
    for cid, ifname in (("cu", "net1"), ("cu2", "net2"), ("cu3", "net1")):
        e.delete(Allocation(cid, "ns/u", ifname))
    assert pool_ids(e) == set()
    assert set(reservations(e)) == {"198.51.100.1", "198.51.100.2", "198.51.100.3"}


def test_del_after_an_upstream_takeover_frees_the_reservation_naming_the_old_container() -> None:
    e = make()
    e.add(OURS)
    newer = upstream_takeover(e, "1", "ca2")
    assert reservations(e)["198.51.100.1"].container_id == "ca"  # upstream left it as it was
    e.delete(newer)
    assert pool_ids(e) == set() and reservations(e) == {}


def test_late_del_of_the_old_sandbox_after_an_upstream_takeover_keeps_the_reservation() -> None:
    """The DEL finds nothing of container `ca` in the pool, so it sweeps reservations naming `ca`:
    this one protects the live entry `ca2` and stays."""
    e = make()
    e.add(OURS)
    upstream_takeover(e, "1", "ca2")
    e.delete(OURS)
    assert pool_ids(e) == {"ca2"} and set(reservations(e)) == {"198.51.100.1"}
    # while a reservation of `ca` that no pool entry holds is an orphan the sweep frees
    e.store.put_reservation(Reservation("198.51.100.9", OURS))
    e.delete(OURS)
    assert set(reservations(e)) == {"198.51.100.1"}


def test_gc_keeps_a_reservation_whose_address_a_live_entry_holds() -> None:
    e = make({"range": "198.51.100.0/24", "network_name": "blue"})
    e.add(OURS)
    pool = e.store.get_pool("blue-" + POOL)
    assert pool is not None
    e.store.commit_pool(pool, PoolUpdate(put={"1": Allocation("ca2", "ns/a", "net1")}))
    e.store.put_reservation(Reservation("blue-198.51.100.7", OURS._replace(ifname="net7")))  # crashed ADD
    e.gc("netA", "node1", {("ca2", "net1")})
    assert set(reservations(e)) == {"blue-198.51.100.1"}


# ---- fix 2: side data only for the allocation it was written for --------------------------------


def ours_then(entry: dict[str, str]) -> dict[str, Any]:
    """A pool object we wrote with OURS at offset 1, then upstream rewrote offset 1's spec entry."""
    obj = crd.pool_to_object(Pool(POOL, "198.51.100.0/24", {"1": OURS}, "5"), "ns")
    obj["spec"]["allocations"]["1"] = entry
    return obj


def test_owners_entry_is_kept_for_its_own_allocation() -> None:
    obj = crd.pool_to_object(Pool(POOL, "198.51.100.0/24", {"1": OURS}, "5"), "ns")
    assert crd.pool_from_object(obj).allocations["1"] == OURS


def test_owners_entry_is_not_attached_to_another_pods_allocation_at_the_same_offset() -> None:
    pool = crd.pool_from_object(ours_then({"id": "cz", "podref": "ns/z", "ifname": "net1"}))
    assert pool.allocations["1"] == Allocation("cz", "ns/z", "net1")


def test_owners_entry_is_not_attached_after_a_takeover_with_a_new_container_id() -> None:
    """The same pod name may be a new pod (StatefulSet): its UID is not the recorded one."""
    pool = crd.pool_from_object(ours_then({"id": "ca2", "podref": "ns/a", "ifname": "net1"}))
    assert pool.allocations["1"] == Allocation("ca2", "ns/a", "net1")


def test_entries_that_match_nothing_are_dropped_by_our_next_write() -> None:
    pool = crd.pool_from_object(ours_then({"id": "cz", "podref": "ns/z", "ifname": "net1"}))
    fresh = Allocation("cb", "ns/b", "net1", "uid-b", "netA", "node1")
    obj = crd.pool_to_object(
        Pool(pool.name, pool.range, PoolUpdate(put={"2": fresh}).apply(pool.allocations)), "ns"
    )
    assert set(crd.decode_owners(obj["metadata"]["annotations"])) == {"2"}


def test_legacy_owners_annotation_is_never_attached() -> None:
    """The first format has no stamp: nothing proves which allocation an entry was written for (upstream
    may have freed the offset and given it to a pod of the same name), so it is ignored."""
    obj = {
        "metadata": {"name": POOL, "annotations": {crd.LEGACY_OWNERS: '{"1":["uid-a","netA","node1"]}'}},
        "spec": {
            "range": "198.51.100.0/24",
            "allocations": {"1": {"id": "ca", "podref": "ns/a", "ifname": "net1"}},
        },
    }
    assert crd.pool_from_object(obj).allocations["1"] == Allocation("ca", "ns/a", "net1")


def test_mangled_stamps_cost_only_the_extras() -> None:
    obj = ours_then({"id": "ca", "podref": "ns/a", "ifname": "net1"})
    for bad in ("[]", '"x"', "[1,2,3,4,5]", "{", '{"1": []}'):
        obj["metadata"]["annotations"][crd.owner_key("1")] = bad
        assert crd.pool_from_object(obj).allocations["1"] == Allocation("ca", "ns/a", "net1")


def test_etcd_store_writes_stamped_entries_and_drops_the_legacy_annotation() -> None:
    obj: dict[str, Any] = {
        "metadata": {"annotations": {crd.LEGACY_OWNERS: '{"1":["x"]}', "note": "kept"}},
        "spec": {"range": "198.51.100.0/24", "allocations": {}},
    }
    etcd._apply(obj, PoolUpdate(put={"1": OURS}))
    assert set(obj["metadata"]["annotations"]) == {crd.owner_key("1"), "note"}
    assert crd.pool_from_object(obj).allocations["1"] == OURS


def test_show_prints_no_side_data_of_another_allocation() -> None:
    store = MemoryStore(Backend())
    pool = crd.pool_from_object(ours_then({"id": "cz", "podref": "ns/z", "ifname": "net1"}))
    store.commit_pool(Pool(POOL, pool.range), PoolUpdate(put=dict(pool.allocations)))
    out = io.StringIO()
    assert cli.cmd_show(store, POOL, out) == 0
    row = next(line for line in out.getvalue().splitlines() if line.startswith("198.51.100.1 "))
    assert "ns/z" in row and "uid-a" not in row and "netA" not in row and "node1" not in row


# ---- the reconciler: a reservation that protects a live entry stays -----------------------------


class Pods:
    def __init__(self, *pods: PodInfo) -> None:
        self.pods = {(p.namespace, p.name): p for p in pods}

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        return self.pods.get((namespace, name))

    def close(self) -> None:
        pass


def test_reconciler_keeps_a_stale_named_reservation_that_protects_a_live_entry() -> None:
    """StatefulSet pod ns/a recreated (new UID) and re-ADDed by upstream: the pool entry is the new
    container's (no extras: not recreated), the reservation still names the old UID."""
    e = make({"range": "198.51.100.0/24", "network_name": "blue"})
    e.add(OURS)
    e.add(Allocation("cg", "ns/gone", "net1", "uid-g", "netA", "node1"))
    store = e.store
    snap = store.get_pool("blue-" + POOL)
    assert snap is not None
    store.commit_pool(snap, PoolUpdate(put={"1": Allocation("ca2", "ns/a", "net1")}))
    report = Reconciler(store, Pods(PodInfo("ns", "a", "uid-a-new"))).run()
    assert not report.errors and report.freed == 2  # ns/gone: its entry and its reservation
    assert pool_ids_of(store, "blue-" + POOL) == {"ca2"}
    assert {r.name for r in store.iter_reservations()} == {"blue-198.51.100.1"}


def pool_ids_of(store: MemoryStore, name: str) -> set[str]:
    pool = store.get_pool(name)
    return set() if pool is None else {a.container_id for a in pool.allocations.values()}


def test_reservation_and_network_names_parse_back() -> None:
    for ip, net in (
        ("198.51.100.7", ""),
        ("2001:db8::", "blue"),
        ("2001:db8::5", ""),
        ("198.51.100.1", "a-b"),
    ):
        name = reservation_name(ip, net)
        assert reservation_address(name, net, 6 if ":" in ip else 4) == ip
        assert reservation_address(name, net, 4 if ":" in ip else 6) is None
    assert reservation_address("blue-198.51.100.1", "", 4) is None
    assert reservation_address("198.51.100.1", "blue", 4) is None
    assert network_name_of("blue-2001-db8---64", "2001:db8::/64") == "blue"
    assert network_name_of("198.51.100.0-24", "198.51.100.9/24") == ""
    assert network_name_of("x", "198.51.100.0/24") is None
