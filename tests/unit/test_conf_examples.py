"""Every file in conf-examples/ parses with pycni's loaders; the Kubernetes objects validate offline;
the NADs carry what Multus and the device plugins need."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bundler import hostconf
from cni import jsonio
from cni.errors import ConfigError
from cni.registry import PLUGINS
from tests import examples

NAD_KEYS = {"apiVersion", "kind", "metadata", "spec"}


def flat_file(tmp_path: Path) -> tuple[str, ...]:
    """The flat file the DaemonSet writes, as the NADs will find it on a node."""
    conf = hostconf.HostConf("/etc/cni/net.d", "kubernetes", "node-a", None)
    path = tmp_path / "whereabouts.conf"
    path.write_bytes(hostconf.flat_file(conf))
    return (str(path),)


def test_there_is_an_example_for_each_model() -> None:
    kinds = {examples.nad_config(p)["type"] for p in examples.nads()}
    assert kinds == {"macvlan", "sriov", "host-device"}
    assert all(examples.nad_config(p)["ipam"]["type"] == "whereabouts" for p in examples.nads())
    assert examples.conflists()


@pytest.mark.parametrize("path", examples.nads(), ids=lambda p: p.name)
def test_nad_parses(path: Path, tmp_path: Path) -> None:
    nad = yaml.safe_load(path.read_text())
    assert set(nad) == NAD_KEYS and nad["apiVersion"] == "k8s.cni.cncf.io/v1"
    assert set(nad["spec"]) == {"config"} and nad["metadata"]["name"]
    conf = examples.nad_config(path)
    assert conf["name"] == nad["metadata"]["name"]
    examples.load_plugin(conf)
    examples.load_ipam(conf["ipam"], flat_file(tmp_path))
    if conf["type"] in ("sriov", "host-device"):
        resource = nad["metadata"]["annotations"]["k8s.v1.cni.cncf.io/resourceName"]
        assert resource.count("/") == 1


@pytest.mark.parametrize("path", examples.conflists(), ids=lambda p: p.name)
def test_conflist_parses(path: Path) -> None:
    doc = jsonio.loads(path.read_bytes(), str(path))
    assert doc["plugins"] and doc["name"]
    for plugin in doc["plugins"]:
        conf = {"cniVersion": doc["cniVersion"], "name": doc["name"], **plugin}
        examples.load_plugin(conf)
        examples.load_ipam(plugin.get("ipam", {}), ())


def test_pod_example_validates_and_requests_the_shared_rdma_device() -> None:
    pod = yaml.safe_load((examples.EXAMPLES / "kubernetes" / "roce-shared-pod.yaml").read_text())
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "roce-shared"
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["rdma/rdma_shared_device_a"] == 1


def test_loaders_reject_a_broken_example() -> None:
    conf: dict[str, Any] = examples.nad_config(examples.EXAMPLES / "kubernetes" / "roce-shared-macvlan.yaml")
    bad = copy.deepcopy(conf)
    bad["mode"] = "bogus"
    with pytest.raises(ConfigError, match="mode"):
        examples.load_plugin(bad)
    sriov = examples.nad_config(examples.EXAMPLES / "kubernetes" / "sriov-vf.yaml")
    with pytest.raises(ConfigError, match="vlan"):
        examples.load_plugin({**sriov, "vlan": 4095})
    with pytest.raises(ConfigError, match="range"):
        examples.load_ipam({"type": "whereabouts", "range": "198.18.0.0/33"}, ())


def test_every_example_type_is_registered() -> None:
    """Every type is parsed by its real loader."""
    used = {examples.nad_config(p)["type"] for p in examples.nads()} | {"whereabouts"}
    for path in examples.conflists():
        used |= {pl["type"] for pl in jsonio.loads(path.read_bytes())["plugins"]}
    assert all(kind in PLUGINS for kind in used), used
