"""The reconciler's metrics on the Kubernetes store: `pycni-ipam reconcile --pods kubernetes --interval`
as the Deployment runs it (its own ServiceAccount, rbac.yaml as shipped), on the session's real
kube-apiserver, scraped over HTTP: the pool's size and use after it freed a gone pod's address, with
no request beyond what the reconciler makes anyway (the server refuses none)."""

from __future__ import annotations

from pathlib import Path

from cni import jsonio
from tests.kubeapi.test_plugin_kube import call, conf_for, forbidden_count, pods_of
from tests.kubeup import Tenant
from tests.unit.test_metrics import reconciler_scraped, value


def test_reconciler_exports_kube_pools(tenant: Tenant, tmp_path: Path) -> None:
    refused = forbidden_count(tenant.server)
    p1, p2, _ = pods_of(tenant)
    conf = conf_for(tenant.node, tmp_path, range="198.51.100.0/29")
    uid1 = tenant.create_pod("pod-1")["metadata"]["uid"]
    assert call("ADD", conf, p1, uid=uid1)[0] == 0
    assert call("ADD", conf, p2)[0] == 0  # pod-2 never exists: freed by the first run
    ipam_file = tmp_path / "ipam.json"
    ipam_file.write_bytes(jsonio.dumps({"datastore": "kubernetes",
                                        "kubernetes": {"kubeconfig": str(tenant.reconciler)},
                                        "configuration_path": str(tmp_path / "whereabouts.conf")}))
    args = ["--config", str(ipam_file), "reconcile", "--pods=kubernetes"]
    with reconciler_scraped(args, 0.5, 120) as got:
        assert (value(got, "pycni_reconcile_runs_total", result="ok") or 0) >= 1, got
        assert value(got, "pycni_ipam_pool_size", store="kubernetes", pool="198.51.100.0-29") == 6
        assert value(got, "pycni_ipam_pool_used", store="kubernetes", pool="198.51.100.0-29") == 1
        assert value(got, "pycni_reconcile_freed_total", kind="allocation") == 1
        assert value(got, "pycni_reconcile_freed_total", kind="reservation") == 1
        assert value(got, "pycni_reconcile_runs_total", result="error") is None
    assert forbidden_count(tenant.server) == refused
