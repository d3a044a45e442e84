"""Multus (the v4.3.0 thin plugin, ../shared/upstream) delegating to our plugins, called as a runtime
calls it: through libcni (the driver), with the kubelet's CNI_ARGS, against the real kube-apiserver
(the node: tests/e2e/multus.py).

The NetworkAttachmentDefinitions are conf-examples/kubernetes/ as shipped, created in the test's
namespace; only the macvlan master and the IPAM's kubeconfig are substituted (the NADs leave the
kubeconfig to the node's flat file; here it is set inline to the tenant's node ServiceAccount
kubeconfig, tokenFile as the installer writes it). The SR-IOV VF's PF-side settings go to the recording
VF seam (sriov from source through tests/launch.py: source pass only)."""

from __future__ import annotations

import copy
import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import kubeup, launch
from tests.devlab import NIC_PCI, VF_PCIS
from tests.e2e.multus import (
    CLUSTER_NET,
    DEVICES,
    MultusNode,
    entries,
    first_free,
    in_range,
    multus_node,
    pod_links,
    pool_name,
    source_only,
)
from tests.examples import EXAMPLES
from tests.nsutil import Topology


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


@pytest.fixture
def mnode(topo: Topology, tenant: kubeup.Tenant, tmp_path: Path) -> Iterator[MultusNode]:
    with multus_node(topo, tenant, tmp_path) as mn:
        yield mn


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


def test_requested_ips_through_multus(mnode: MultusNode) -> None:
    """conf-examples/kubernetes/macvlan-requested-ips.yaml as shipped (the `ips` capability): a pod whose
    network selection element asks for an address gets exactly it (and network-status says so); a second
    pod asking for the same address fails cleanly, naming the holder (code 109 from the IPAM), leaves
    nothing behind, and the first keeps it; a pod asking for nothing gets another address."""
    mn, topo, tenant = mnode, mnode.lab.topo, mnode.tenant
    ns = tenant.namespace
    doc = nad("macvlan-requested-ips.yaml", ns, tenant.node, master=topo.add_uplink("st"))
    assert nad_config(doc)["capabilities"] == {"ips": True}
    mn.create_nad(doc)
    ipam = nad_config(doc)["ipam"]
    want = "198.51.100.77/24"
    ask = json.dumps([{"name": "static-macvlan", "ips": [want]}])

    first = mn.pod("static-a", ask)
    add = mn.run("add", first)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert topo.addrs(first.netns, "net1") == [want]
    status = {s["interface"]: s for s in mn.network_status(first)}
    assert status["net1"]["name"] == f"{ns}/static-macvlan" and status["net1"]["ips"] == ["198.51.100.77"]

    second = mn.pod("static-b", ask)
    add = mn.run("add", second)
    assert not add.ok and add.out is not None, (add.out, add.stderr)
    held = f"requested address 198.51.100.77 is held by pod {ns}/static-a (container {first.sandbox} net1)"
    assert held in add.out["msg"], (add.out, mn.log_tail())
    assert pod_links(topo, second.netns) == {}, "Multus rolled the pod's attachments back"
    pools, reservations = entries(mn)
    assert list(pools[pool_name(ipam["range"])]) == ["77"] and list(reservations) == ["198.51.100.77"]
    assert reservations["198.51.100.77"]["podref"] == f"{ns}/static-a"
    assert mn.run("del", second).ok  # the runtime's DEL after the failed ADD: nothing of it to release
    assert entries(mn) == (pools, reservations)

    third = mn.pod("static-c", "static-macvlan")
    add = mn.run("add", third)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert topo.addrs(third.netns, "net1") == [first_free(ipam)] != [want]
    for pod in (first, third):
        assert mn.run("del", pod).ok
    assert entries(mn) == ({}, {})



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
