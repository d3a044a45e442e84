"""Store factories for the contract suite. A new store joins the suite by adding one entry to FACTORIES:
a context manager that, given a temp dir, yields a `Factory`.

A Factory opens any number of handles onto ONE shared backend (`open()`; each handle is used by one
thread), and one handle onto a backend that cannot be reached (`unreachable()`: every method must raise
StoreUnavailable). Factories that need something the machine lacks raise pytest.skip with the reason.
TENANT_FACTORIES (the Kubernetes store on the session's real kube-apiserver) take the test's Tenant too."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from ipam.store.base import Store
from tests.kubeapi.factory import KUBE_FACTORIES, TENANT_FACTORIES


class Factory(Protocol):
    def open(self) -> Store: ...

    def unreachable(self) -> Store: ...


class _Memory:
    def __init__(self) -> None:
        from tests.memstore import Backend

        self.backend = Backend()

    def open(self) -> Store:
        from tests.memstore import MemoryStore

        return MemoryStore(self.backend)

    def unreachable(self) -> Store:
        from tests.memstore import Backend, MemoryStore

        return MemoryStore(Backend(down=True))


@contextlib.contextmanager
def memory(tmp: Path) -> Iterator[Factory]:
    yield _Memory()


class _Local:
    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "state" / "whereabouts.db"
        self.tmp = tmp

    def open(self) -> Store:
        from ipam.store.local import LocalStore

        return LocalStore(str(self.path))

    def unreachable(self) -> Store:
        from ipam.store.local import LocalStore

        blocker = self.tmp / "not-a-directory"
        blocker.write_text("")
        return LocalStore(str(blocker / "whereabouts.db"))


@contextlib.contextmanager
def local(tmp: Path) -> Iterator[Factory]:
    yield _Local(tmp)


@contextlib.contextmanager
def etcd(tmp: Path) -> Iterator[Factory]:
    """A real etcd (tests/etcdutil.py), one per test process; each test under its own key prefix."""
    from tests.etcdutil import etcd_factory

    yield etcd_factory(tmp)


FACTORIES: dict[str, Callable[[Path], AbstractContextManager[Factory]]] = {
    "memory": memory,
    "local": local,
    **KUBE_FACTORIES,  # "kubernetes-real": an outside cluster (PYCNI_TEST_KUBECONFIG)
    "etcd": etcd,
}

__all__ = ["FACTORIES", "TENANT_FACTORIES", "Factory"]
