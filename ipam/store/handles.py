"""Store handles for one IPAM call: opened fresh in a plugin process, kept warm in the agent.

The node-local agent (cni.agent) keeps idle handles of the cluster stores (Kubernetes, etcd), so a call
reuses an open TLS connection, a loaded kubeconfig and an etcd auth token. A handle serves one call
(one thread) at a time; one that saw an error, or has been idle or alive too long (a rewritten
kubeconfig, rotated certificates), is closed instead of kept. The local store is opened per call
(SQLite connections belong to a thread, and opening one costs little).

Handles are kept per `lane`: the calls' own (""), and BATCH for the threads that run a pool's batches
(ipam.batch): while many calls wait on a pool, each holding its handle, the calls' lane is empty,
and a batch taking its handle there would open a new one (a TLS handshake) in front of every call it
carries."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading would cost every call
import contextlib
import time
from collections.abc import Iterator

from ipam.config import StoreConfig
from ipam.store.base import Store

WARM_STORES = ("kubernetes", "etcd")
MAX_IDLE = 8  # per configuration and lane
BATCH = "batch"  # the lane of the batches' threads
IDLE_SECONDS = 60.0
MAX_AGE_SECONDS = 300.0


class _Cache:
    enabled = False
    lock = _thread.allocate_lock()
    idle: dict[tuple[StoreConfig, str], list[tuple[float, float, Store]]] = {}  # -> [(opened, used, handle)]


def keep_warm(enabled: bool = True) -> None:
    """The agent calls this once at start-up (with ipam.batch.install); plugin processes never do."""
    _Cache.enabled = enabled
    if not enabled:
        clear()


def clear() -> None:
    with _Cache.lock:
        handles = [h for entries in _Cache.idle.values() for _, _, h in entries]
        _Cache.idle.clear()
    for h in handles:
        with contextlib.suppress(Exception):
            h.close()


def _take(conf: StoreConfig, lane: str) -> tuple[float, Store] | None:
    now = time.monotonic()
    stale: list[Store] = []
    found = None
    with _Cache.lock:
        entries = _Cache.idle.get((conf, lane), [])
        while entries and found is None:
            opened, used, handle = entries.pop()
            if now - used > IDLE_SECONDS or now - opened > MAX_AGE_SECONDS:
                stale.append(handle)
            else:
                found = (opened, handle)
    for h in stale:
        with contextlib.suppress(Exception):
            h.close()
    return found


def _give_back(conf: StoreConfig, lane: str, opened: float, handle: Store) -> bool:
    with _Cache.lock:
        entries = _Cache.idle.setdefault((conf, lane), [])
        if len(entries) >= MAX_IDLE:
            return False
        entries.append((opened, time.monotonic(), handle))
        return True


@contextlib.contextmanager
def store_for(conf: StoreConfig, lane: str = "") -> Iterator[Store]:
    """A store handle for one call (or a batch's thread: `lane` BATCH); closed afterwards unless the
    agent keeps it warm."""
    from ipam.store.select import open_store

    warm = _Cache.enabled and conf.datastore in WARM_STORES
    taken = _take(conf, lane) if warm else None
    opened, store = taken if taken else (time.monotonic(), open_store(conf))
    ok = False
    try:
        yield store
        ok = True
    finally:
        if not (warm and ok and _give_back(conf, lane, opened, store)):
            store.close()
