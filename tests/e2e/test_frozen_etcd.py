"""The frozen `whereabouts` on a real etcd (frozen pass: `make test` sets PYCNI_PLUGIN_DIR=dist/cni-bin):
the bundle carries ipam.store.etcd and what it needs (http.client, ssl), so ADD, DEL and the frozen
operator tool work over TLS with user/password auth. From source this runs too (python -m cni)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from tests import etcdutil
from tests.e2e import bundle_driver
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO, plugin_command

ENV = {
    "CNI_CONTAINERID": "f" * 64,
    "CNI_NETNS": "/run/netns/none",
    "CNI_IFNAME": "net1",
    "CNI_PATH": "/usr/lib/cni",
    "NODENAME": "node-1",
    "CNI_ARGS": "K8S_POD_NAMESPACE=frozen;K8S_POD_NAME=pod-1;K8S_POD_UID=uid-1",
}


def call(command: str, conf: dict[str, Any]) -> tuple[int, Any, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")} | ENV | {"CNI_COMMAND": command}
    if bundle_driver.frozen_dir() is None:
        env["PYTHONPATH"] = PYTHONPATH
    p = subprocess.run(
        plugin_command("whereabouts"), input=jsonio.dumps(conf), env=env, capture_output=True, timeout=120,
        check=False, cwd=REPO,
    )  # fmt: skip
    return p.returncode, jsonio.loads(p.stdout) if p.stdout.strip() else None, p.stderr.decode()


def ipam_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    frozen = bundle_driver.frozen_dir()
    cmd = [str(frozen / "pycni-ipam")] if frozen else ["python3", "-m", "ipam"]
    env = {**os.environ, "PYTHONPATH": PYTHONPATH} if frozen is None else dict(os.environ)
    if frozen is None:
        cmd[0] = sys.executable  # the virtualenv running the tests (a worktree has none of its own)
    return subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with etcdutil.running(certs_dir=tmp_path_factory.mktemp("certs"), auth=True) as e:
        yield e


def test_frozen_whereabouts_allocates_on_etcd_over_tls_with_auth(etcd: etcdutil.Etcd, tmp_path: Path) -> None:
    ipam = {**etcd.ipam(), "local_db": str(tmp_path / "state" / "w.db"), "configuration_path": str(tmp_path)}
    conf = {"cniVersion": "1.1.0", "name": "frozen-etcd", "type": "macvlan",
            "ipam": {"type": "whereabouts", "range": "198.51.100.0/28", **ipam}}  # fmt: skip
    rc, out, err = call("ADD", conf)
    assert rc == 0, (out, err)
    assert out["ips"][0]["address"] == "198.51.100.1/28"
    assert any(k.endswith(b"ippools/198.51.100.0-28") for k in etcd.keys(b"/pycni/"))
    rc, out, err = call("CHECK", conf)
    assert rc == 0, (out, err)
    ipam_file = tmp_path / "ipam.json"
    ipam_file.write_bytes(jsonio.dumps(ipam))
    tool = ipam_tool("--config", str(ipam_file), "pools")
    assert tool.returncode == 0 and "198.51.100.0-28" in tool.stdout and "1/14" in tool.stdout, tool
    rc, out, err = call("DEL", conf)
    assert rc == 0, (out, err)
    tool = ipam_tool("--config", str(ipam_file), "show", "198.51.100.0-28")
    assert tool.returncode == 0 and "198.51.100.1" not in tool.stdout, tool
