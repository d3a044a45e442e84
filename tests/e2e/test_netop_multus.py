"""The NVIDIA Network Operator's and the SR-IOV Network Operator's NADs, exactly as they render them from
conf-examples/network-operator (tests/unit/test_netop_examples.py checks each file against its CR), run
through Multus v4.3.0 against the real kube-apiserver (the node: tests/e2e/multus.py).

The only edit the test makes: the NAD's namespace is the test's own, and the macvlan `master` (the CR's
`ens2f0`) becomes a veth end the test made (a string replacement in the config text, which stays
otherwise byte for byte the operator's). The IPAM names no kubeconfig: it comes from the node's flat
file, /etc/cni/net.d/whereabouts.d/, written with pycni-install's own code (bundler.hostconf.desired)
into the node's /etc/cni/net.d, which is the test's directory in a private mount namespace
(tests/e2e/node.py); the kubeconfig's tokenFile is the tenant's node ServiceAccount token.
Each attachment gets the first free address of its range and releases it on DEL (twice: idempotent)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bundler import hostconf
from ipam.store.names import pool_name, reservation_name
from tests import kubeup, launch, netop
from tests.devlab import NIC_PCI, VF_PCIS
from tests.e2e.multus import (
    MultusNode,
    entries,
    multus_node,
    pod_links,
    source_only,
)
from tests.e2e.node import own_flat_file_impossible
from tests.nsutil import Topology

RESOURCE = "k8s.v1.cni.cncf.io/resourceName"
CR_MASTER = '"master": "ens2f0"'


def install_flat_file(conf_dir: Path, tenant: kubeup.Tenant) -> None:
    """What pycni-install writes into a cluster node's conf dir (host paths inside: /etc/cni/net.d)."""
    token = tenant.node.with_name(f"{kubeup.NODE_SA}.token")
    kube = hostconf.KubeSettings(tenant.server.url, tenant.namespace, token, Path(tenant.server.ca_file))
    conf = hostconf.HostConf("/etc/cni/net.d", "kubernetes", "node-a", kube)
    for rel, data in hostconf.desired(conf).items():
        path = conf_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o600)


@pytest.fixture
def netop_node(topo: Topology, tenant: kubeup.Tenant, tmp_path: Path) -> Iterator[MultusNode]:
    if own_flat_file_impossible():
        pytest.skip(own_flat_file_impossible())
    conf_dir = tmp_path / "etc-cni-net.d"
    with multus_node(topo, tenant, tmp_path, cni_conf_dir=conf_dir) as mn:
        install_flat_file(conf_dir, tenant)
        yield mn


def rendered(cr_file: str, namespace: str, master: str = "") -> dict[str, Any]:
    """The operator's NAD for conf-examples/network-operator/CR_FILE, with the test's only edit."""
    doc = netop.load(netop.nad_of(netop.DIR / cr_file))
    doc["metadata"]["namespace"] = namespace
    text: str = doc["spec"]["config"]
    if master:
        assert text.count(CR_MASTER) == 1, text
        doc["spec"]["config"] = text.replace(CR_MASTER, f'"master": "{master}"')
    else:
        assert "master" not in text
    return doc


def first_free(cidr: str, exclude: list[str]) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
    net = ipaddress.ip_network(cidr)
    gone = [ipaddress.ip_network(e) for e in exclude]
    start = 1 if net.version == 6 else 0
    for n, host in enumerate(net.hosts() if net.version == 4 else iter(net)):
        if n >= start and not any(host in e for e in gone):
            return ipaddress.ip_interface(f"{host}/{net.prefixlen}")
    raise AssertionError("range exhausted")


def ranges(doc: dict[str, Any]) -> list[dict[str, Any]]:
    ipam: dict[str, Any] = json.loads(doc["spec"]["config"])["ipam"]
    return ipam.get("ipRanges") or [ipam]


def wanted(doc: dict[str, Any]) -> list[str]:
    return [str(first_free(r["range"], r.get("exclude", []))) for r in ranges(doc)]


def check_pool_entries(mn: MultusNode, sandbox: str, pod: str, *attached: tuple[dict[str, Any], str]) -> None:
    """One pool entry and one reservation per address of each (NAD, interface), and nothing else."""
    pools, reservations = entries(mn)
    for doc, ifname in attached:
        check_one(pools, reservations, doc, sandbox, ifname, f"{mn.tenant.namespace}/{pod}")
    count = sum(len(ranges(doc)) for doc, _ in attached)
    assert sum(map(len, pools.values())) == len(reservations) == count, (pools, reservations)


def check_one(pools: dict[str, dict[str, Any]], reservations: dict[str, dict[str, Any]], doc: dict[str, Any],
              sandbox: str, ifname: str, podref: str) -> None:
    for rng, address in zip(ranges(doc), wanted(doc), strict=True):
        ip = ipaddress.ip_interface(address).ip
        net = ipaddress.ip_network(rng["range"])
        pool = pools[pool_name(rng["range"], "")]
        key = str(int(ip) - int(net.network_address))
        assert key in pool, pool
        assert (pool[key]["id"], pool[key]["ifname"], pool[key]["podref"]) == (sandbox, ifname, podref)
        res = reservations[reservation_name(str(ip), "")]
        assert (res["podref"], res["ifname"]) == (podref, ifname)


def test_macvlan_and_host_device_networks_as_the_operator_renders_them(netop_node: MultusNode) -> None:
    mn, lab, topo, tenant = netop_node, netop_node.lab, netop_node.lab.topo, netop_node.tenant
    uplink = topo.add_uplink("ens")
    macvlan = rendered("macvlannetwork.yaml", tenant.namespace, master=uplink)
    hostdev = rendered("hostdevicenetwork.yaml", tenant.namespace)
    for doc in (macvlan, hostdev):
        mn.create_nad(doc)
    nic_before = lab.netdev(lab.nic)
    host_before = lab.host_names()
    pod = mn.pod("netop", "example-macvlannetwork,example-hostdevice-network")
    mn.checkpoint([(pod.uid, hostdev["metadata"]["annotations"][RESOURCE], [NIC_PCI])])
    want = {"net1": wanted(macvlan), "net2": wanted(hostdev)}
    assert want == {"net1": ["198.51.100.16/24"], "net2": ["198.18.64.4/28"]}

    add = mn.run("add", pod)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    links = pod_links(topo, pod.netns)
    assert sorted(links) == ["eth0", "net1", "net2"], links
    assert links["net1"]["linkinfo"]["info_kind"] == "macvlan"
    assert links["net1"]["linkinfo"]["info_data"]["mode"] == "bridge" and links["net1"]["mtu"] == 1500
    assert nic_before is not None and links["net2"]["address"] == nic_before["mac"]
    for ifname, addresses in want.items():
        assert topo.addrs(pod.netns, ifname) == addresses
    status = {s["interface"]: s for s in mn.network_status(pod)}
    assert status["net1"]["name"] == f"{tenant.namespace}/example-macvlannetwork"
    assert status["net2"]["name"] == f"{tenant.namespace}/example-hostdevice-network"
    assert [status[i]["ips"] for i in ("net1", "net2")] == [["198.51.100.16"], ["198.18.64.4"]]
    check_pool_entries(mn, pod.sandbox, pod.name, (macvlan, "net1"), (hostdev, "net2"))

    for _ in range(2):
        delete = mn.run("del", pod)
        assert delete.ok, (delete.out, delete.stderr, mn.log_tail())
        assert pod_links(topo, pod.netns) == {}
        assert lab.netdev(lab.nic) == nic_before, "the NIC is home as it was"
        assert lab.host_names() == host_before
        assert entries(mn) == ({}, {})
        assert mn.caches() == []


def test_the_operators_own_macvlan_with_pycni_ipam_under_a_prefix(netop_node: MultusNode) -> None:
    """The operator's cni-plugins left on: its `macvlan` (here Debian's reference plugin, the same
    upstream code) in the node's bin dir, pycni's IPAM beside it as `pycni-whereabouts`, as
    `pycni-install --prefix pycni-` installs it; the MacvlanNetwork's ipam names that type."""
    mn, topo, tenant = netop_node, netop_node.lab.topo, netop_node.tenant
    reference = Path("/usr/lib/cni/macvlan")
    if not reference.exists():
        pytest.fail(f"{reference} missing: bash .ci/apt-deps installs containernetworking-plugins")
    ours = (mn.bin / "whereabouts").resolve()
    (mn.bin / "macvlan").unlink()
    (mn.bin / "macvlan").symlink_to(reference)
    (mn.bin / "whereabouts").unlink()
    (mn.bin / "pycni-whereabouts").symlink_to(ours)
    uplink = topo.add_uplink("ens")
    doc = rendered("macvlannetwork-prefixed.yaml", tenant.namespace, master=uplink)
    mn.create_nad(doc)
    pod = mn.pod("netop-prefixed", "example-macvlannetwork-prefixed")
    assert wanted(doc) == ["198.51.100.132/25"]

    add = mn.run("add", pod)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert topo.addrs(pod.netns, "net1") == ["198.51.100.132/25"]
    check_pool_entries(mn, pod.sandbox, pod.name, (doc, "net1"))
    for _ in range(2):
        delete = mn.run("del", pod)
        assert delete.ok, (delete.out, delete.stderr, mn.log_tail())
        assert topo.link(pod.netns, "net1") is None
        assert entries(mn) == ({}, {})


@source_only
def test_sriov_network_as_the_sriov_operator_renders_it(netop_node: MultusNode) -> None:
    mn, lab, topo, tenant = netop_node, netop_node.lab, netop_node.lab.topo, netop_node.tenant
    mn.with_seams("sriov", *launch.options(fake_pf=lab.fake_pf))
    doc = rendered("sriovnetwork.yaml", tenant.namespace)
    mn.create_nad(doc)
    initial = lab.vf_table()
    vf_before = lab.netdev(lab.vfs[1])
    pod = mn.pod("netop-sriov", "example-sriov-network")
    mn.checkpoint([(pod.uid, doc["metadata"]["annotations"][RESOURCE], [VF_PCIS[1]])])
    want = wanted(doc)
    assert want == ["198.18.65.4/26", "2001:db8:65::1/120"]

    add = mn.run("add", pod)
    assert add.ok, (add.out, add.stderr, mn.log_tail())
    assert vf_before is not None and pod_links(topo, pod.netns)["net1"]["address"] == vf_before["mac"]
    assert sorted(topo.addrs(pod.netns, "net1")) == sorted(want)
    applied = lab.vf_table()["1"]
    assert {k: applied[k] for k in ("vlan", "qos", "spoofchk", "trust")} == {
        "vlan": 0, "qos": 0, "spoofchk": 1, "trust": 0}
    status = {s["interface"]: s for s in mn.network_status(pod)}
    assert sorted(status["net1"]["ips"]) == sorted(a.split("/")[0] for a in want)
    check_pool_entries(mn, pod.sandbox, pod.name, (doc, "net1"))
    for _ in range(2):
        delete = mn.run("del", pod)
        assert delete.ok, (delete.out, delete.stderr, mn.log_tail())
        assert lab.netdev(lab.vfs[1]) == vf_before
        assert lab.vf_table() == initial, "VF settings restored"
        assert entries(mn) == ({}, {})
