"""The kubeconfigs pycni ships reach the API with the kube store: the one the installer writes on each
node (bundler/hostconf.py: server, CA file, tokenFile) and the reconciler's (its ConfigMap in
bundler/manifests/reconciler.yaml), against the session's real kube-apiserver with the ServiceAccount
tokens of a tenant namespace (bundler/manifests/rbac.yaml as shipped)."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

from bundler import hostconf
from ipam import rbac
from ipam.model import Pool, PoolUpdate
from tests.kubeapi.emulator import MANIFESTS
from tests.kubeapi.factory import open_kube
from tests.kubeup import NODE_SA, RECONCILER_SA, Tenant


def test_installer_kubeconfig(tenant: Tenant, tmp_path: Path) -> None:
    server = tenant.server
    token = tmp_path / "sa-token"
    token.write_text(server.token(tenant.namespace, NODE_SA))
    kube = hostconf.KubeSettings(server.url, tenant.namespace, token, Path(server.ca_file))
    conf = hostconf.HostConf(str(tmp_path / "host"), "kubernetes", "node-1", kube)
    for rel, data in hostconf.desired(conf).items():
        (tmp_path / "host" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "host" / rel).write_bytes(data)
    flat = orjson.loads((tmp_path / "host" / hostconf.FLAT).read_bytes())
    store = open_kube(Path(flat["kubernetes"]["kubeconfig"]))
    try:
        store.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/24"), PoolUpdate())
        store.ping()
    finally:
        store.close()
    assert tenant.pools() == {"198.51.100.0-24": {}}  # created as the node, in the node's namespace


def test_reconciler_configmap_kubeconfig(tenant: Tenant, tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((MANIFESTS / "reconciler.yaml").read_text()))
    (cm,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    doc = yaml.safe_load(cm["data"]["kubeconfig"])
    # the pod's paths and in-cluster address, pointed at this test's files and server
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    assert cluster["server"] == "https://kubernetes.default.svc" and user["tokenFile"].endswith("/token")
    server = tenant.server
    cluster.update(server=server.url, **{"certificate-authority": server.ca_file})
    (tmp_path / "token").write_text(server.token(tenant.namespace, RECONCILER_SA))
    user["tokenFile"] = str(tmp_path / "token")
    for context in doc["contexts"]:  # the ConfigMap names the shipped namespace
        context["context"]["namespace"] = tenant.namespace
    path = tmp_path / "kubeconfig"
    path.write_bytes(orjson.dumps(doc))
    store = open_kube(path, role=rbac.RECONCILER)
    try:
        assert list(store.iter_pools()) == []
        node = open_kube(tenant.node)
        try:
            node.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/24"), PoolUpdate())
        finally:
            node.close()
        assert [p.name for p in store.iter_pools()] == ["198.51.100.0-24"]
    finally:
        store.close()
