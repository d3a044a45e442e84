"""STATUS and GC (spec 1.1.0; older configs get code 1), and the guard against CNI_NETNS naming the
plugin's own namespace (code 8, nothing touched)."""

from __future__ import annotations

import pytest

from cni import spec
from tests.integration.macvlan.harness import Env, error

OLDER = tuple(v for v in spec.SUPPORTED if v != "1.1.0")
v110 = pytest.mark.parametrize("version", ["1.1.0"])


@v110
def test_status_ok(env: Env) -> None:
    call = env.run("STATUS", env.conf(), netns="", ifname="", container_id="")
    assert call.ok, call.out
    assert call.out is None
    assert env.calls() == [("STATUS", "", "")]  # forwarded to the IPAM


@v110
def test_status_master_missing(env: Env) -> None:
    call = env.run("STATUS", env.conf(master="nosuchdev0"), netns="", ifname="", container_id="")
    error(call, 50, "master", "nosuchdev0")


@v110
def test_status_ipam_not_ready(env: Env) -> None:
    call = env.run("STATUS", env.conf(env.fake_ipam(failOn=["STATUS"])), netns="", ifname="", container_id="")
    error(call, 11, "fakeipam")


@v110
def test_gc_reaches_the_ipam(env: Env) -> None:
    conf = env.conf()
    env.add(conf, container_id="keep")
    other = env.new_pod("q")
    env.add(conf, container_id="stale", netns=other)
    gc = {**conf, "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "net1"}]}
    call = env.run("GC", gc, netns="", ifname="", container_id="")
    assert call.ok, call.out
    assert env.allocations() == ["keep--net1"]
    assert env.pod_links() == ["lo", "net1"]  # GC touches no link
    for cid, pod in (("keep", env.pod), ("stale", other)):
        assert env.run("DEL", conf, container_id=cid, netns=pod).ok


@pytest.mark.parametrize("version", OLDER)
@pytest.mark.parametrize("command", ["STATUS", "GC"])
def test_status_gc_need_110(env: Env, command: str) -> None:
    call = env.run(command, env.conf(), netns="", ifname="", container_id="")
    error(call, 1, command, "1.1.0")
    assert env.calls() == []


@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_own_netns_refused(env: Env, command: str) -> None:
    """CNI_NETNS is the namespace the plugin runs in (the host's): code 8, and a macvlan there with
    the requested name survives."""
    victim = f"{env.topo.tag}mv"
    env.topo.ip(env.topo.host, "link", "add", victim, "link", env.topo.uplink, "type", "macvlan")
    host_ns = f"/run/netns/{env.topo.host}"
    conf = env.conf()
    if command == "CHECK":
        conf["prevResult"] = {"cniVersion": env.version, "interfaces": [{"name": victim, "sandbox": host_ns}]}
    call = env.run(command, conf, netns=host_ns, ifname=victim)
    if command == "CHECK" and not spec.at_least(env.version, "0.4.0"):
        error(call, 1, "CHECK")
    else:
        error(call, 8, host_ns)
    assert env.topo.link(env.topo.host, victim) is not None
    assert env.calls() == []


@v110
def test_gc_without_ipam(env: Env) -> None:
    call = env.run("GC", env.conf(ipam={}), netns="", ifname="", container_id="")
    assert call.ok, call.out
    assert env.calls() == []
