"""ipam.store.handles: the agent keeps cluster store handles warm between calls; plugin processes and
the local store open per call; a handle that saw an error or grew stale is closed, never reused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ipam.config import EtcdConf, StoreConfig
from ipam.store import handles

ETCD = StoreConfig(datastore="etcd", etcd=EtcdConf(host="http://127.0.0.1:1"))
LOCAL = StoreConfig(datastore="local", local_db="/nonexistent/db")


class FakeStore:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeStore]]:
    made: list[FakeStore] = []

    def open_store(conf: StoreConfig) -> FakeStore:
        made.append(FakeStore())
        return made[-1]

    monkeypatch.setattr("ipam.store.select.open_store", open_store)
    yield made
    handles.keep_warm(False)


def use(conf: StoreConfig) -> FakeStore:
    with handles.store_for(conf) as store:
        return store  # type: ignore[return-value]


def test_a_plugin_process_opens_and_closes_per_call(opened: list[FakeStore]) -> None:
    a, b = use(ETCD), use(ETCD)
    assert a is not b and a.closed and b.closed and len(opened) == 2


def test_the_agent_reuses_a_cluster_store_handle(opened: list[FakeStore]) -> None:
    handles.keep_warm()
    a, b = use(ETCD), use(ETCD)
    assert a is b and not a.closed and len(opened) == 1
    handles.keep_warm(False)
    assert a.closed  # switching off closes what was kept


def test_the_local_store_is_never_kept(opened: list[FakeStore]) -> None:
    handles.keep_warm()
    a, b = use(LOCAL), use(LOCAL)
    assert a is not b and a.closed


def test_a_handle_that_saw_an_error_is_closed(opened: list[FakeStore]) -> None:
    handles.keep_warm()
    with pytest.raises(RuntimeError), handles.store_for(ETCD):
        raise RuntimeError("store trouble")
    assert opened[0].closed
    assert use(ETCD) is opened[1]


def test_idle_handles_expire(opened: list[FakeStore], monkeypatch: pytest.MonkeyPatch) -> None:
    handles.keep_warm()
    a = use(ETCD)
    now = handles.time.monotonic()
    monkeypatch.setattr(handles.time, "monotonic", lambda: now + handles.IDLE_SECONDS + 1)
    b = use(ETCD)
    assert a is not b and a.closed


def test_concurrent_calls_get_distinct_handles(opened: list[FakeStore]) -> None:
    handles.keep_warm()
    with handles.store_for(ETCD) as a, handles.store_for(ETCD) as b:
        assert a is not b
    assert use(ETCD) in (a, b) and len(opened) == 2


def test_a_batch_keeps_its_own_handles_warm_while_the_calls_hold_theirs(opened: list[FakeStore]) -> None:
    """Calls waiting on a pool's batch hold their handles until answered: the batch's thread takes its
    handle from a lane of its own (BATCH), so it reuses the one it kept instead of opening another
    whenever the calls' lane is empty."""
    handles.keep_warm()
    with handles.store_for(ETCD, handles.BATCH) as first:
        pass
    with handles.store_for(ETCD) as call, handles.store_for(ETCD, handles.BATCH) as again:
        assert again is first and call is not first  # the call opened its own; the batch reused its
    with handles.store_for(ETCD) as call2:
        assert call2 is call  # a call gets the calls' lane back, never the batch's
    assert len(opened) == 2 and not any(s.closed for s in opened)
