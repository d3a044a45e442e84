"""Configuration as the kernel sees it: modes, MTU, MAC precedence, bcqueuelen, the default master,
linkInContainer, interface-name clashes, and errors that name what is wrong before anything exists."""

from __future__ import annotations

from typing import Any

import pytest

from cni import spec
from tests.integration.macvlan.harness import Env, error


def info(env: Env, name: str = "net1") -> dict[str, Any]:
    return dict(env.link(name)["linkinfo"]["info_data"])


def assert_nothing_happened(env: Env) -> None:
    assert env.pod_links() == ["lo"]
    assert env.calls() == []  # the IPAM was not even asked


@pytest.mark.parametrize("mode", ["private", "vepa", "passthru"])
def test_mode(env: Env, mode: str) -> None:
    conf = env.conf(mode=mode)
    env.add(conf)
    assert info(env)["mode"] == mode
    assert env.link()["link_index"] == env.host_ifindex(env.topo.uplink)
    assert env.run("DEL", conf).ok
    assert env.pod_links() == ["lo"]


def test_unknown_mode(env: Env) -> None:
    error(env.run("ADD", env.conf(mode="source")), 7, "mode", "source")
    assert_nothing_happened(env)


def test_mtu_below_master(env: Env) -> None:
    conf = env.conf(mtu=1400)
    env.add(conf)
    assert env.link()["mtu"] == 1400
    assert env.run("DEL", conf).ok


def test_mtu_above_master(env: Env) -> None:
    error(env.run("ADD", env.conf(mtu=9000)), 7, "mtu", "9000", env.topo.uplink, "1500")
    assert_nothing_happened(env)


MACS = {"conf": "02:00:5e:00:00:01", "cni_args": "02:00:5e:00:00:02", "args": "02:00:5e:00:00:03",
        "runtime": "02:00:5e:00:00:04"}


@pytest.mark.parametrize("upto", list(MACS))
def test_mac_precedence(env: Env, upto: str) -> None:
    """Sources are applied in the order config < CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac;
    with every source up to `upto` set, the last one wins."""
    given = list(MACS)[: list(MACS).index(upto) + 1]
    fields: dict[str, Any] = {"mac": MACS["conf"]}
    if "args" in given:
        fields["args"] = {"cni": {"mac": MACS["args"]}}
    if "runtime" in given:
        fields["runtimeConfig"] = {"mac": MACS["runtime"]}
    cni_args = f"IgnoreUnknown=true;K8S_POD_NAME=p1;MAC={MACS['cni_args']}" if "cni_args" in given else ""
    conf = env.conf(**fields)
    out = env.add(conf, cni_args=cni_args)
    assert env.link()["address"] == MACS[upto]
    if spec.family(env.version) != "0.2":
        assert out["interfaces"][0]["mac"] == MACS[upto]
    assert env.run("DEL", conf, cni_args=cni_args).ok


def test_bad_mac(env: Env) -> None:
    error(env.run("ADD", env.conf(runtimeConfig={"mac": "02:00:5e:00:00"})), 7, "runtimeConfig.mac")
    assert_nothing_happened(env)


def test_bcqueuelen(env: Env) -> None:
    conf = env.conf(bcqueuelen=2000)
    env.add(conf)
    assert info(env)["bcqueuelen"] == 2000
    assert env.run("DEL", conf).ok


def test_default_master_from_default_route(env: Env) -> None:
    other = env.topo.add_uplink("u2")  # the default route's interface is not the first veth
    env.topo.ip(env.topo.host, "addr", "add", "198.51.100.254/24", "dev", other)
    env.topo.ip(env.topo.host, "route", "add", "default", "via", "198.51.100.1", "dev", other)
    conf = env.conf(master=None)
    assert "master" not in conf
    env.add(conf)
    assert env.link()["link_index"] == env.host_ifindex(other)
    assert env.run("DEL", conf).ok


def test_no_master_and_no_default_route(env: Env) -> None:
    error(env.run("ADD", env.conf(master=None)), 7, "master", "default route", "host network namespace")
    assert_nothing_happened(env)


def test_missing_master(env: Env) -> None:
    call = env.run("ADD", env.conf(master="nosuchdev0"))
    error(call, 7, "master", '"nosuchdev0"', "host network namespace")
    assert_nothing_happened(env)


def test_link_in_container(env: Env) -> None:
    """The master lives in the pod (a veth end moved there): the macvlan is made on it in place."""
    env.topo.ip(env.pod, "link", "add", "pm0", "type", "veth", "peer", "name", "pm0peer")
    for dev in ("pm0", "pm0peer"):
        env.topo.ip(env.pod, "link", "set", dev, "up")
    conf = env.conf(master="pm0", linkInContainer=True)
    env.add(conf)
    link = env.link()
    assert link["link"] == "pm0"  # ip names the master when it is in the same namespace
    assert env.topo.addrs(env.pod, "net1") == ["198.51.100.5/24", "2001:db8:1::5/64"]
    assert env.run("DEL", conf).ok
    assert env.pod_links() == ["lo", "pm0", "pm0peer"]


def test_link_in_container_missing_master(env: Env) -> None:
    """The uplink exists in the host namespace, but linkInContainer looks in the pod."""
    error(env.run("ADD", env.conf(linkInContainer=True)), 7, "master", env.topo.uplink, env.pod)
    assert_nothing_happened(env)


def test_ifname_taken(env: Env) -> None:
    env.topo.ip(env.pod, "link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    error(env.run("ADD", env.conf()), 101, "net1", env.pod)
    assert env.pod_links() == ["lo", "net1", "net1peer"]
    assert env.link()["linkinfo"]["info_kind"] == "veth"
    assert env.calls() == []
    assert env.allocations() == []


def test_ifname_same_as_host_interface(env: Env) -> None:
    """The link is born under a temporary name directly in the pod, so a host name is no clash."""
    name = env.topo.uplink
    conf = env.conf()
    env.add(conf, ifname=name)
    assert env.link(name)["linkinfo"]["info_kind"] == "macvlan"
    assert env.topo.link(env.topo.host, name) is not None
    assert env.run("DEL", conf, ifname=name).ok
    assert env.pod_links() == ["lo"]
    host_link = env.topo.link(env.topo.host, name)
    assert host_link is not None and host_link["linkinfo"]["info_kind"] == "veth"


@pytest.mark.parametrize("ipam", ["absent", "empty"])
def test_l2_only(env: Env, ipam: str) -> None:
    conf = env.conf()
    if ipam == "absent":
        del conf["ipam"]
    else:
        conf["ipam"] = {}
    call = env.run("ADD", conf)
    if spec.family(env.version) == "0.2":
        # a 0.1.0/0.2.0 result has no place for an interface without addresses: refused, undone
        error(call, 7, env.version)
        assert env.pod_links() == ["lo"]
        return
    assert call.ok, call.out
    assert set(call.out) <= {"cniVersion", "interfaces", "dns"}
    assert call.out["interfaces"][0]["name"] == "net1"
    assert "UP" in env.link()["flags"]
    assert env.topo.addrs(env.pod, "net1") == []
    assert env.run("DEL", conf).ok
    assert env.pod_links() == ["lo"]
    assert env.calls() == []


def test_mtu_defaults_to_master(env: Env) -> None:
    jumbo = env.topo.add_uplink("u9", mtu=9000)
    conf = env.conf(master=jumbo)
    out = env.add(conf)
    assert env.link()["mtu"] == 9000
    if env.version == "1.1.0":
        assert out["interfaces"][0]["mtu"] == 9000
    assert env.run("DEL", conf).ok


def test_dns_from_config_replaces_ipam_dns(env: Env) -> None:
    dns = {"nameservers": ["198.51.100.54"], "search": ["example.test"]}
    conf = env.conf(dns=dns)
    out = env.add(conf)
    assert out["dns"] == dns
    assert env.run("DEL", conf).ok


def test_link_in_container_default_master(env: Env) -> None:
    """With linkInContainer and no master, the default route is looked up in the pod."""
    env.topo.ip(env.pod, "link", "add", "pm0", "type", "veth", "peer", "name", "pm0peer")
    for dev in ("pm0", "pm0peer"):
        env.topo.ip(env.pod, "link", "set", dev, "up")
    env.topo.ip(env.pod, "addr", "add", "198.18.5.2/24", "dev", "pm0")
    env.topo.ip(env.pod, "route", "add", "default", "via", "198.18.5.1")
    conf = env.conf(master=None, linkInContainer=True)
    env.add(conf)
    assert env.link()["link"] == "pm0"
    assert env.run("DEL", conf).ok
    assert env.pod_links() == ["lo", "pm0", "pm0peer"]
