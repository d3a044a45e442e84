"""Multus (the v4.3.0 thin plugin, ../shared/upstream) delegating to our plugins, called as a runtime
calls it: through libcni (the driver), with the kubelet's CNI_ARGS, against the real kube-apiserver.

The NetworkAttachmentDefinitions are conf-examples/kubernetes/ as shipped, created in the test's
namespace; only the macvlan master and the IPAM's kubeconfig are substituted (the NADs leave the
kubeconfig to the node's flat file; here it is set inline to the tenant's node ServiceAccount
kubeconfig, tokenFile as the installer writes it). The Pod carries the `k8s.v1.cni.cncf.io/networks`
annotation; its devices come from the kubelet device-plugin checkpoint Multus reads (a fixed path:
/var/lib is the test's own directory in a private mount namespace, tests/e2e/node.py), naming PCI
addresses of a fake sysfs (tests/devlab.py) whose netdevs are veth ends; the SR-IOV VF's PF-side
settings go to the recording VF seam (sriov from source through tests/launch.py: source pass only).
The cluster network is Debian's ptp + host-local.

Multus itself uses an admin kubeconfig (it is not our product); every directory it can be given
(confDir, cniDir, binDir, logFile) is in tmp_path."""

from __future__ import annotations

import copy
import ipaddress
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni import jsonio
from cni.registry import PLUGINS
from tests import agentutil, kubeup, launch
from tests.devlab import NIC_PCI, VF_PCIS, Lab
from tests.e2e import bundle_driver
from tests.e2e.node import Node
from tests.examples import EXAMPLES
from tests.logtee import PYTHONPATH
from tests.nsutil import Call, Topology

NETWORKS = "k8s.v1.cni.cncf.io/networks"
STATUS = "k8s.v1.cni.cncf.io/network-status"
CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
DEVICES = "/var/lib/cni/pycni/devices"  # the device plugins' default stateDir (the NADs set none)
CLUSTER_NET = "198.18.200.0/24"


def nad(file: str, namespace: str, kubeconfig: Path, master: str = "") -> dict[str, Any]:
    """A conf-examples NAD in `namespace`: only the master and the IPAM kubeconfig substituted."""
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / "kubernetes" / file).read_text())
    doc["metadata"]["namespace"] = namespace
    config = json.loads(doc["spec"]["config"])
    if master:
        assert "master" in config, f"{file} has no master to substitute"
        config["master"] = master
    config["ipam"]["kubernetes"] = {"kubeconfig": str(kubeconfig)}
    doc["spec"]["config"] = json.dumps(config)
    return doc


def nad_config(doc: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(doc["spec"]["config"])
    return config


@dataclass
class Pod:
    name: str
    uid: str
    netns: str
    sandbox: str


class MultusNode:
    """One node: the lab's host namespace and sysfs, a Multus config, a runtime cache, the checkpoint."""

    def __init__(self, lab: Lab, tenant: kubeup.Tenant, tmp: Path, plugin_dir: Path) -> None:
        self.lab, self.tenant, self.tmp = lab, tenant, tmp
        self.node = Node(tmp / "node")
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


@pytest.fixture
def mnode(topo: Topology, tenant: kubeup.Tenant, tmp_path: Path) -> Iterator[MultusNode]:
    lab = Lab(topo, tmp_path / "lab")
    mn = MultusNode(lab, tenant, tmp_path, bundle_driver.plugin_dir(tmp_path))
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
    """The namespace's pool entries and reservations, once the node's agent (if any) has written what
    it answered (`--defer-writes`: an agent answers a call before its pool write)."""
    agentutil.settled()
    return ({k: v for k, v in mn.tenant.pools().items() if v}, mn.tenant.reservations())


def test_macvlan_whereabouts_and_host_device_in_one_pod(mnode: MultusNode) -> None:
    mn, lab, topo, tenant = mnode, mnode.lab, mnode.lab.topo, mnode.tenant
    uplink = topo.add_uplink("rdma", mtu=9000)  # the RoCE uplink runs jumbo frames, as the NAD's mtu needs
    roce = nad("roce-shared-macvlan.yaml", tenant.namespace, tenant.node, master=uplink)
    hostdev = nad("hostdevice-pf.yaml", tenant.namespace, tenant.node)
    for doc in (roce, hostdev):
        mn.create_nad(doc)
    resource = hostdev["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
    nic_before = lab.netdev(lab.nic)
    host_before = lab.host_names()
    pod = mn.pod("two-nets", "roce-shared,hostdev-pf")
    mn.checkpoint([(pod.uid, resource, [NIC_PCI])])
    want = {"net1": first_free(nad_config(roce)["ipam"]), "net2": first_free(nad_config(hostdev)["ipam"])}

    add = mn.run("add", pod)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert mn.caches(), "Multus and libcni cached the attachment"

    # inside the pod: eth0 from the cluster network, net1 (macvlan) and net2 (the NIC) from the NADs
    links = pod_links(topo, pod.netns)
    assert sorted(links) == ["eth0", "net1", "net2"], links
    assert links["net1"]["linkinfo"]["info_kind"] == "macvlan"
    assert links["net1"]["linkinfo"]["info_data"]["mode"] == "bridge"
    assert links["net1"]["mtu"] == nad_config(roce)["mtu"]
    assert nic_before is not None and links["net2"]["address"] == nic_before["mac"]
    assert links["net2"].get("ifalias", "") != ""  # marked by the device move
    assert topo.addrs(pod.netns, "net1") == [want["net1"]]
    assert topo.addrs(pod.netns, "net2") == [want["net2"]]
    (eth0,) = topo.addrs(pod.netns, "eth0")
    assert in_range(eth0, CLUSTER_NET)
    assert lab.netdev(lab.nic) is None, "the NIC left the host"

    # what Multus wrote on the Pod
    status = {s["interface"]: s for s in mn.network_status(pod)}
    assert sorted(status) == ["eth0", "net1", "net2"], status
    assert status["eth0"]["name"] == "cluster" and status["eth0"]["default"] is True
    assert status["eth0"]["ips"] == [eth0.split("/")[0]]
    ns = tenant.namespace
    assert status["net1"]["name"] == f"{ns}/roce-shared"
    assert status["net1"]["ips"] == [want["net1"].split("/")[0]]
    assert status["net1"]["mac"] == links["net1"]["address"]
    assert status["net2"]["name"] == f"{ns}/hostdev-pf"
    assert status["net2"]["ips"] == [want["net2"].split("/")[0]]
    assert status["net2"]["mac"] == links["net2"]["address"]

    # on the server: one allocation per network, owned by this sandbox, pod and interface
    pools, reservations = entries(mn)
    for ifname, doc in (("net1", roce), ("net2", hostdev)):
        ipam = nad_config(doc)["ipam"]
        net = ipaddress.ip_network(ipam["range"])
        address = ipaddress.ip_interface(want[ifname]).ip
        alloc = pools[pool_name(ipam["range"])]
        assert list(alloc) == [str(int(address) - int(net.network_address))], alloc
        (entry,) = alloc.values()
        assert (entry["id"], entry["ifname"], entry["podref"]) == (pod.sandbox, ifname, f"{ns}/{pod.name}")
        res = reservations[str(address)]
        assert (res["containerid"], res["ifname"], res["podref"]) == (pod.sandbox, ifname, f"{ns}/{pod.name}")
    assert len(reservations) == 2, reservations
    assert mn.node.files(f"{DEVICES}/attachments") == [f"{pod.sandbox}:net2"]

    for _ in range(2):
        delete = mn.run("del", pod)
        assert delete.ok, (delete.out, delete.stderr, mn.log_tail())
        assert pod_links(topo, pod.netns) == {}
        assert lab.netdev(lab.nic) == nic_before, "the NIC is home as it was"
        assert lab.host_names() == host_before, "no link left on the host (ptp's veth end included)"
        assert entries(mn) == ({}, {})
        assert mn.node.files(f"{DEVICES}/attachments") == []
        assert mn.node.files(f"{DEVICES}/owners") == []
        assert mn.caches() == []


source_only = pytest.mark.skipif(bundle_driver.frozen_dir() is not None,
                                 reason="needs test seams (tests/launch.py), which only the source pass has")


@source_only
def test_sriov_vf_from_the_device_plugin(mnode: MultusNode) -> None:
    mn, lab, topo, tenant = mnode, mnode.lab, mnode.lab.topo, mnode.tenant
    mn.with_seams("sriov", *launch.options(fake_pf=lab.fake_pf))
    sriov = nad("sriov-vf.yaml", tenant.namespace, tenant.node)
    mn.create_nad(sriov)
    resource = sriov["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
    # VF 1 starts far from what the NAD asks (vlan 0, spoofchk on, trust off, link_state auto), so ADD
    # has something to change and DEL something to restore
    state = lab.pf_state()
    start = {"mac": "02:00:00:00:0a:01", "vlan": 7, "qos": 3, "proto": "802.1q", "spoofchk": 0, "trust": 1,
             "link_state": 2, "min_tx_rate": 0, "max_tx_rate": 0}
    state["pfs"][lab.pf]["vfs"]["1"] = start
    lab.fake_pf.write_text(json.dumps(state))
    initial = copy.deepcopy(lab.vf_table())
    vf_before = lab.netdev(lab.vfs[1])
    host_before = lab.host_names()
    pod = mn.pod("sriov-pod", "sriov-rdma")
    mn.checkpoint([(pod.uid, resource, [VF_PCIS[1]])])
    want = first_free(nad_config(sriov)["ipam"])

    add = mn.run("add", pod)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert mn.caches(), "Multus and libcni cached the attachment"
    links = pod_links(topo, pod.netns)
    assert sorted(links) == ["eth0", "net1"], links
    assert topo.addrs(pod.netns, "net1") == [want]
    assert vf_before is not None and links["net1"]["address"] == vf_before["mac"]
    assert lab.netdev(lab.vfs[1]) is None, "the VF netdev left the host"
    applied = lab.vf_table()["1"]
    assert {k: applied[k] for k in ("vlan", "qos", "spoofchk", "trust", "link_state")} == {
        "vlan": 0, "qos": 0, "spoofchk": 1, "trust": 0, "link_state": 0}
    assert {k: v for k, v in lab.vf_table().items() if k != "1"} == {
        k: v for k, v in initial.items() if k != "1"}

    status = {s["interface"]: s for s in mn.network_status(pod)}
    assert sorted(status) == ["eth0", "net1"], status
    assert status["net1"]["name"] == f"{tenant.namespace}/sriov-rdma"
    assert status["net1"]["ips"] == [want.split("/")[0]]
    pools, reservations = entries(mn)
    ipam = nad_config(sriov)["ipam"]
    (entry,) = pools[pool_name(ipam["range"])].values()
    assert (entry["id"], entry["ifname"]) == (pod.sandbox, "net1")
    assert list(reservations) == [want.split("/")[0]]
    assert mn.node.files(f"{DEVICES}/attachments") == [f"{pod.sandbox}:net1"]

    for _ in range(2):
        delete = mn.run("del", pod)
        assert delete.ok, (delete.out, delete.stderr, mn.log_tail())
        assert pod_links(topo, pod.netns) == {}
        assert lab.netdev(lab.vfs[1]) == vf_before
        assert lab.host_names() == host_before
        assert lab.vf_table() == initial, "VF settings restored"
        assert entries(mn) == ({}, {})
        assert mn.node.files(f"{DEVICES}/attachments") == []
        assert mn.node.files(f"{DEVICES}/owners") == []
        assert mn.caches() == []
