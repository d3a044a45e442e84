"""CHECK compares the pod's link, addresses and routes with prevResult and names what differs (105).
CHECK exists from 0.4.0 on; older configs get code 1 (test_check_needs_040)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.macvlan.harness import CHECK_VERSIONS, PRE_CHECK_VERSIONS, Env, error

checkable = pytest.mark.parametrize("version", CHECK_VERSIONS)


def added(env: Env, **fields: Any) -> dict[str, Any]:
    conf = env.conf(**fields)
    out = env.add(conf)
    ok = env.run("CHECK", {**conf, "prevResult": out})
    assert ok.ok, ok.out  # CHECK passes right after ADD, so any later failure is the change's
    return {**conf, "prevResult": out}


@checkable
def test_address_removed(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "addr", "del", "2001:db8:1::5/64", "dev", "net1")
    error(env.run("CHECK", conf), 105, "net1", "2001:db8:1::5/64")


@checkable
def test_route_removed(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "route", "del", "198.18.0.0/15")
    error(env.run("CHECK", conf), 105, "net1", "198.18.0.0/15")


@checkable
def test_route_gateway_changed(env: Env) -> None:
    """prevResult's 198.18.0.0/15 has no gw, so it was added via the v4 gateway; another one is drift."""
    conf = added(env)
    env.topo.ip(env.pod, "route", "replace", "198.18.0.0/15", "via", "198.51.100.2", "dev", "net1")
    error(env.run("CHECK", conf), 105, "net1", "198.18.0.0/15", "198.51.100.1")


@checkable
def test_mode_changed(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "link", "set", "net1", "type", "macvlan", "mode", "vepa")
    error(env.run("CHECK", conf), 105, "net1", "mode", "vepa", "bridge")


@checkable
def test_mac_changed(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "link", "set", "net1", "address", "02:00:5e:10:00:01")
    error(env.run("CHECK", conf), 105, "net1", "MAC", "02:00:5e:10:00:01")


@checkable
def test_link_gone(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "link", "del", "net1")
    error(env.run("CHECK", conf), 105, "net1", env.pod)


@checkable
def test_not_a_macvlan(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "link", "del", "net1")
    env.topo.ip(env.pod, "link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    error(env.run("CHECK", conf), 105, "net1", "veth", "macvlan")


@checkable
def test_prev_result_required(env: Env) -> None:
    conf = added(env)
    del conf["prevResult"]
    error(env.run("CHECK", conf), 7, "prevResult")


@checkable
def test_ipam_check_is_forwarded(env: Env) -> None:
    """CHECK reaches the IPAM: once the fake's allocation is gone, CHECK fails with its error."""
    conf = added(env)
    assert env.calls()[-1] == ("CHECK", "c1", "net1")
    (env.state / "alloc" / "c1--net1").unlink()
    error(env.run("CHECK", conf), 105, "fakeipam", "no allocation")


@pytest.mark.parametrize("version", PRE_CHECK_VERSIONS)
def test_check_needs_040(env: Env) -> None:
    conf = env.conf()
    out = env.add(conf)
    error(env.run("CHECK", {**conf, "prevResult": out}), 1, "CHECK", "0.4.0")
    assert [c[0] for c in env.calls()] == ["ADD"]
    assert env.run("DEL", conf).ok
