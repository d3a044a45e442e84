"""What the engine saves on the real kube-apiserver between calls, counted request by request: the agent
(its memory of each pool: ipam.agentreads.Memory; ipam.store.kube known reservations), and what a plugin
process (the plain path) sends; and that what the agent skips never costs correctness: an entry its
memory does not hold is still found and freed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam import batch, combiner, plugin
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, PoolUpdate, Reservation
from tests.kubeapi.factory import CountingClient, counting_store, open_kube
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
    engine = Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=plugin.EXECUTE)
    return engine, client.sent


@pytest.fixture
def agent() -> Iterator[None]:
    """The agent's sharing: each pool's memory kept with its combiner."""
    batch.install()
    yield
    batch.uninstall()


def _sent(sent: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(method, resource) of each request: /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME]."""
    return [(method, path.split("/")[6]) for method, path in sent]


def test_a_del_after_this_nodes_add_reads_nothing(agent: None, tenant: Tenant, tmp_path: Path) -> None:
    """The agent's ADD keeps the pool as the server returned it and remembers the reservation it
    made: the DEL of that attachment is one pool PATCH and one reservation DELETE."""
    engine, sent = _engine(tenant, tmp_path)
    [(_, offset)] = engine.add(A)
    del sent[:]
    engine.delete(A)
    assert _sent(sent) == [("PATCH", "ippools"), ("DELETE", "overlappingrangeipreservations")]
    assert tenant.pools() == {POOL: {}} and tenant.reservations() == {}
    assert offset == 1


def _b_written_elsewhere_after_a(tenant: Tenant, tmp: Path) -> tuple[Engine, list[tuple[str, str]]]:
    """A added by this node's agent, then B's entry (offset 9) and reservation by another writer."""
    engine, sent = _engine(tenant, tmp)
    engine.add(A)
    other = open_kube(tenant.node)
    pool = other.get_pool(POOL)
    assert pool is not None
    other.put_reservation(Reservation("198.51.100.9", B))
    other.commit_pool(pool, PoolUpdate(put={"9": B}))
    other.close()
    del sent[:]
    return engine, sent


def test_an_add_after_this_nodes_write_reads_nothing(agent: None, tenant: Tenant, tmp_path: Path) -> None:
    """No other node raced this one on the pool: the agent's next ADD decides on the pool its last
    write left (no GET) and writes with the whole pool's version as a precondition."""
    engine, sent = _engine(tenant, tmp_path)
    engine.add(A)
    del sent[:]
    [(_, offset)] = engine.add(B)
    assert _sent(sent) == [("POST", "overlappingrangeipreservations"), ("PATCH", "ippools")]
    assert offset == 2 and set(tenant.pools()[POOL]) == {"1", "2"}


def test_an_add_on_a_pool_written_elsewhere_since_reads_it_and_finds_its_entry(
    agent: None, tenant: Tenant, tmp_path: Path
) -> None:
    """B's entry and reservation were written by another writer after this node's last write (upstream
    whereabouts on this node during a migration): an ADD of B decided on the snapshot would give B a
    second address; its write needs the pool unchanged, so it is a Conflict, the pool is read and B
    keeps the address it has. The reservation the first attempt made is dropped."""
    again, sent = _b_written_elsewhere_after_a(tenant, tmp_path)
    [(_, offset)] = again.add(B)
    assert offset == 9 and ("GET", "ippools") in _sent(sent)
    assert set(tenant.pools()[POOL]) == {"1", "9"}
    assert set(tenant.reservations()) == {"198.51.100.1", "198.51.100.9"}
    del sent[:]
    [(_, offset)] = again.add(A)  # a foreign write was seen: read, not the pool it kept
    assert offset == 1 and ("GET", "ippools") in _sent(sent)


def test_a_hot_add_reads_the_pool_from_the_servers_cache_no_older_than_this_nodes_write(
    agent: None, tenant: Tenant, tmp_path: Path
) -> None:
    """Another node raced this one lately (the pool is hot): the agent's ADD reads the pool, as a GET
    with the resourceVersion of its last write (the API server answers from its watch cache once that
    holds it, instead of reading etcd), and sees that write and the other writer's."""
    again, _ = _b_written_elsewhere_after_a(tenant, tmp_path)
    client = again.store.client  # (tests.kubeapi.factory.CountingClient: its requests and queries)
    assert isinstance(client, CountingClient)
    memory = batch.memory(combiner.combiner((again.identity, POOL)))
    floor = memory.floor
    memory.heat(60)
    del client.sent[:], client.queries[:]
    c = Allocation("c" * 64, "ns/c", "net1", "uid-c", "blue", "node-1")
    [(_, offset)] = again.add(c)
    reads = [q for (method, path), q in zip(client.sent, client.queries, strict=True)
             if method == "GET" and path.split("/")[6] == "ippools"]  # fmt: skip
    assert floor and reads[:1] == [{"resourceVersion": floor}]
    assert offset not in (1, 9) and set(tenant.pools()[POOL]) == {"1", "9", str(offset)}


def test_an_entry_the_snapshot_lacks_is_read_and_freed(agent: None, tenant: Tenant, tmp_path: Path) -> None:
    """B's entry and reservation were written by another writer after the agent's last write (as
    upstream whereabouts would on this node during a migration): the DEL looks at the stored pool
    before concluding there is nothing to free, and frees both."""
    again, sent = _b_written_elsewhere_after_a(tenant, tmp_path)
    again.delete(B)
    assert ("GET", "ippools") in _sent(sent)
    assert set(tenant.pools()[POOL]) == {"1"}
    assert set(tenant.reservations()) == {"198.51.100.1"}
    again.delete(A)
    assert tenant.pools() == {POOL: {}} and tenant.reservations() == {}


def test_a_reservation_changed_since_it_was_known_is_read_before_it_is_freed(
    agent: None, tenant: Tenant, tmp_path: Path
) -> None:
    """The remembered version is only a precondition: a reservation rewritten since (another writer
    refreshed it for the same attachment) is read and judged on what is stored."""
    engine, sent = _engine(tenant, tmp_path)
    engine.add(A)
    path = tenant.path("overlappingrangeipreservations", "198.51.100.1")
    obj = tenant.server.request("GET", path)
    obj["metadata"].setdefault("labels", {})["touched"] = "yes"  # a new resourceVersion, same owner
    tenant.server.request("PUT", path, obj)
    del sent[:]
    engine.delete(A)
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


def test_what_a_plugin_process_sends(tenant: Tenant, tmp_path: Path) -> None:
    """The plain path (separate processes, nothing remembered): an ADD reads the pool, reserves its
    address and writes the pool; a DEL reads the pool, writes it and deletes the reservation (read
    first: its version is the delete's precondition)."""
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
    call(one, "ADD")  # (creates the pool)
    assert call(two, "ADD") == {("GET", "ippools"): 1, ("POST", "overlappingrangeipreservations"): 1,
                                ("PATCH", "ippools"): 1}  # fmt: skip
    assert call(one, "DEL") == {("GET", "ippools"): 1, ("PATCH", "ippools"): 1,
                                ("GET", "overlappingrangeipreservations"): 1,
                                ("DELETE", "overlappingrangeipreservations"): 1}  # fmt: skip
    assert call(two, "DEL")
    assert tenant.reservations() == {} and tenant.pools() == {POOL: {}}
