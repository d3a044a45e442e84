"""What the engine saves on the real kube-apiserver between calls of one node (ipam.attempt,
ipam.nodelock snapshots, ipam.store.kube known reservations), counted request by request, and that
what it skips never costs correctness: an entry the snapshot does not hold is still found and freed."""

from __future__ import annotations

import os
from pathlib import Path

from ipam import nodelock
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, PoolUpdate, Reservation
from tests.kubeapi.factory import counting_store, open_kube
from tests.kubeup import Tenant
from tests.logtee import PYTHONPATH

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


def _b_written_elsewhere_after_a(tenant: Tenant, tmp: Path) -> None:
    """A added by this node, then B's entry (offset 9) and reservation by another writer."""
    engine, _ = _engine(tenant, tmp)
    engine.add(A)
    other = open_kube(tenant.node)
    pool = other.get_pool(POOL)
    assert pool is not None
    other.put_reservation(Reservation("198.51.100.9", B))
    other.commit_pool(pool, PoolUpdate(put={"9": B}))
    other.close()


def test_an_add_after_this_nodes_write_reads_nothing(tenant: Tenant, tmp_path: Path) -> None:
    """No other node raced this one on the pool: the next ADD decides on the snapshot the last write
    left (no GET) and writes with the whole pool's version as a precondition."""
    engine, _ = _engine(tenant, tmp_path)
    engine.add(A)
    again, sent = _engine(tenant, tmp_path)
    [(_, offset)] = again.add(B)
    assert _sent(sent) == [("POST", "overlappingrangeipreservations"), ("PATCH", "ippools")]
    assert offset == 2 and set(tenant.pools()[POOL]) == {"1", "2"}


def test_an_add_on_a_pool_written_elsewhere_since_reads_it_and_finds_its_entry(
    tenant: Tenant, tmp_path: Path
) -> None:
    """B's entry and reservation were written by another writer after this node's last write (upstream
    whereabouts on this node during a migration): an ADD of B decided on the snapshot would give B a
    second address; its write needs the pool unchanged, so it is a Conflict, the pool is read and B
    keeps the address it has. The reservation the first attempt made is dropped."""
    _b_written_elsewhere_after_a(tenant, tmp_path)
    again, sent = _engine(tenant, tmp_path)
    [(_, offset)] = again.add(B)
    assert offset == 9 and ("GET", "ippools") in _sent(sent)
    assert set(tenant.pools()[POOL]) == {"1", "9"}
    assert set(tenant.reservations()) == {"198.51.100.1", "198.51.100.9"}
    [(_, offset)] = _engine(tenant, tmp_path)[0].add(A)  # a foreign write was seen: read, not the snapshot
    assert offset == 1


def test_a_hot_add_reads_the_pool_from_the_servers_cache_no_older_than_this_nodes_write(
    tenant: Tenant, tmp_path: Path
) -> None:
    """Another node raced this one lately (the pool is hot): the ADD reads the pool, as a GET with the
    resourceVersion of this node's last write (the API server answers from its watch cache once that
    holds it, instead of reading etcd), and sees that write and the other writer's."""
    _b_written_elsewhere_after_a(tenant, tmp_path)
    engine, _ = _engine(tenant, tmp_path)
    lock = nodelock.path_for(engine.lock_dir, engine.identity, "node-1", POOL)
    with nodelock.held(lock) as held:
        assert held is not None
        floor = held.floor()
        held.heat(60)
    store, client = counting_store(tenant.node)
    again = Engine(store, engine.conf)
    c = Allocation("c" * 64, "ns/c", "net1", "uid-c", "blue", "node-1")
    [(_, offset)] = again.add(c)
    reads = [q for (method, path), q in zip(client.sent, client.queries, strict=True)
             if method == "GET" and path.split("/")[6] == "ippools"]  # fmt: skip
    assert floor and reads[:1] == [{"resourceVersion": floor}]
    assert offset not in (1, 9) and set(tenant.pools()[POOL]) == {"1", "9", str(offset)}


def test_an_entry_the_snapshot_lacks_is_read_and_freed(tenant: Tenant, tmp_path: Path) -> None:
    """B's entry and reservation were written by another writer after this node's last write (as
    upstream whereabouts would on this node during a migration): the DEL looks at the stored pool
    before concluding there is nothing to free, and frees both."""
    _b_written_elsewhere_after_a(tenant, tmp_path)
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


def test_calls_waiting_on_the_node_lock_are_served_by_the_holders_write(
    tenant: Tenant, tmp_path: Path
) -> None:
    """Plugin processes of one node (ipam.nodequeue): B and C wait behind the node lock with their ADDs
    in the queue; A's call takes them into its write (one PATCH for three addresses, a reservation
    each) and answers them; B then finds its answer under the lock and sends nothing. A request
    whose caller died is dropped, not served."""
    from ipam import batch, exec_plain, nodelock, nodequeue

    engine, sent = _engine(tenant, tmp_path)
    rng = engine.conf.ranges[0]
    lock = nodelock.path_for(engine.lock_dir, engine.identity, "node-1", POOL)
    C = Allocation("c" * 64, "ns/c", "net1", "uid-c", "blue", "node-1")
    D = Allocation("d" * 64, "ns/d", "net1", "uid-d", "blue", "node-1")
    engine.add(Allocation("e" * 64, "ns/e", "net1", "uid-e", "blue", "node-1"))  # the pool exists
    del sent[:]
    waiting = {who.podref: nodequeue.publish(lock, [batch.Op("add", rng, who, True)]) for who in (B, C, D)}
    dead = waiting.pop("ns/d")
    assert dead is not None
    os.close(dead.fd)  # D's caller died: its flock is gone, its file stays
    [(_, a)] = engine.add(A)
    # no GET: the pool as the previous write on this node left it (test_an_add_after_this_nodes_write_...)
    assert _sent(sent) == [*[("POST", "overlappingrangeipreservations")] * 3, ("PATCH", "ippools")]
    assert not os.path.exists(dead.path)
    b, c = waiting["ns/b"], waiting["ns/c"]
    assert b is not None and c is not None
    other, sent_b = _engine(tenant, tmp_path)
    exec_plain.attempt(other, POOL, b.ops, b)  # B's turn at the lock: its answer is there
    assert sent_b == [] and b.ops[0].done and b.ops[0].error is None
    assert c.answered()
    offsets = {a, b.ops[0].offsets[0], c.ops[0].offsets[0]}
    assert len(offsets) == 3
    pool = {k: v for k, v in tenant.pools()[POOL].items() if v["podref"] != "ns/e"}
    assert {int(k) for k in pool} == offsets
    assert {v["podref"] for v in pool.values()} == {"ns/a", "ns/b", "ns/c"}
    assert len(tenant.reservations()) == 4
    for t in (b, c):
        t.close()


def test_plugin_processes_queued_on_one_node_share_one_pool_write(tenant: Tenant, tmp_path: Path) -> None:
    """Four ADD processes of one node start while the node lock is held (here by the test): each leaves
    its request in the queue and waits; the first to get the lock writes the pool once for all four,
    and each process answers with its own, distinct address."""
    import subprocess
    import sys
    import time

    from cni import jsonio
    from ipam import nodelock
    from tests.concurrency.harness import Att, base_conf, run_inline
    from tests.nsutil import REPO

    conf = base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}},
                     tmp_path, range="198.51.100.0/24")  # fmt: skip
    rc, _ = run_inline(Att("0" * 64, "net1", f"{tenant.namespace}/warm").env("ADD"), conf)  # the pool exists
    assert rc == 0
    [lock] = (tmp_path / "state" / "pool-locks").glob("*.lock")
    before = tenant.server.request_counts()
    atts = [Att(f"{k}" * 64, "net1", f"{tenant.namespace}/p{k}") for k in range(1, 5)]
    procs = []
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "PYCNI_AGENT": "off"}
    stdin = tmp_path / "conf.json"
    stdin.write_bytes(jsonio.dumps(conf))
    with nodelock.held(str(lock)):
        for att in atts:
            with open(stdin, "rb") as conf_in:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "cni", "whereabouts"], cwd=REPO, stdin=conf_in,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**env, **att.env("ADD")},
                ))  # fmt: skip
        deadline = time.monotonic() + 120
        while len(list(Path(f"{lock}.q").glob("*.req"))) < len(atts):  # all four wait in the queue
            assert time.monotonic() < deadline, "the calls never queued"
            assert all(p.poll() is None for p in procs), "a call ended while the lock was held"
            time.sleep(0.05)
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, [err[-500:] for _, err in outs]
    addresses = {jsonio.loads(out)["ips"][0]["address"] for out, _ in outs}
    assert len(addresses) == 4
    after = tenant.server.request_counts()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after if k[1] == "ippools"}
    assert sum(n for (verb, _, _), n in delta.items() if verb == "PATCH") == 1, delta
    assert list(Path(f"{lock}.q").glob("*.req")) == [] and list(Path(f"{lock}.q").glob("*.out")) == []


def test_a_plugin_process_frees_the_reservation_its_nodes_add_made_without_reading_it(
    tenant: Tenant, tmp_path: Path
) -> None:
    """Separate processes (nothing shared in memory): the ADD's write leaves the reservation's version
    beside the node lock, and the DEL process deletes it with that version as a precondition, no GET.
    A reservation rewritten since is read and judged (and still freed)."""
    import subprocess
    import sys

    from cni import jsonio
    from tests.concurrency.harness import Att, base_conf
    from tests.nsutil import REPO

    conf = base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}},
                     tmp_path, range="198.51.100.0/24")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "PYCNI_AGENT": "off"}

    def call(att: Att, command: str) -> dict[tuple[str, str], float]:
        before = tenant.server.request_counts()
        p = subprocess.run([sys.executable, "-m", "cni", "whereabouts"], input=jsonio.dumps(conf),
                           cwd=REPO, env={**env, **att.env(command)}, capture_output=True, timeout=120,
                           check=False)  # fmt: skip
        assert p.returncode == 0, p.stdout + p.stderr[-1000:]
        delta: dict[tuple[str, str], float] = {}
        for key, n in tenant.server.request_counts().items():
            verb, resource, _ = key
            if resource in ("ippools", "overlappingrangeipreservations") and n > before.get(key, 0):
                delta[verb, resource] = delta.get((verb, resource), 0) + n - before.get(key, 0)
        return delta

    one, two = (Att(f"{k}" * 64, "net1", f"{tenant.namespace}/p{k}") for k in (1, 2))
    call(one, "ADD")
    call(two, "ADD")
    assert call(one, "DEL") == {("PATCH", "ippools"): 1, ("DELETE", "overlappingrangeipreservations"): 1}
    path = tenant.path("overlappingrangeipreservations", "198.51.100.2")
    obj = tenant.server.request("GET", path)
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"  # a new resourceVersion, same owner
    tenant.server.request("PUT", path, obj)
    assert call(two, "DEL") == {("PATCH", "ippools"): 1, ("DELETE", "overlappingrangeipreservations"): 2,
                                ("GET", "overlappingrangeipreservations"): 1}  # fmt: skip
    assert tenant.reservations() == {} and tenant.pools() == {POOL: {}}
