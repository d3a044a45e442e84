"""Uninstall as bundler/README.md says (and docs/install.md tells an operator): `--uninstall` added to
the installer's command, the rollout awaited (the installer removes exactly what it installed and puts
back what it displaced: the node's own macvlan), then `kubectl delete -k`. The node's CNI directories
are then as they were before the last install, file for file: the kit's node, or, after test_migration.py,
the upstream whereabouts node pycni replaced there (upstream's binary, flat file and kubeconfig put back).
Runs last (it removes the install)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bundle_layouts import snapshot
from tests.cluster import kubenode
from tests.cluster.conftest import Installed


def test_uninstall_leaves_the_node_cni_dirs_as_they_were(installed: Installed) -> None:
    node = installed.cluster
    assert snapshot(node.cni_bin_dir) != installed.before["CNI_BIN_DIR"]  # installed: it did change them
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/command/-", "value": "--uninstall"}]
    node.kubectl("-n", kubenode.NS, "patch", "daemonset", "pycni-node", "--type=json",
                 "-p", json.dumps(patch))
    node.kubectl("-n", kubenode.NS, "rollout", "status", "daemonset/pycni-node", "--timeout=300s",
                 timeout=330)
    # waits until every object is gone, the namespace (and with it the pods) included
    node.kubectl("delete", "-k", str(installed.overlay), "--wait=true", "--timeout=300s", timeout=330)
    assert node.kubectl("get", "namespace", kubenode.NS, check=False).returncode != 0
    after = {d: snapshot(Path(node.env[d])) for d in ("CNI_BIN_DIR", "CNI_CONF_DIR")}
    assert after == installed.before
