"""The kubeconfigs pycni ships reach the API with the kube store: the one the installer writes on each
node (bundler/hostconf.py: server, CA file, tokenFile) and the reconciler's (in-cluster, as its
ConfigMap in bundler/manifests/reconciler.yaml says), against the session's real kube-apiserver with
the ServiceAccount tokens of a tenant namespace (bundler/manifests/rbac.yaml as shipped)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import orjson
import yaml

from bundler import hostconf
from ipam import kubeapi, rbac
from ipam.config import store_config
from ipam.model import Pool, PoolUpdate
from ipam.store.kube import KubeStore
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


def test_reconciler_configmap_in_cluster(tenant: Tenant, tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((MANIFESTS / "reconciler.yaml").read_text()))
    (cm,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    ipam = orjson.loads(cm["data"]["ipam.json"])
    assert ipam["kubernetes"]["kubeconfig"] == kubeapi.IN_CLUSTER  # no DNS name, no file of our own
    conf = store_config(ipam)
    # the pod's ServiceAccount directory and Service environment, as this test's files and server
    server = tenant.server
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(server.token(tenant.namespace, RECONCILER_SA))
    (sa / "ca.crt").write_bytes(Path(server.ca_file).read_bytes())
    (sa / "namespace").write_text(tenant.namespace)
    url = urlsplit(server.url)
    env = {"KUBERNETES_SERVICE_HOST": str(url.hostname), "KUBERNETES_SERVICE_PORT": str(url.port)}
    kube = kubeapi.in_cluster_config(env, str(sa))
    assert conf.kubernetes.kubeconfig == kube.path
    store = KubeStore(kubeapi.Client(kube), kube.namespace, role=rbac.RECONCILER)
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
