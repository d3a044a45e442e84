"""Kubernetes store factories for the contract suite (tests/contract/factories.py) and the helpers the
other Kubernetes tests share.

- "kubernetes": the session's real kube-apiserver (tests/kubeup.py), a fresh namespace per test
  (`Tenant`: bundler/manifests/rbac.yaml applied as shipped), the node ServiceAccount's token, small
  list pages so paging is exercised.
- "kubernetes-real": a real cluster from PYCNI_TEST_KUBECONFIG (cluster-admin: the fixture installs
  the CRDs from bundler/manifests/crds if missing and runs every test in a fresh namespace it deletes
  afterwards). Skipped, saying so, when the variable is unset."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

from cni.types import valueclass
from ipam import rbac
from ipam.kubeapi import ApiError, Client, load_kubeconfig
from ipam.store.base import Store
from ipam.store.kube import KubeStore
from tests.kubeapi.emulator import CRDS, free_port
from tests.kubeup import Tenant
from tests.skips import NO_OUTSIDE_CLUSTER, OUTSIDE_CLUSTER_ENV

REAL_ENV = OUTSIDE_CLUSTER_ENV
PAGE = 16  # objects per list page in the tests: small, so iter_* pages


def unreachable_kubeconfig(tmp: Path) -> Path:
    """A kubeconfig pointing at a port nothing listens on."""
    emu_like = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "c",
        "clusters": [{"name": "x", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
        "users": [{"name": "u", "user": {"token": "node-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "x", "user": "u", "namespace": "ns"}}],
    }
    path = tmp / "unreachable.kubeconfig"
    path.write_text(yaml.safe_dump(emu_like))
    path.chmod(0o600)
    return path


def open_kube(kubeconfig: Path, role: str = rbac.NODE, namespace: str = "", page: int = PAGE) -> KubeStore:
    conf = load_kubeconfig(str(kubeconfig))
    if namespace:
        conf = valueclass.replace(conf, namespace=namespace)
    return KubeStore(Client(conf), conf.namespace, role=role, page=page)


class TenantFactory:
    """Handles onto one tenant namespace of the real server, as the node."""

    def __init__(self, tenant: Tenant, tmp: Path) -> None:
        self.tenant, self.tmp = tenant, tmp
        self.kubeconfig = tenant.node

    def open(self) -> Store:
        return open_kube(self.kubeconfig)

    def unreachable(self) -> Store:
        return open_kube(unreachable_kubeconfig(self.tmp))


@contextlib.contextmanager
def tenant_factory(tenant: Tenant, tmp: Path) -> Iterator[TenantFactory]:
    yield TenantFactory(tenant, tmp)


class RealFactory:
    def __init__(self, tmp: Path, kubeconfig: Path, namespace: str) -> None:
        self.tmp, self.kubeconfig, self.namespace = tmp, kubeconfig, namespace

    def open(self) -> Store:
        return open_kube(self.kubeconfig, namespace=self.namespace)

    def unreachable(self) -> Store:
        return open_kube(unreachable_kubeconfig(self.tmp))


def ensure_crds(client: Client) -> None:
    """Install the bundled CRDs if the cluster lacks them, and wait until they are served."""
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            crd_path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{doc['metadata']['name']}"
            try:
                client.request("GET", crd_path)
            except ApiError as e:
                if e.status != 404:
                    raise
                client.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)


def _served(client: Client, namespace: str) -> bool:
    try:
        client.request("GET", f"/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{namespace}/ippools")
        return True
    except ApiError:
        return False


@contextlib.contextmanager
def real_cluster(tmp: Path) -> Iterator[RealFactory]:
    import pytest

    source = os.environ.get(REAL_ENV)
    if not source:
        pytest.skip(NO_OUTSIDE_CLUSTER)
    client = Client(load_kubeconfig(source))
    try:
        ensure_crds(client)
        ns: dict[str, Any] = client.request(
            "POST",
            "/api/v1/namespaces",
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"generateName": "pycni-test-"},
            },
        )
        namespace = ns["metadata"]["name"]
        deadline = time.monotonic() + 60
        try:
            while not _served(client, namespace):
                assert time.monotonic() < deadline, f"the CRDs are not served in {namespace} after 60 s"
                time.sleep(0.5)
            yield RealFactory(tmp, Path(source), namespace)
        finally:
            with contextlib.suppress(Exception):
                client.request("DELETE", f"/api/v1/namespaces/{namespace}")
    finally:
        client.close()


# factories on the session's real server: they take the test's Tenant (tests/conftest.py `tenant`)
TENANT_FACTORIES: dict[str, Callable[[Tenant, Path], AbstractContextManager[Any]]] = {
    "kubernetes": tenant_factory,
}
KUBE_FACTORIES: dict[str, Callable[[Path], AbstractContextManager[Any]]] = {
    "kubernetes-real": real_cluster,  # an outside cluster (PYCNI_TEST_KUBECONFIG)
}


@contextlib.contextmanager
def concurrency_target(tenant: Tenant) -> Iterator[Any]:
    """tests/concurrency/stores.py's target: plugin processes reach the real server through the node
    ServiceAccount's kubeconfig, in the test's tenant namespace."""
    from tests.concurrency.stores import Target

    ipam = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)},
            "local_db": str(tenant.node.parent / "state" / "whereabouts.db")}  # node-local state in tmp
    yield Target(ipam, lambda: open_kube(tenant.node, page=100))


class CountingClient(Client):
    """A Client that counts the requests it sends (method, path): the tests wrap the client the code
    is given rather than asking the server, which keeps no per-client figures."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[str, str]] = []
        self.queries: list[dict[str, Any] | None] = []  # each request's query, in the order of `sent`

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        self.sent.append((method, path))
        self.queries.append(query)
        return super().request(method, path, body, query, content_type)


def counting_store(
    kubeconfig: Path, role: str = rbac.NODE, page: int = PAGE
) -> tuple[KubeStore, CountingClient]:
    conf = load_kubeconfig(str(kubeconfig))
    client = CountingClient(conf)
    return KubeStore(client, conf.namespace, role=role, page=page), client
