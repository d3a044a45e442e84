"""ADD, CHECK and DEL per version: the result's wire shape, the link in the pod, its addresses and
routes exactly as the IPAM said, and nothing left afterwards."""

from __future__ import annotations

from typing import Any

import pytest

from cni import spec
from tests.integration.macvlan.harness import HOST_LOCAL_VERSIONS, V4_GW, V6_GW, Env, error, ipam_result

# The IPAM returns DNS, but the config has none: like the reference (`result.DNS = n.DNS`) the
# config's dns replaces the IPAM's, so the result carries an empty dns (printed only by 0.x).
DNS: dict[str, Any] = {}
V4_ROUTE = {"dst": "198.18.0.0/15"}
V6_ROUTES = [{"dst": "2001:db8:fe::/48"}, {"dst": "2001:db8:ff::/48", "gw": "2001:db8:1::fe"}]


def expected_wire(version: str, mac: str, sandbox: str) -> dict[str, Any]:
    """What the plugin must print for ipam_result(5) in `version`."""
    v4, v6 = "198.51.100.5/24", "2001:db8:1::5/64"
    if spec.family(version) == "0.2":
        return {"cniVersion": version, "dns": DNS,
                "ip4": {"ip": v4, "gateway": V4_GW, "routes": [V4_ROUTE]},
                "ip6": {"ip": v6, "gateway": V6_GW, "routes": V6_ROUTES}}
    iface: dict[str, Any] = {"name": "net1", "mac": mac, "sandbox": sandbox}
    if version == "1.1.0":
        iface["mtu"] = 1500
    ips: list[dict[str, Any]] = [{"interface": 0, "address": v4, "gateway": V4_GW},
                                 {"interface": 0, "address": v6, "gateway": V6_GW}]
    if spec.family(version) == "0.4":
        ips = [{"version": "4", **ips[0]}, {"version": "6", **ips[1]}]
    out = {"cniVersion": version, "interfaces": [iface], "ips": ips, "routes": [V4_ROUTE, *V6_ROUTES]}
    return out if spec.family(version) == "1" else {**out, "dns": DNS}


def route(routes: list[dict[str, Any]], dst: str) -> dict[str, Any]:
    found = [r for r in routes if r["dst"] == dst]
    assert len(found) == 1, (dst, routes)
    return found[0]


def assert_link_as_configured(env: Env, mac: str) -> None:
    link = env.link()
    assert link["linkinfo"]["info_kind"] == "macvlan"
    assert link["linkinfo"]["info_data"]["mode"] == "bridge"
    assert link["link_index"] == env.host_ifindex(env.topo.uplink)
    assert "link_netnsid" in link  # the master lives in another namespace
    assert link["address"] == mac
    assert link["mtu"] == 1500
    assert "UP" in link["flags"]


def assert_addresses_and_routes(env: Env) -> None:
    assert sorted(env.topo.addrs(env.pod, "net1")) == ["198.51.100.5/24", "2001:db8:1::5/64"]
    tentative = env.topo.ip(env.pod, "-6", "addr", "show", "dev", "net1", "tentative")
    assert "2001:db8:1::5" not in tentative  # dad "on" with a v6 gateway waits for DAD
    v4 = route(env.routes("-4"), "198.18.0.0/15")
    assert (v4["gateway"], v4["dev"]) == (V4_GW, "net1")  # no gw in the IPAM route: the v4 gateway
    v6 = route(env.routes("-6"), "2001:db8:fe::/48")
    assert (v6["gateway"], v6["dev"]) == (V6_GW, "net1")
    v6 = route(env.routes("-6"), "2001:db8:ff::/48")
    assert (v6["gateway"], v6["dev"]) == ("2001:db8:1::fe", "net1")


def test_add_check_del(env: Env) -> None:
    conf = env.conf(dad="on")
    out = env.add(conf)
    mac = env.link()["address"]
    assert out == expected_wire(env.version, mac, env.pod)
    assert_link_as_configured(env, mac)
    assert_addresses_and_routes(env)
    check = env.run("CHECK", {**conf, "prevResult": out})
    if spec.at_least(env.version, "0.4.0"):
        assert check.ok, check.out
    else:
        error(check, 1, "CHECK", "0.4.0")
    assert env.run("DEL", {**conf, "prevResult": out}).ok
    assert env.pod_links() == ["lo"]
    assert env.allocations() == []
    commands = [c[0] for c in env.calls()]
    assert commands == (["ADD", "CHECK", "DEL"] if check.ok else ["ADD", "DEL"])
    assert {c[1:] for c in env.calls()} == {("c1", "net1")}


@pytest.mark.parametrize("version", HOST_LOCAL_VERSIONS)
def test_round_trip_with_host_local(env: Env) -> None:
    ipam = env.host_local(gateway="198.51.100.1")
    ipam["routes"] = [{"dst": "198.18.0.0/15"}]
    conf = env.conf(ipam)
    out = env.add(conf)
    assert env.host_local_ips() == ["198.51.100.2"]
    assert env.topo.addrs(env.pod, "net1") == ["198.51.100.2/24"]
    assert route(env.routes("-4"), "198.18.0.0/15")["gateway"] == "198.51.100.1"
    ip = out["ip4"]["ip"] if spec.family(env.version) == "0.2" else out["ips"][0]["address"]
    assert ip == "198.51.100.2/24"
    if spec.at_least(env.version, "0.4.0"):
        check = env.run("CHECK", {**conf, "prevResult": out})
        assert check.ok, check.out
    assert env.run("DEL", conf).ok
    assert env.pod_links() == ["lo"]
    assert env.host_local_ips() == []


def test_default_routes(env: Env) -> None:
    result = ipam_result()
    result["routes"] = [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
    conf = env.conf(env.fake_ipam(result))
    out = env.add(conf)
    assert route(env.routes("-4"), "default")["gateway"] == V4_GW
    assert route(env.routes("-6"), "default")["gateway"] == V6_GW
    if spec.at_least(env.version, "0.4.0"):
        assert env.run("CHECK", {**conf, "prevResult": out}).ok
        env.topo.ip(env.pod, "-6", "route", "del", "default")
        error(env.run("CHECK", {**conf, "prevResult": out}), 105, "::/0")
    assert env.run("DEL", conf).ok


@pytest.mark.parametrize("version", ["1.1.0"])  # route mtu/advmss/priority/table exist from 1.1.0 on
def test_route_attributes(env: Env) -> None:
    result = ipam_result()
    result["routes"] = [{"dst": "198.18.0.0/15", "table": 100, "priority": 50, "mtu": 1400, "advmss": 1360}]
    conf = env.conf(env.fake_ipam(result))
    out = env.add(conf)
    assert out["routes"] == result["routes"]
    kernel = env.topo.ip(env.pod, "route", "show", "table", "100")
    assert "198.18.0.0/15 via 198.51.100.1 dev net1 metric 50 mtu 1400 advmss 1360" in kernel
    assert env.run("CHECK", {**conf, "prevResult": out}).ok
    assert env.run("DEL", conf).ok
