"""A real runtime: podman's CNI backend (Debian podman + runc, a busybox-static root filesystem) runs two
containers on a network served by pycni's macvlan (frozen in the frozen pass) with the IPAM: ours when
the registry has it, else Debian's host-local. Each container gets its address from the plugin, they
ping each other, and `podman rm` releases the addresses.

Podman runs inside the test's host namespace (nsenter --net only: its netns bind mounts must outlive one
podman invocation), with its own storage, runroot, network config dir and a default_network, so it never
touches the machine's podman state or falls back to its own bridge. runc needs explicit ulimits here."""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.registry import PLUGINS
from tests.e2e import bundle_driver
from tests.nsutil import Topology

NETWORK = "pycni-podman"
SUBNET = ipaddress.ip_network("198.51.100.0/24")
BUSYBOX = Path("/bin/busybox")


@dataclass
class Podman:
    topo: Topology
    tmp: Path
    short: Path  # podman refuses a runroot longer than 50 characters

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = ["nsenter", f"--net=/run/netns/{self.topo.host}", "podman", "--root", str(self.tmp / "root"),
               "--runroot", str(self.short / "rr"), "--storage-driver", "vfs", *args]
        env = {**os.environ, "CONTAINERS_CONF": str(self.tmp / "containers.conf")}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=timeout)

    def run(self, name: str) -> None:
        # every option before --rootfs DIR; explicit ulimits (runc cannot raise them in this sandbox)
        got = self("run", "-d", "--name", name, "--network", NETWORK, "--cap-add", "NET_RAW",
                   "--ulimit", "nproc=1024:1024", "--ulimit", "nofile=1024:1024",
                   "--rootfs", str(self.tmp / "rootfs"), "sleep", "600")
        assert got.returncode == 0, got.stderr

    def address(self, name: str) -> ipaddress.IPv4Interface:
        out = self("exec", name, "ip", "-4", "-o", "addr", "show", "eth0")
        assert out.returncode == 0, out.stderr
        return ipaddress.IPv4Interface(out.stdout.split("inet ")[1].split()[0])


def network(topo: Topology, tmp: Path) -> dict[str, Any]:
    ipam: dict[str, Any] = {"type": "host-local", "dataDir": str(tmp / "host-local"),
                            "ranges": [[{"subnet": str(SUBNET)}]]}
    if "whereabouts" in PLUGINS:
        ipam = {"type": "whereabouts", "datastore": "local", "local_db": str(tmp / "pycni.db"),
                "range": str(SUBNET)}
    return {"cniVersion": "1.0.0", "name": NETWORK, "plugins": [
        {"type": "macvlan", "master": topo.uplink, "mode": "bridge", "logLevel": "info",
         "logFile": str(tmp / "macvlan.log"), "ipam": ipam}]}


def containers_conf(plugin_dir: Path, tmp: Path) -> str:
    return f"""[containers]
default_ulimits = ["nproc=1024:1024", "nofile=1024:1024"]
[network]
network_backend = "cni"
cni_plugin_dirs = ["{plugin_dir}", "{bundle_driver.REFERENCE}"]
network_config_dir = "{tmp / 'net.d'}"
default_network = "{NETWORK}"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{tmp / 'events.log'}"
tmp_dir = "{tmp / 'podman-tmp'}"
"""


@pytest.fixture
def podman(topo: Topology, tmp_path: Path) -> Iterator[Podman]:
    for tool in ("podman", "runc", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing: bash .ci/apt-deps installs it")
    rootfs = tmp_path / "rootfs"
    for d in ("bin", "proc", "sys", "dev", "etc", "tmp"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for applet in ("sh", "ip", "ping", "sleep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    (tmp_path / "net.d").mkdir()
    (tmp_path / "net.d" / f"{NETWORK}.conflist").write_bytes(jsonio.dumps(network(topo, tmp_path)))
    (tmp_path / "containers.conf").write_text(containers_conf(bundle_driver.plugin_dir(tmp_path), tmp_path))
    p = Podman(topo, tmp_path, Path(tempfile.mkdtemp(prefix="pycni-pm-")))
    try:
        yield p
    finally:
        p("rm", "-f", "-t", "0", "--all")
        shutil.rmtree(p.short, ignore_errors=True)


def held_by_ipam(tmp: Path) -> int | None:
    """Addresses host-local holds (None for our IPAM: its release is checked by reuse)."""
    d = tmp / "host-local" / NETWORK
    return len([f for f in d.iterdir() if f.name[0].isdigit()]) if d.exists() else None


def test_podman_containers_get_addresses_from_pycni_and_ping(podman: Podman, tmp_path: Path) -> None:
    podman.run("c1")
    podman.run("c2")
    a1, a2 = podman.address("c1"), podman.address("c2")
    assert a1.ip in SUBNET and a2.ip in SUBNET and a1 != a2
    log = (tmp_path / "macvlan.log").read_text()
    assert log.count(": macvlan on ") == 2, "the addresses came through pycni's macvlan"
    ping = podman("exec", "c1", "ping", "-c", "2", "-W", "2", str(a2.ip), timeout=30)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    ours = "whereabouts" in PLUGINS
    assert held_by_ipam(tmp_path) == (None if ours else 2)
    rm = podman("rm", "-f", "-t", "0", "c1", "c2")
    assert rm.returncode == 0, rm.stderr
    podman.run("c3")
    a3 = podman.address("c3")
    if ours:  # lowest free address: the first one is free again
        assert a3 == min(a1, a2, key=lambda a: a.ip), "podman rm released the addresses"
    else:
        assert held_by_ipam(tmp_path) == 1, "podman rm released both addresses; c3 holds one"
