"""A pool near what its store can hold (docs/ipam.md "Pool size limit"): an IPPool is one etcd value, so the
Kubernetes store gives no new entry from a pool past crd.SIZE_LIMIT (code 100, final for that ADD), while a
DEL, and an ADD of an attachment the pool already holds, still work. Here: the estimate of what one entry
adds (exact against the encoded object), the threshold to the byte on the store's own check (a client seam
answering with a pool of chosen size), the message, the server's too-large answers, and the engine's use
of the check (per ADD, before any reservation; a DEL in the same agent batch unaffected). On the real API
server: tests/kubeapi/test_pool_size.py."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import CniError, Code
from ipam import plugin, rbac
from ipam.allocator import SnapshotView
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.kubeapi import ApiError
from ipam.model import Allocation, Pool, PoolUpdate, PoolView
from ipam.store import crd
from ipam.store.base import StoreUnavailable
from ipam.store.kube import KubeStore
from ipam.store.kubecall import api_failure
from tests.memstore import Backend, MemoryStore
from tests.unit.ipam.conftest import count_queued
from tests.unit.ipam.test_agent_batches import GateStore
from tests.waits import until

NS, NAME, RANGE = "size", "198.18.0.0-15", "198.18.0.0/15"
LEAN = Allocation("e" * 64, "size/web-7f9c8d6b5d-x2x4k", "net1")
FULL = LEAN._replace(pod_uid="0f9e5c1a-1b2c-4d5e-8f90-123456789abc", network="blue", node="node-1")


def entries(n: int, extras: bool = False) -> dict[str, Allocation]:
    a = FULL if extras else LEAN
    return {str(k): a._replace(container_id=f"{k:064x}", podref=f"size/pod-{k}") for k in range(1, n + 1)}


def encoded(pool: Pool) -> int:
    return len(jsonio.dumps(crd.pool_to_object(pool, NS)))


@pytest.mark.parametrize("extras", [False, True], ids=["lean", "with-extras"])
@pytest.mark.parametrize("key", ["7", "4242", "131071"])
def test_an_entry_adds_what_entry_bytes_says(extras: bool, key: str) -> None:
    held = entries(3, extras)
    new = (FULL if extras else LEAN)._replace(container_id="f" * 64)
    before = encoded(Pool(NAME, RANGE, held))
    after = encoded(Pool(NAME, RANGE, {**held, key: new}))
    assert after - before == crd.entry_bytes(new, len(key))
    assert crd.entry_bytes(new) >= after - before  # the default counts an offset of 8 digits


class Answers:
    """KubeStore's client seam: every GET answers `obj` (a list GET: `obj` as its one item), and
    `received` is the answer's size, as ipam.kubeapi.Client records it."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj, self.received, self.conf = obj, 0, None

    def request(self, method: str, path: str, body: Any = None, query: Any = None,
                content_type: str = "") -> dict[str, Any]:  # fmt: skip
        doc = self.obj if path.endswith(f"/{NAME}") else {"items": [self.obj], "metadata": {}}
        data = jsonio.dumps(doc)
        self.received = len(data)
        return dict(jsonio.loads(data))


def pool_of_size(size: int, tracked: int = 0) -> dict[str, Any]:
    """A pool object whose answer is `size` bytes (padded in a foreign annotation); `tracked`: bytes of
    managedFields in it."""
    obj = crd.pool_to_object(Pool(NAME, RANGE, entries(50), "7"), NS)
    obj["metadata"]["annotations"] = {"pad": ""}
    if tracked:
        empty = [{"manager": ""}]
        obj["metadata"]["managedFields"] = [{"manager": "m" * (tracked - len(jsonio.dumps(empty)))}]
    obj["metadata"]["annotations"]["pad"] = "x" * (size - len(jsonio.dumps(obj)))
    assert len(jsonio.dumps(obj)) == size
    return obj


def admitted(store: KubeStore, view: PoolView, earlier: int = 0) -> bool:
    try:
        store.admit(view, LEAN, earlier)
    except CniError as e:
        assert e.code == Code.POOL_EXHAUSTED
        return False
    return True


@pytest.mark.parametrize("earlier", [0, 3, 127])
def test_the_store_admits_up_to_the_limit_to_the_byte(earlier: int) -> None:
    room = crd.SIZE_LIMIT - (earlier + 1) * crd.entry_bytes(LEAN)
    for size, fits in ((room, True), (room + 1, False)):
        store = KubeStore(Answers(pool_of_size(size)), NS, rbac.NODE)  # type: ignore[arg-type]
        pool = store.get_pool(NAME)
        assert pool is not None
        assert admitted(store, SnapshotView(pool), earlier) is fits, size


def test_a_listed_pool_is_measured_and_managed_fields_do_not_count() -> None:
    room = crd.SIZE_LIMIT - crd.entry_bytes(LEAN)
    store = KubeStore(Answers(pool_of_size(room + 1)), NS, rbac.NODE)  # type: ignore[arg-type]
    (listed,) = store.iter_pools()  # a list answer: the object's own size is not known from it
    assert not admitted(store, SnapshotView(listed))
    # field tracking that our write would clear is not counted (upstream's pools, a pool we created)
    store = KubeStore(Answers(pool_of_size(room + 1000, tracked=1000)), NS, rbac.NODE)  # type: ignore[arg-type]
    pool = store.get_pool(NAME)
    assert pool is not None and admitted(store, SnapshotView(pool))
    store = KubeStore(Answers(pool_of_size(room + 1001, tracked=1000)), NS, rbac.NODE)  # type: ignore[arg-type]
    pool = store.get_pool(NAME)
    assert pool is not None and not admitted(store, SnapshotView(pool))


def test_the_refusal_names_the_pool_its_size_the_limit_and_what_to_do() -> None:
    size = crd.SIZE_LIMIT
    store = KubeStore(Answers(pool_of_size(size)), NS, rbac.NODE)  # type: ignore[arg-type]
    pool = store.get_pool(NAME)
    assert pool is not None
    with pytest.raises(CniError) as e:
        store.admit(SnapshotView(pool), LEAN, 0)
    assert e.value.code == Code.POOL_EXHAUSTED
    text = str(e.value)
    for part in (f"pool {NAME}", "50 entries", f"{size:,} bytes", f"{crd.SIZE_LIMIT:,} bytes",
                 f"{crd.STORE_LIMIT:,} bytes", "smaller range", "node_slice_size",
                 "docs/ipam.md#pool-size-limit"):  # fmt: skip
        assert part in text, (part, text)
    assert crd.SIZE_LIMIT == 1441792 and crd.STORE_LIMIT == 1572864  # what docs/ipam.md says


@pytest.mark.parametrize(
    ("status", "message"),
    [(500, "etcdserver: request is too large"),
     (500, "rpc error: code = ResourceExhausted desc = trying to send message larger than max (2144381 vs. "
           "2097152)"),
     (413, "Request entity too large: limit is 3145728")],
)  # fmt: skip
def test_a_write_the_server_finds_too_large_is_final(status: int, message: str) -> None:
    err = api_failure(ApiError(status, "", message), "patch ippools/p", (401, 403, 410))
    assert err.code == Code.POOL_EXHAUSTED and not isinstance(err, StoreUnavailable)
    assert message in str(err) and "docs/ipam.md#pool-size-limit" in str(err)
    assert isinstance(api_failure(ApiError(500, "", "etcdserver: leader changed"), "patch"), StoreUnavailable)


# ---- the engine: the check per ADD ----------------------------------------------------------------------

POOL = "198.51.100.0-24"


class Bounded(GateStore):
    """A store that holds at most `most` entries per pool (`admit`, as the Kubernetes store's bytes)."""

    most = 4

    def admit(self, view: PoolView, entry: Allocation, earlier: int) -> None:
        if view.count() + earlier + 1 > self.most:
            raise CniError(f"pool {view.name} is too large for another entry", code=Code.POOL_EXHAUSTED)


def owner(i: int) -> Allocation:
    return Allocation(f"c{i}", f"ns/p{i}", "net1", f"uid-{i}", "n", "node1")


def setup(tmp: Path, held: int) -> tuple[Backend, threading.Event, threading.Event, Engine]:
    """A pool holding c0..c{held-1}; pool writes wait at a gate (open), `arrived` set by each."""
    backend, gate, arrived = Backend(), threading.Event(), threading.Event()
    MemoryStore(backend).commit_pool(Pool(POOL, "198.51.100.0/24"),
                                     PoolUpdate(put={str(i + 1): owner(i) for i in range(held)}))  # fmt: skip
    conf = from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes", "local_db": str(tmp / "ipam.db"),
                      "kubernetes": {"kubeconfig": "/nonexistent"}})  # fmt: skip

    def store() -> Bounded:
        return Bounded(backend, gate, [], arrived=arrived)

    gate.set()
    engine = Engine(store(), conf, reopen=lambda: contextlib.nullcontext(store()), execute=plugin.EXECUTE)
    return backend, gate, arrived, engine


def test_an_add_into_a_full_pool_is_refused_before_its_reservation(tmp_path: Path) -> None:
    backend, _, _, e = setup(tmp_path, held=3)
    e.add(owner(3))  # the 4th entry fits
    with pytest.raises(CniError) as refused:
        e.add(owner(4))
    assert refused.value.code == Code.POOL_EXHAUSTED and "too large" in str(refused.value)
    assert {a.container_id for a in backend.pools[POOL].allocations.values()} == {"c0", "c1", "c2", "c3"}
    assert {r.owner.container_id for r in backend.reservations.values()} == {"c3"}  # none for c4
    assert e.add(owner(3)) == e.add(owner(3))  # an attachment the pool holds: its address, as before
    e.delete(owner(0))  # DEL always works, and makes room
    e.add(owner(4))
    assert {a.container_id for a in backend.pools[POOL].allocations.values()} == {"c1", "c2", "c3", "c4"}


def test_a_refused_add_does_not_fail_the_dels_of_its_batch(agent: None, tmp_path: Path) -> None:
    """The agent: an ADD and a DEL queued while the pool's write is held run in one batch: the ADD fails
    with code 100, the DEL frees its entry."""
    backend, gate, arrived, e = setup(tmp_path, held=6)  # past what the store holds already
    gate.clear()
    results: dict[str, Any] = {}

    def run(key: str, call: Any) -> threading.Thread:
        def body() -> None:
            try:
                results[key] = call()
            except CniError as err:
                results[key] = err

        t = threading.Thread(target=body, daemon=True)
        t.start()
        return t

    threads = [run("del c0", lambda: e.on(e.store).delete(owner(0)))]
    assert arrived.wait(30)  # its write is at the gate
    queued = count_queued()
    threads.append(run("add c9", lambda: e.on(e.store).add(owner(9))))
    until(lambda: queued["combiner-queued"] == 1, "the ADD queued")
    threads.append(run("del c1", lambda: e.on(e.store).delete(owner(1))))
    until(lambda: queued["combiner-queued"] == 2, "the ADD and the DEL queued")
    gate.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert results["del c0"] is None and results["del c1"] is None
    assert isinstance(results["add c9"], CniError) and results["add c9"].code == Code.POOL_EXHAUSTED
    assert {a.container_id for a in backend.pools[POOL].allocations.values()} == {"c2", "c3", "c4", "c5"}
    assert backend.reservations == {}
