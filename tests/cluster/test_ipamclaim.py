"""Persistent addresses through IPAMClaim (issue 46) on the real node through Multus, with pycni installed as
shipped (its agent and claim watch included) and the upstream IPAMClaim CRD (../shared/upstream/ipamclaims).
No KubeVirt here: the test writes what it would, exactly as ipam-extensions writes it, the claim
`vm-a.tenantred` (owned by the VM, finalizer `kubevirt.io/persistent-ipam`, `spec.network` the NAD
config's name, `spec.interface` empty) and the launcher pods' `k8s.v1.cni.cncf.io/networks` entry
(KubeVirt's interface name `pod<sha256(network)[:11]>`, `ipam-claim-reference`); the NAD is
conf-examples/kubernetes/macvlan-persistent-ips.yaml (`"allowPersistentIPs": true`). A "VM" restarted
(its launcher pod deleted, a new one created) keeps its address, a migration target (a second launcher
pod while the first runs) gets it too and the source's deletion frees nothing, and the claim deleted
(ipam-extensions' way: marked deleted, then its finalizer removed) frees the address and its
reservation within seconds (the agent's claim watch)."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import kubenode
from tests.cluster.pods import SETTLE, Net, addresses, example_nad, pod, ready, sandbox_failures
from tests.kubeup import IPAMCLAIM_CRD

VM_NAD = "vm-net"  # conf-examples/kubernetes/macvlan-persistent-ips.yaml (its master and range this node's)
VM_RANGE = ipaddress.ip_network("198.18.64.0/24")
VM_POOL = "198.18.64.0-24"
VM_NETWORK = "tenantred"  # the VM's network name (its spec.networks[].name)
IFACE = "pod" + hashlib.sha256(VM_NETWORK.encode()).hexdigest()[:11]  # KubeVirt's pod interface for it
CLAIM = f"vm-a.{VM_NETWORK}"
LET_GO = '{"metadata":{"finalizers":null}}'  # what ipam-extensions does once the VMI is gone


@pytest.fixture(scope="module")
def vm_net(net: Net) -> Iterator[Net]:
    """The IPAMClaim CRD and a NAD allowing persistent addresses; at the end every claim of the module's
    namespace is let go (finalizer removed: the namespace and the CRD can then go) and the CRD removed."""
    node = net.node
    node.kubectl("apply", "-f", str(IPAMCLAIM_CRD))
    node.kubectl("wait", "--for=condition=Established", "crd/ipamclaims.k8s.cni.cncf.io", "--timeout=60s")
    node.apply([example_nad("macvlan-persistent-ips.yaml", net.ns, {
        "master": net.master, "ipam.range": str(VM_RANGE), "ipam.exclude": ["198.18.64.0/28"],
        "ipam.gateway": "198.18.64.1"}, node)])  # fmt: skip
    try:
        yield net
    finally:
        for item in node.get("-n", net.ns, "ipamclaims.k8s.cni.cncf.io")["items"]:
            name = item["metadata"]["name"]
            node.kubectl("-n", net.ns, "patch", "ipamclaim", name, "--type=merge", "-p", LET_GO, check=False)
        node.kubectl("delete", "-f", str(IPAMCLAIM_CRD), "--wait=true", "--timeout=120s", check=False,
                     timeout=180)  # fmt: skip


def claim(ns: str) -> dict[str, Any]:
    """The IPAMClaim ipam-extensions' VMI controller creates for vm-a's network."""
    return {"apiVersion": "k8s.cni.cncf.io/v1alpha1", "kind": "IPAMClaim",
            "metadata": {"name": CLAIM, "namespace": ns, "labels": {"kubevirt.io/vm": "vm-a"},
                         "finalizers": ["kubevirt.io/persistent-ipam"],
                         "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                              "name": "vm-a", "uid": "0b2bd7e4-1c67-4a0e-9b8e-7a4f5d1c2e3f",
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"network": VM_NAD, "interface": ""}}  # fmt: skip


def launcher(name: str, ns: str, claimed: bool = True) -> dict[str, Any]:
    """A virt-launcher pod as ipam-extensions' webhook leaves it (Go's encoding/json: compact)."""
    element: dict[str, Any] = {"name": VM_NAD, "namespace": ns, "interface": IFACE}
    if claimed:
        element["ipam-claim-reference"] = CLAIM
    doc = pod(name, ns, json.dumps([element], separators=(",", ":")))
    doc["metadata"]["annotations"]["kubevirt.io/domain"] = "vm-a"
    return doc


def held(node: kubenode.Cluster) -> tuple[dict[str, str], dict[str, str]]:
    """(offset -> holder's id in the VM pool, reservation -> its containerid) of the VM network."""
    pools = {p["metadata"]["name"]: p["spec"].get("allocations") or {}
             for p in node.get("-n", kubenode.NS, "ippools.whereabouts.cni.cncf.io")["items"]}  # fmt: skip
    entries = {k: a["id"] for k, a in pools.get(VM_POOL, {}).items()}
    res = node.get("-n", kubenode.NS, "overlappingrangeipreservations.whereabouts.cni.cncf.io")["items"]
    return entries, {r["metadata"]["name"]: r["spec"].get("containerid", "") for r in res
                     if r["metadata"]["name"].startswith("198.18.64.")}  # fmt: skip


def gone(node: kubenode.Cluster, ns: str, name: str) -> bool:
    return not node.kubectl("-n", ns, "get", "pod", name, "--ignore-not-found", "-o", "name").stdout.strip()


def delete(node: kubenode.Cluster, ns: str, name: str) -> None:
    node.kubectl("-n", ns, "delete", "pod", name, "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for(f"{name} gone", lambda: gone(node, ns, name), SETTLE)


def test_a_vm_keeps_its_address_across_a_restart_and_a_migration_until_its_claim_goes(vm_net: Net) -> None:
    node, ns = vm_net.node, vm_net.ns
    node.apply([claim(ns)])
    made = node.get("-n", ns, "ipamclaim", CLAIM)
    marker = f"ipamclaim/{ns}/{CLAIM}/{made['metadata']['uid']}"

    node.apply([launcher("virt-launcher-vm-a-1", ns)])
    ready(node, ns, "virt-launcher-vm-a-1")
    got = addresses(node, ns, "virt-launcher-vm-a-1", IFACE)
    assert len(got) == 1 and got[0] in VM_RANGE and got[0].ip == ipaddress.ip_address("198.18.64.16"), got
    ip = got[0]
    status = node.get("-n", ns, "ipamclaim", CLAIM)["status"]
    assert status == {"ips": [str(ip)], "ownerPod": {"name": "virt-launcher-vm-a-1"}}, status
    assert held(node) == ({"16": marker}, {"198.18.64.16": marker})

    # the VM restarted: its launcher pod deleted (the kubelet's DEL frees nothing), a new one created
    delete(node, ns, "virt-launcher-vm-a-1")
    assert held(node) == ({"16": marker}, {"198.18.64.16": marker})
    node.apply([launcher("virt-launcher-vm-a-2", ns)])
    ready(node, ns, "virt-launcher-vm-a-2")
    assert addresses(node, ns, "virt-launcher-vm-a-2", IFACE) == [ip]

    # a live migration: the target pod gets the address while the source runs; the source goes
    node.apply([launcher("virt-launcher-vm-a-3", ns)])
    ready(node, ns, "virt-launcher-vm-a-3")
    assert addresses(node, ns, "virt-launcher-vm-a-3", IFACE) == [ip]
    delete(node, ns, "virt-launcher-vm-a-2")
    assert addresses(node, ns, "virt-launcher-vm-a-3", IFACE) == [ip]
    assert held(node) == ({"16": marker}, {"198.18.64.16": marker})

    # an ordinary pod of the network gets another address
    node.apply([launcher("plain", ns, claimed=False)])
    ready(node, ns, "plain")
    assert addresses(node, ns, "plain", IFACE)[0].ip == ipaddress.ip_address("198.18.64.17")
    delete(node, ns, "plain")
    assert sandbox_failures(node, ns) == []

    # the VM deleted: its last launcher pod goes, then the claim (marked deleted, its finalizer removed)
    delete(node, ns, "virt-launcher-vm-a-3")
    assert held(node) == ({"16": marker}, {"198.18.64.16": marker})
    node.kubectl("-n", ns, "delete", "ipamclaim", CLAIM, "--wait=false")
    node.kubectl("-n", ns, "patch", "ipamclaim", CLAIM, "--type=merge", "-p", LET_GO)
    started = time.monotonic()
    kubenode.wait_for("the claim's address and reservation freed", lambda: held(node) == ({}, {}), SETTLE)
    print(f"\nthe claim gone -> its address freed by the node's agent in {time.monotonic() - started:.1f} s")
