"""host-device driven by real libcni (the Go driver), with Debian's `static` as its IPAM: the device's
name, MTU, MAC, admin state and alias are the same after DEL as before ADD."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from tests.devlab import NIC_PCI, VF_PCIS, Lab, device_info, k8s_args
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO, Topology, plugin_command, sh


@pytest.fixture(scope="session")
def cnidriver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = REPO / ".venv" / "bin" / "cnidriver"
    if built.exists():
        return built
    out = tmp_path_factory.mktemp("driver") / "cnidriver"
    subprocess.run(["bash", str(REPO / "tests/e2e/driver/build.sh"), str(out)], check=True)
    return out


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Iterator[Path]:
    """A CNI_PATH entry whose host-device is ours (frozen bundle or source), ahead of Debian's."""
    d = tmp_path / "bin"
    d.mkdir()
    cmd = " ".join(plugin_command("host-device"))
    (d / "host-device").write_text(f"#!/bin/sh\nPYTHONPATH={PYTHONPATH} exec {cmd} \"$@\"\n")
    (d / "host-device").chmod(0o755)
    yield d


def drive(topo: Topology, driver: Path, plugin_dir: Path, cache: Path, verb: str, conflist: Path,
          netns: str, extra_env: dict[str, str] | None = None) -> tuple[int, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(CNI_PATH=f"{plugin_dir}:/usr/lib/cni", CNI_CACHE_DIR=str(cache), **(extra_env or {}))
    proc = subprocess.run(["ip", "netns", "exec", topo.host, str(driver), verb, str(conflist), "e2e1",
                           netns, "net1"], env=env, capture_output=True, check=False)
    out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, out


def device_state(topo: Topology, name: str) -> dict[str, Any] | None:
    link = topo.link(topo.host, name)
    if link is None:
        return None
    return {"name": link["ifname"], "mtu": link["mtu"], "mac": link["address"], "up": "UP" in link["flags"],
            "alias": link.get("ifalias", "")}


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0"])
def test_host_device_through_libcni(topo: Topology, tmp_path: Path, cnidriver: Path, plugin_dir: Path,
                                    version: str) -> None:
    nic = topo.add_uplink("nic")
    sh("ip", "-n", topo.host, "link", "set", "dev", nic, "mtu", "9000", "address", "02:5e:00:00:00:07",
       "alias", "rdma uplink")
    before = device_state(topo, nic)
    pod = topo.pod()
    conflist = tmp_path / "hd.conflist"
    conflist.write_bytes(jsonio.dumps({
        "cniVersion": version, "name": "hd-e2e",
        "plugins": [{"type": "host-device", "device": nic, "stateDir": str(tmp_path / "state"),
                     "ipam": {"type": "static",
                              "addresses": [{"address": "198.51.100.80/24", "gateway": "198.51.100.1"}],
                              "routes": [{"dst": "198.18.0.0/15"}]}}],
    }))
    cache = tmp_path / "cache"
    rc, out = drive(topo, cnidriver, plugin_dir, cache, "add", conflist, pod)
    assert rc == 0, out
    assert out["interfaces"][0]["name"] == "net1" and out["interfaces"][0]["mac"] == "02:5e:00:00:00:07"
    assert device_state(topo, nic) is None
    assert topo.addrs(pod, "net1") == ["198.51.100.80/24"]
    assert "198.18.0.0/15 via 198.51.100.1" in topo.ip(pod, "route")
    if version != "0.3.1":
        rc, out = drive(topo, cnidriver, plugin_dir, cache, "check", conflist, pod)
        assert rc == 0, out
    rc, out = drive(topo, cnidriver, plugin_dir, cache, "del", conflist, pod)
    assert rc == 0, out
    assert device_state(topo, nic) == before
    assert topo.link(pod, "net1") is None
    rc, out = drive(topo, cnidriver, plugin_dir, cache, "del", conflist, pod)  # again: still success
    assert rc == 0, out


def test_host_device_through_libcni_as_multus_with_its_dra_client(topo: Topology, tmp_path: Path,
                                                                  cnidriver: Path, plugin_dir: Path) -> None:
    """The config as Multus' DRA client hands a delegate to libcni (deviceID and pciBusID injected, the
    capabilities declared, their values as capability args: tests/integration/test_device_channels.py
    cites the upstream code): libcni itself turns them into runtimeConfig.deviceID and
    runtimeConfig.CNIDeviceInfoFile, and the device-info file is read (one naming another device is
    refused, code 7, nothing moved)."""
    (tmp_path / "lab").mkdir()
    lab = Lab(topo, tmp_path / "lab")
    before = device_state(topo, lab.nic)
    pod = topo.pod()
    conf = tmp_path / "hostdev.conf"
    conf.write_bytes(jsonio.dumps({
        "cniVersion": "1.0.0", "name": "hostdev", "type": "host-device",
        "capabilities": {"deviceID": True, "CNIDeviceInfoFile": True},
        "ipam": {"type": "static", "addresses": [{"address": "198.51.100.81/24"}]},
        "stateDir": str(lab.state_dir), "deviceID": NIC_PCI, "pciBusID": NIC_PCI}))
    env = {"PYCNI_SYSFS_ROOT": str(lab.sysfs), "PYCNI_AGENT": "off", "CNI_ARGS": k8s_args("ml", "worker-1")}

    def run(verb: str, info_pci: str) -> tuple[int, Any]:
        info = device_info(tmp_path / info_pci.replace(":", "-"), "hostdev", "net1", info_pci)
        caps = jsonio.dumps({"deviceID": NIC_PCI, "CNIDeviceInfoFile": info}).decode()
        return drive(topo, cnidriver, plugin_dir, tmp_path / "cache", verb, conf, pod,
                     {**env, "CAP_ARGS": caps})

    rc, out = run("add", VF_PCIS[0])
    assert rc == 1 and out["code"] == 7, out
    refusal = f'runtimeConfig.CNIDeviceInfoFile: "{VF_PCIS[0]}" disagrees with runtimeConfig.deviceID'
    assert refusal in out["msg"], out
    assert device_state(topo, lab.nic) == before and topo.link(pod, "net1") is None
    rc, out = run("add", NIC_PCI)
    assert rc == 0, out
    assert out["interfaces"][0]["name"] == "net1" and topo.addrs(pod, "net1") == ["198.51.100.81/24"]
    assert device_state(topo, lab.nic) is None
    rc, out = run("del", NIC_PCI)
    assert rc == 0, out
    assert device_state(topo, lab.nic) == before
