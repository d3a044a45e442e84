"""conf-examples/network-operator: every CR renders (tests/netop.py, what the operators' templates emit)
to the NAD file beside it, which is what tests/e2e/test_netop_multus.py runs through Multus; every NAD
config loads with pycni's own loaders, its IPAM on the Kubernetes store through the node's flat file;
every address is in the project's ranges."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from bundler import hostconf
from cni.registry import resolve
from ipam import config
from tests import examples, netop

ALLOWED = [ipaddress.ip_network(n) for n in ("198.51.100.0/24", "198.18.0.0/15", "2001:db8::/32")]
# spec fields of the CRDs (network-operator api/v1alpha1/*_types.go, sriov-network-operator
# api/v1/sriovnetwork_types.go)
FIELDS = {
    "MacvlanNetwork": {"networkNamespace", "master", "mode", "mtu", "ipam", "metaPlugins"},
    "HostDeviceNetwork": {"networkNamespace", "resourceName", "ipam", "metaPlugins"},
    "SriovNetwork": {"networkNamespace", "resourceName", "capabilities", "ipam", "vlan", "vlanQoS",
                     "vlanProto", "spoofChk", "trust", "linkState", "minTxRate", "maxTxRate", "metaPlugins",
                     "logLevel", "logFile"},
}
GROUPS = {"MacvlanNetwork": "mellanox.com/v1alpha1", "HostDeviceNetwork": "mellanox.com/v1alpha1",
          "SriovNetwork": "sriovnetwork.openshift.io/v1"}


def flat_file(tmp_path: Path) -> tuple[str, ...]:
    """The flat file pycni-install writes on a cluster node (bundler/hostconf.py)."""
    kube = hostconf.KubeSettings("https://[2001:db8::1]:6443", "pycni-system", Path("/t"), None)
    conf = hostconf.HostConf("/etc/cni/net.d", "kubernetes", "node-a", kube)
    path = tmp_path / "whereabouts.conf"
    path.write_bytes(hostconf.flat_file(conf))
    return (str(path),)


def config_of(nad: dict[str, Any]) -> dict[str, Any]:
    conf: dict[str, Any] = json.loads(nad["spec"]["config"])
    return conf


def test_the_three_kinds_and_nothing_else() -> None:
    files = sorted(p.name for p in netop.DIR.iterdir())
    crs = netop.crs()
    assert {netop.load(p)["kind"] for p in crs} == set(netop.KINDS)
    assert files == sorted([p.name for p in crs] + [netop.nad_of(p).name for p in crs]), files


@pytest.mark.parametrize("path", netop.crs(), ids=lambda p: p.name)
def test_cr_renders_to_the_nad_beside_it(path: Path) -> None:
    cr = netop.load(path)
    assert cr["apiVersion"] == GROUPS[cr["kind"]] and set(cr["spec"]) <= FIELDS[cr["kind"]], cr
    assert netop.render(cr) == netop.load(netop.nad_of(path))


def test_sriov_rendering_matches_the_operators_golden_file() -> None:
    """sriov-network-operator api/v1/testdata/TestRendering/simple.golden, from its TestRendering input."""
    cr = {"apiVersion": "sriovnetwork.openshift.io/v1", "kind": "SriovNetwork",
          "metadata": {"namespace": "ns", "name": "test"},
          "spec": {"networkNamespace": "testnamespace", "resourceName": "testresource"}}
    assert netop.sriov(cr, resource_prefix="") == {
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"annotations": {"k8s.v1.cni.cncf.io/resourceName": "/testresource",
                                     "sriovnetwork.openshift.io/owner-ref":
                                         "SriovNetwork.sriovnetwork.openshift.io/ns/test"},
                     "name": "test", "namespace": "testnamespace"},
        "spec": {"config":
                 '{ "cniVersion":"1.0.0", "name":"test","type":"sriov","vlan":0,"vlanQoS":0,"ipam":{} }'},
    }


def test_macvlan_rendering_strips_the_ipam_and_host_device_does_not() -> None:
    ipam = '{\n  "type": "whereabouts",\n  "range": "198.51.100.0/28"\n}\n'
    mac = netop.macvlan({"metadata": {"name": "m"}, "spec": {"master": "up0", "ipam": ipam}})
    assert mac["spec"]["config"] == ('{ "cniVersion":"0.3.1", "name":"m", "type":"macvlan","master": "up0",'
                                     '"ipam":{"type":"whereabouts","range":"198.51.100.0/28"} } ')
    assert mac["metadata"]["namespace"] == "default"
    host = netop.host_device({"metadata": {"name": "h"},
                              "spec": {"networkNamespace": "n", "resourceName": "hostdev", "ipam": ipam}})
    assert host["spec"]["config"] == ('{ "cniVersion":"0.3.1", "name":"h", "type":"host-device", '
                                      '"ipam":{ "type": "whereabouts", "range": "198.51.100.0/28" }\n} ')
    assert host["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/resourceName": "nvidia.com/hostdev"}
    empty = netop.host_device({"metadata": {"name": "h"},
                               "spec": {"networkNamespace": "n", "resourceName": "x"}})
    assert config_of(empty)["ipam"] == {}


@pytest.mark.parametrize("path", netop.crs(), ids=lambda p: p.name)
def test_nad_config_loads_with_pycni_on_the_kubernetes_store(path: Path, tmp_path: Path) -> None:
    nad = netop.load(netop.nad_of(path))
    conf = config_of(nad)
    assert conf["name"] == nad["metadata"]["name"]
    assert conf["cniVersion"] == ("1.0.0" if conf["type"] == "sriov" else "0.3.1")
    if "k8s.v1.cni.cncf.io/resourceName" in nad["metadata"].get("annotations", {}):
        conf["deviceID"] = examples.MULTUS_DEVICE  # what Multus injects (tests/examples.py)
        if conf["type"] == "host-device":
            conf["pciBusID"] = examples.MULTUS_DEVICE
    examples.load_plugin(conf)
    ipam = conf["ipam"]
    assert resolve(ipam["type"]) == "whereabouts"
    loaded = config.load(ipam, flat_file(tmp_path))
    assert loaded.store.datastore == "kubernetes"
    assert loaded.store.kubernetes.kubeconfig == f"/etc/cni/net.d/{hostconf.KUBECONFIG}", "the node's"
    for rng in loaded.ranges:
        net = ipaddress.ip_network(rng.cidr)
        assert any(net.subnet_of(a) for a in ALLOWED if a.version == net.version), net


def test_the_doc_shows_the_example_and_what_the_operator_renders_from_it() -> None:
    """docs/network-operator.md's MacvlanNetwork is conf-examples' (ipam compared as JSON) and the config
    it shows is what the operator renders from it."""
    doc = (netop.DIR.parent.parent / "docs" / "network-operator.md").read_text(encoding="utf-8")
    blocks = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", doc, re.S)]
    (shown,) = [b for b in blocks if isinstance(b, dict) and b.get("kind") == "MacvlanNetwork"]
    example = netop.load(netop.DIR / "macvlannetwork.yaml")
    assert json.loads(shown["spec"].pop("ipam")) == json.loads(example["spec"].pop("ipam"))
    assert shown == example
    config = re.search(r"renders .*?\n\n```\n(.*?)\n```", doc, re.S)
    assert config is not None
    rendered = netop.render(netop.load(netop.DIR / "macvlannetwork.yaml"))["spec"]["config"]
    assert config.group(1) == rendered.strip()
