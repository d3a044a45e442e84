"""Import cost is latency: which modules each path through `python -m cni macvlan` imports
(from `python -X importtime`). The ADD paths run in a private user + network namespace
(`unshare -rn`), so they need no root and touch nothing outside."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio

FULL_PYROUTE2 = ("pyroute2", "pyroute2.iproute", "pyroute2.ndb", "asyncio", "pyroute2.netlink.nlsocket")
# Never on a macvlan call: dataclasses (and the inspect it imports) is replaced by cni.types.valueclass;
# multiprocessing and platform came with pyroute2.config (pyroute2 is no longer a runtime dependency).
# prometheus_client (and cni.exporter, its only importer) belong to the agent and the reconciler.
PER_CALL_NEVER = ("dataclasses", "inspect", "multiprocessing", "platform", "pyroute2.config",
                  "prometheus_client", "cni.exporter")
ENV_ADD = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth1", "CNI_PATH": "/usr/lib/cni"}


def modules(stderr: str) -> list[str]:
    """Module names from -X importtime lines ('import time: self | cumulative | name')."""
    return [
        line.rsplit("|", 1)[1].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    ]


def plugin(
    env: dict[str, str], conf: dict[str, Any] | None, prefix: tuple[str, ...] = ()
) -> tuple[Any, list[str]]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")} | env
    p = subprocess.run(
        [*prefix, sys.executable, "-X", "importtime", "-m", "cni", "macvlan"],
        input=jsonio.dumps(conf) if conf is not None else b"",
        env=full,
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = jsonio.loads(p.stdout) if p.stdout.strip() else None
    return out, modules(p.stderr.decode())


def no_pyroute2(mods: list[str]) -> None:
    assert [m for m in mods if m.startswith("pyroute2")] == []


def test_version_imports_nothing_heavy() -> None:
    out, mods = plugin({"CNI_COMMAND": "VERSION"}, None)
    assert out["supportedVersions"]
    no_pyroute2(mods)
    for heavy in ("cni.plugins.macvlan", "subprocess", "asyncio", "logging", "typing", *PER_CALL_NEVER):
        assert heavy not in mods


@pytest.mark.parametrize(
    ("conf", "code"),
    [
        ({"cniVersion": "1.0.0", "name": "bad name", "type": "macvlan"}, 7),  # rejected by skel
        ({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mode": "bogus"}, 7),  # by macvlan
        ({"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "mtu": "9000"}, 7),
        ({"cniVersion": "9.9.9", "name": "n", "type": "macvlan"}, 1),
    ],
)
def test_config_errors_do_not_import_pyroute2(conf: dict[str, Any], code: int) -> None:
    out, mods = plugin({**ENV_ADD, "CNI_NETNS": "/run/netns/pycni-unit-absent"}, conf)
    assert out["code"] == code, out
    no_pyroute2(mods)


def userns_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True, check=False).returncode == 0


needs_userns = pytest.mark.skipif(
    not userns_available(), reason="unshare -rn (an unprivileged user + network namespace) is not available"
)


def add_in_private_netns(conf: dict[str, Any]) -> tuple[Any, list[str]]:
    """ADD with CNI_NETNS = the plugin's own (private) namespace, master a veth made there."""
    setup = 'ip link add va type veth peer name vb && ip link set va up && ip link set vb up && exec "$@"'
    prefix = ("unshare", "-rn", "sh", "-c", setup, "sh")
    env = {**ENV_ADD, "CNI_NETNS": "/proc/self/ns/net", "CNI_NETNS_OVERRIDE": "1"}
    return plugin(env, conf, prefix)


@needs_userns
def test_add_l2_speaks_netlink_without_pyroute2() -> None:
    out, mods = add_in_private_netns({"cniVersion": "1.1.0", "name": "n", "type": "macvlan", "master": "va"})
    assert out["interfaces"][0]["name"] == "eth1", out
    assert "cni.netlink.nla" in mods  # netlink was spoken, without pyroute2
    assert [m for m in mods if m.startswith("pyroute2")] == []
    for name in (*FULL_PYROUTE2, *PER_CALL_NEVER):
        assert name not in mods


@needs_userns
@pytest.mark.skipif(
    not Path("/usr/lib/cni/host-local").exists(), reason="Debian's host-local is not installed"
)
def test_add_with_ipam_speaks_netlink_without_pyroute2(tmp_path: Path) -> None:
    ipam = {
        "type": "host-local",
        "dataDir": str(tmp_path),
        "ranges": [[{"subnet": "198.51.100.0/24"}], [{"subnet": "2001:db8:7::/64"}]],
        "routes": [{"dst": "198.18.0.0/15"}],
    }
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan", "master": "va", "dad": "off", "ipam": ipam}
    out, mods = add_in_private_netns(conf)
    assert [ip["address"].split("/")[1] for ip in out["ips"]] == ["24", "64"], out
    assert "cni.netlink.nla" in mods and "cni.netlink.routes" in mods and "cni.netlink.addrs" in mods
    assert [m for m in mods if m.startswith("pyroute2")] == []
    for name in (*FULL_PYROUTE2, *PER_CALL_NEVER, "logging"):
        assert name not in mods


@needs_userns
def test_the_vf_seam_reads_a_pf_without_pyroute2() -> None:
    """NetlinkVf.read against the kernel (a veth as the PF: it has no VFs) speaks netlink through
    cni.netlink.vfinfo, and nothing imports pyroute2."""
    setup = "ip link add va type veth peer name vb && exec \"$@\""
    code = ("from cni.sriov.vf import NetlinkVf\n"
            "try:\n    NetlinkVf().read('va', 0)\nexcept Exception as e:\n    print(e)")
    p = subprocess.run(["unshare", "-rn", "sh", "-c", setup, "sh", sys.executable, "-X", "importtime", "-c",
                        code], capture_output=True, text=True, timeout=60, check=False,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert p.stdout.strip() == "PF va: reports no VF 0 (the driver exposes no SR-IOV VF settings)", p.stderr
    mods = modules(p.stderr)
    assert "cni.netlink.vfinfo" in mods
    no_pyroute2(mods)
    for name in (*FULL_PYROUTE2, "multiprocessing", "platform", "prometheus_client"):
        assert name not in mods  # (dataclasses is there: cni.sriov.vf uses it)
