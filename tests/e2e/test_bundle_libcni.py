"""An ADD/CHECK/DEL cycle through real libcni against pycni's entries (frozen in the frozen pass), chained
with Debian's host-local IPAM; and VERSION of every plugin as libcni asks it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cni import jsonio, spec
from cni.registry import PLUGINS
from tests.e2e import bundle_driver
from tests.nsutil import Topology


def conflist(topo: Topology, tmp: Path, version: str) -> dict[str, object]:
    return {"cniVersion": version, "name": "e2e-bundle", "plugins": [
        {"type": "macvlan", "master": topo.uplink, "mode": "bridge",
         "ipam": {"type": "host-local", "dataDir": str(tmp / "ipam"),
                  "ranges": [[{"subnet": "198.51.100.0/24", "gateway": "198.51.100.1"}]]}}]}


def test_add_check_del_through_libcni(topo: Topology, tmp_path: Path) -> None:
    pod = topo.pod()
    conf = conflist(topo, tmp_path, "1.0.0")
    add = bundle_driver.drive(topo, "add", conf, tmp_path, netns=pod)
    assert add.ok, (add.out, add.stderr)
    address = add.out["ips"][0]["address"]
    assert address.startswith("198.51.100.") and topo.addrs(pod, "net1") == [address]
    check = bundle_driver.drive(topo, "check", conf, tmp_path, netns=pod)
    assert check.ok, (check.out, check.stderr)
    delete = bundle_driver.drive(topo, "del", conf, tmp_path, netns=pod)
    assert delete.ok, (delete.out, delete.stderr)
    assert topo.link(pod, "net1") is None
    assert not any(p.name.startswith("198.51.100.") for p in (tmp_path / "ipam" / "e2e-bundle").iterdir())


def test_version_of_every_plugin_through_libcni(tmp_path: Path) -> None:
    bundle_driver.require_driver()
    env = {"CNI_PATH": str(bundle_driver.plugin_dir(tmp_path)), "PATH": "/usr/bin:/bin"}
    for name in PLUGINS:
        proc = subprocess.run([str(bundle_driver.DRIVER), "version", name], env=env, capture_output=True,
                              check=False, timeout=60)
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
        assert set(jsonio.loads(proc.stdout)["supportedVersions"]) == set(spec.SUPPORTED), name
