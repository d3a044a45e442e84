"""Stores the concurrency tests run against. A store joins by adding one entry: a context manager that,
given a temp dir, yields a `Target`: the ipam keys that point a plugin process at the store, and a way
to open a handle for the checker. (Like tests/contract/factories.py, but for whole plugin processes.)
TENANT_TARGETS (the Kubernetes store on the session's real kube-apiserver) take the test's Tenant."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipam.store.base import Store
from tests.kubeup import Tenant


@dataclass(frozen=True)
class Target:
    ipam: dict[str, Any]  # merged into every ipam section
    open: Callable[[], Store]


@contextlib.contextmanager
def local(tmp: Path) -> Iterator[Target]:
    from ipam.store.local import LocalStore

    db = str(tmp / "state" / "whereabouts.db")
    yield Target({"datastore": "local", "local_db": db}, lambda: LocalStore(db))


def kubernetes(tenant: Tenant) -> AbstractContextManager[Target]:
    from tests.kubeapi.factory import concurrency_target  # the real kube-apiserver, a namespace per test

    return concurrency_target(tenant)


@contextlib.contextmanager
def etcd(tmp: Path) -> Iterator[Target]:
    """A real etcd started for the test (tests/etcdutil.py)."""
    from tests.etcdutil import etcd_target

    with etcd_target(tmp) as t:
        yield t


TARGETS: dict[str, Callable[[Path], AbstractContextManager[Target]]] = {
    "local": local,
    "etcd": etcd,
}
TENANT_TARGETS: dict[str, Callable[[Tenant], AbstractContextManager[Target]]] = {
    "kubernetes": kubernetes,
}

NAMES = sorted([*TARGETS, *TENANT_TARGETS])


@contextlib.contextmanager
def target_for(name: str, tmp: Path, request: Any) -> Iterator[Target]:
    """TARGETS[name] in `tmp`, or TENANT_TARGETS[name] in a fresh namespace of the session's real
    kube-apiserver (the `kube` fixture of tests/conftest.py, asked of the pytest `request`: skipped,
    saying why, where it cannot run)."""
    if name in TENANT_TARGETS:
        tenant = Tenant(request.getfixturevalue("kube"), tmp / "kube")
        with TENANT_TARGETS[name](tenant) as t:
            yield t
        return
    with TARGETS[name](tmp) as t:
        yield t
