"""The whereabouts IPAM on the Kubernetes store, run as a runtime runs it: from source in the first pass
of `make test`, the frozen bundle's entries in the second (PYCNI_PLUGIN_DIR=dist/cni-bin), so the
bundle is known to carry ipam.store.kube, ipam.kubeapi, ipam.kubepods and the parts of the kubernetes
client they load (bare packages, no package __init__). Against the session's real kube-apiserver
(tests/kubeup.py), as the node ServiceAccount of a fresh namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cni import jsonio
from tests.kubeapi.factory import open_kube
from tests.kubeup import Tenant
from tests.logtee import PYTHONPATH
from tests.nsutil import plugin_command

CID = "fe" * 32
ENV = {
    "CNI_CONTAINERID": CID,
    "CNI_NETNS": "/run/netns/none",
    "CNI_IFNAME": "net1",
    "CNI_PATH": "/usr/lib/cni",
    "NODENAME": "node-e2e",
    "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=kube-pod;K8S_POD_UID=uid-kube",
}


def run(cmd: list[str], env: dict[str, str], stdin: bytes) -> tuple[int, Any, str]:
    full = {**os.environ, **env, "PYTHONPATH": PYTHONPATH}
    p = subprocess.run(cmd, input=stdin, env=full, capture_output=True, timeout=120, check=False)
    out = p.stdout.decode()
    return p.returncode, jsonio.loads(out) if out.startswith("{") else out, p.stderr.decode()


def test_whereabouts_allocates_on_the_kube_store(tenant: Tenant, tmp_path: Path) -> None:
    kubeconfig = tenant.node
    flat = tmp_path / "whereabouts.conf"
    flat.write_text(
        jsonio.dumps({"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)},
                      "local_db": str(tmp_path / "state" / "whereabouts.db")}).decode()
    )
    conf = {
        "cniVersion": "1.1.0",
        "name": "kube-e2e",
        "type": "macvlan",
        "ipam": {"type": "whereabouts", "range": "198.51.100.0/28", "configuration_path": str(flat)},
    }
    data = jsonio.dumps(conf)
    rc, out, err = run(plugin_command("whereabouts"), {**ENV, "CNI_COMMAND": "ADD"}, data)
    assert rc == 0, (out, err)
    assert [ip["address"] for ip in out["ips"]] == ["198.51.100.1/28"]
    assert run(plugin_command("whereabouts"), {**ENV, "CNI_COMMAND": "CHECK"}, data)[0] == 0
    store = open_kube(kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-28")
        assert pool is not None and pool.allocations["1"].podref == "e2e/kube-pod"
        assert store.get_reservation("198.51.100.1") is not None
    finally:
        store.close()
    # the operator tool of the same bundle reads the same store
    bindir = os.environ.get("PYCNI_PLUGIN_DIR")
    tool = [os.path.join(bindir, "pycni-ipam")] if bindir else [sys.executable, "-m", "ipam"]
    rc, table, err = run([*tool, "--config", str(flat), "pools"], {}, b"")
    assert rc == 0 and "198.51.100.0-28" in table and "1/14" in table, (table, err)
    rc, out, err = run(plugin_command("whereabouts"), {**ENV, "CNI_COMMAND": "DEL"}, data)
    assert rc == 0, (out, err)
    store = open_kube(kubeconfig)
    try:
        pool = store.get_pool("198.51.100.0-28")
        assert pool is not None and dict(pool.allocations) == {}
        assert list(store.iter_reservations()) == []
    finally:
        store.close()
    assert list(tenant.pools()) == ["198.51.100.0-28"]  # on the server, in the node's namespace
