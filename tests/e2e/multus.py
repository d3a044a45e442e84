"""One node for Multus (the v4.3.0 thin plugin, ../shared/upstream) delegating to pycni's plugins, called as
a runtime calls it: through libcni (the driver), with the kubelet's CNI_ARGS, against the real
kube-apiserver (tests/e2e/test_multus.py, tests/e2e/test_netop_multus.py).

The Pod carries the `k8s.v1.cni.cncf.io/networks` annotation; its devices come from the kubelet
device-plugin checkpoint Multus reads (a fixed path: /var/lib is the test's own directory in a private
mount namespace, tests/e2e/node.py), naming PCI addresses of a fake sysfs (tests/devlab.py) whose netdevs
are veth ends. With `cni_conf_dir` the node's /etc/cni/net.d is the test's own directory too (the IPAM's
flat file). The cluster network is Debian's ptp + host-local. Multus itself uses an admin kubeconfig (it
is not our product); every directory it can be given (confDir, cniDir, binDir, logFile) is in tmp_path."""

from __future__ import annotations

import ipaddress
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.registry import PLUGINS
from tests import kubeup
from tests.devlab import Lab
from tests.e2e import bundle_driver
from tests.e2e.node import Node
from tests.logtee import PYTHONPATH
from tests.nsutil import Call, Topology
from tests.skips import SOURCE_ONLY

NETWORKS = "k8s.v1.cni.cncf.io/networks"
STATUS = "k8s.v1.cni.cncf.io/network-status"
CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
DEVICES = "/var/lib/cni/pycni/devices"  # the device plugins' default stateDir (the NADs set none)
CLUSTER_NET = "198.18.200.0/24"


@dataclass
class Pod:
    name: str
    uid: str
    netns: str
    sandbox: str


class MultusNode:
    """One node: the lab's host namespace and sysfs, a Multus config, a runtime cache, the checkpoint."""

    def __init__(self, lab: Lab, tenant: kubeup.Tenant, tmp: Path, plugin_dir: Path,
                 cni_conf_dir: Path | None = None) -> None:
        self.lab, self.tenant, self.tmp = lab, tenant, tmp
        self.node = Node(tmp / "node", cni_conf_dir)
        # the node's /opt/cni/bin: Multus and our plugins (frozen entries or source shims); Debian's
        # ptp and host-local come from the runtime's CNI_PATH
        self.bin = tmp / "cni-bin"
        self.bin.mkdir()
        (self.bin / "multus").symlink_to(kubeup.unpack("multus") / "multus")
        for plugin in PLUGINS:
            (self.bin / plugin).symlink_to(plugin_dir / plugin)
        self.cni_path = f"{self.bin}:{bundle_driver.REFERENCE}"
        self.log = tmp / "multus.log"
        self.conf = tmp / "multus.conf"
        self.conf.write_bytes(jsonio.dumps({
            "cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus",
            "kubeconfig": str(tenant.admin_kubeconfig),
            "confDir": str(tmp / "multus-conf.d"), "cniDir": str(tmp / "multus-cache"),
            "binDir": str(self.bin), "logFile": str(self.log), "logLevel": "debug",
            "delegates": [{
                "cniVersion": "0.3.1", "name": "cluster",
                "plugins": [{"type": "ptp", "ipMasq": False,
                             "ipam": {"type": "host-local", "subnet": CLUSTER_NET,
                                      "dataDir": str(tmp / "host-local")}}],
            }],
        }))
        (tmp / "multus-conf.d").mkdir()
        self.pods: list[str] = []

    def with_seams(self, plugin: str, *options: str) -> None:
        """`plugin` in the node's bin dir runs from source through tests/launch.py with `options` (the
        recording VF seam): only the source pass can (`source_only`)."""
        assert bundle_driver.frozen_dir() is None, "a test that needs seams is marked source_only"
        entry = self.bin / plugin
        entry.unlink()
        entry.write_text(f'#!/bin/sh\nPYTHONPATH="{PYTHONPATH}" exec "{sys.executable}" -m tests.launch '
                         f'{shlex.join(options)} -- {plugin}\n')
        entry.chmod(0o755)

    def checkpoint(self, entries: list[tuple[str, str, list[str]]]) -> None:
        """The kubelet's device-plugin checkpoint: (pod UID, resource, device IDs) per entry."""
        path = self.node.path(CHECKPOINT)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"Data": {
            "PodDeviceEntries": [{"PodUID": uid, "ContainerName": "c", "ResourceName": res,
                                  "DeviceIDs": {"-1": ids}, "AllocResp": ""} for uid, res, ids in entries],
            "RegisteredDevices": {res: ids for _, res, ids in entries}}, "Checksum": 0}))

    def pod(self, name: str, networks: str) -> Pod:
        obj = self.tenant.create_pod(name, annotations={NETWORKS: networks})
        self.pods.append(name)
        netns = self.lab.topo.pod(f"m{len(self.pods)}")
        return Pod(name, obj["metadata"]["uid"], netns, f"sandbox{len(self.pods):02d}" + "0" * 54)

    def run(self, verb: str, pod: Pod) -> Call:
        env = self.node.env({k: v for k, v in os.environ.items() if not k.startswith("CNI_")})
        env.update(self.lab.env())
        env.update(CNI_PATH=self.cni_path, CNI_CACHE_DIR=str(self.tmp / "runtime-cache"),
                   CNI_ARGS=f"IgnoreUnknown=true;K8S_POD_NAMESPACE={self.tenant.namespace};"
                            f"K8S_POD_NAME={pod.name};K8S_POD_INFRA_CONTAINER_ID={pod.sandbox};"
                            f"K8S_POD_UID={pod.uid}")
        bundle_driver.require_driver()
        cmd = self.node.command("ip", "netns", "exec", self.lab.topo.host, str(bundle_driver.DRIVER),
                                verb, str(self.conf), pod.sandbox, pod.netns, "eth0")
        proc = subprocess.run(cmd, env=env, capture_output=True, check=False, timeout=300)
        out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
        return Call(proc.returncode, out, proc.stderr.decode(errors="replace"))

    def pod_object(self, pod: Pod) -> dict[str, Any]:
        obj: dict[str, Any] = self.tenant.server.request("GET", self.tenant.path("pods", pod.name, group=""))
        return obj

    def network_status(self, pod: Pod) -> list[dict[str, Any]]:
        annotations = self.pod_object(pod)["metadata"].get("annotations", {})
        assert STATUS in annotations, f"Multus wrote no {STATUS}: {annotations}\n{self.log_tail()}"
        status: list[dict[str, Any]] = json.loads(annotations[STATUS])
        return status

    def caches(self) -> list[str]:
        """Files Multus (scratch cache, its libcni's results) and the runtime's libcni keep."""
        return sorted(str(p) for d in (self.tmp / "multus-cache", self.tmp / "runtime-cache")
                      if d.is_dir() for p in d.rglob("*") if p.is_file())

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(no multus log)"

    def create_nad(self, doc: dict[str, Any]) -> None:
        self.tenant.server.create(
            self.tenant.path("network-attachment-definitions", group="k8s.cni.cncf.io", version="v1"), doc)


@contextmanager
def multus_node(topo: Topology, tenant: kubeup.Tenant, tmp_path: Path,
                cni_conf_dir: Path | None = None) -> Iterator[MultusNode]:
    """A MultusNode with the server reachable from the topology's host namespace and, in the agent pass,
    the node's own agent (which must have served something)."""
    lab = Lab(topo, tmp_path / "lab")
    mn = MultusNode(lab, tenant, tmp_path, bundle_driver.plugin_dir(tmp_path), cni_conf_dir)
    forwarder = kubeup.Forwarder(tenant.server, topo.host)  # Multus and the IPAM run in topo.host
    try:
        with mn.node.agent(lab.env()) as agent:  # the lab's sysfs root: the agent's process environment
            yield mn
    finally:
        forwarder.close()
    if agent is not None:
        assert agent.served(), f"the node's agent served nothing ({agent.log})"


def pod_links(topo: Topology, netns: str) -> dict[str, dict[str, Any]]:
    return {link["ifname"]: link for link in topo.links(netns) if link["ifname"] != "lo"}


def in_range(address: str, cidr: str) -> bool:
    return ipaddress.ip_interface(address).ip in ipaddress.ip_network(cidr)


def first_free(ipam: dict[str, Any]) -> str:
    """The lowest address of the NAD's range that is not excluded (what the IPAM hands out first)."""
    net = ipaddress.ip_network(ipam["range"])
    excluded = [ipaddress.ip_network(e) for e in ipam.get("exclude", [])]
    gateway = ipam.get("gateway")
    for host in net.hosts():
        if str(host) != gateway and not any(host in e for e in excluded):
            return f"{host}/{net.prefixlen}"
    raise AssertionError("range exhausted")


def pool_name(cidr: str) -> str:
    return cidr.replace("/", "-")


def entries(mn: MultusNode) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The namespace's pool entries and reservations."""
    return ({k: v for k, v in mn.tenant.pools().items() if v}, mn.tenant.reservations())


source_only = pytest.mark.skipif(bundle_driver.frozen_dir() is not None, reason=SOURCE_ONLY)
