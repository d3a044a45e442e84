"""The kubeconfigs pycni ships reach the API with the kube store: the one the installer writes on each
node (bundler/hostconf.py: server, CA file, tokenFile) and the reconciler's (its ConfigMap in
bundler/manifests/reconciler.yaml), against the TLS emulator with the service-account tokens."""

from __future__ import annotations

from pathlib import Path

import orjson
import yaml

from bundler import hostconf
from ipam import rbac
from ipam.store.base import Pool, PoolUpdate
from tests.kubeapi.emulator import MANIFESTS, SA_NAMESPACE, Emulator
from tests.kubeapi.factory import open_kube


def test_installer_kubeconfig(tls_emu: Emulator, pki: Path, tmp_path: Path) -> None:
    token = tmp_path / "sa-token"
    token.write_text("node-token")
    kube = hostconf.KubeSettings(tls_emu.url, SA_NAMESPACE, token, pki / "ca.crt")
    conf = hostconf.HostConf(str(tmp_path), "kubernetes", "node-1", kube)
    for rel, data in hostconf.desired(conf).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    flat = orjson.loads((tmp_path / hostconf.FLAT).read_bytes())
    store = open_kube(Path(flat["kubernetes"]["kubeconfig"]))
    try:
        store.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/24"), PoolUpdate())
        store.ping()
    finally:
        store.close()
    assert ("pycni-node", "create", "whereabouts.cni.cncf.io", "ippools") in tls_emu.calls


def test_reconciler_configmap_kubeconfig(tls_emu: Emulator, pki: Path, tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((MANIFESTS / "reconciler.yaml").read_text()))
    (cm,) = [d for d in docs if d and d["kind"] == "ConfigMap"]
    doc = yaml.safe_load(cm["data"]["kubeconfig"])
    # the pod's paths and in-cluster address, pointed at this test's files and emulator
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    assert cluster["server"] == "https://kubernetes.default.svc" and user["tokenFile"].endswith("/token")
    cluster.update(server=tls_emu.url, **{"certificate-authority": str(pki / "ca.crt")})
    (tmp_path / "token").write_text("reconciler-token")
    user["tokenFile"] = str(tmp_path / "token")
    path = tmp_path / "kubeconfig"
    path.write_bytes(orjson.dumps(doc))
    store = open_kube(path, role=rbac.RECONCILER)
    try:
        assert list(store.iter_pools()) == []
    finally:
        store.close()
    assert ("pycni-reconciler", "list", "whereabouts.cni.cncf.io", "ippools") in tls_emu.calls
