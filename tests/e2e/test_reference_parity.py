"""pycni's macvlan against Debian's, through real libcni, with Debian's host-local/static as IPAM and
tuning chained after it: the same conflist, every cniVersion libcni 1.1.2 accepts, compared field by field
(result JSON and the link inside the namespace). Differences are listed in the assertion message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.harness import E2E, compare
from tests.e2e.libcni import VERSIONS

NAME = "e2enet"
TUNED_MAC = "02:00:5e:c0:00:01"
CONFIG_MAC = "02:00:5e:c0:00:02"
CAP_MAC = "02:00:5e:c0:00:03"


def host_local(data_dir: str, *ranges: list[dict[str, str]], routes: list[dict[str, str]]) -> dict[str, Any]:
    return {"type": "host-local", "dataDir": data_dir, "ranges": list(ranges), "routes": routes}


def tuning(**options: Any) -> dict[str, Any]:
    return {"type": "tuning", **options}


@dataclass(frozen=True)
class Scenario:
    """A conflist builder (version, master, host-local dataDir -> conflist) and how to look at it."""

    build: Callable[[str, str, str], dict[str, Any]]
    mac: str = ""  # the MAC the link must end up with; "" when the kernel picks one at random
    sysctl_keys: tuple[str, ...] = ()
    cni_args: str = ""
    cap_args: dict[str, Any] | None = None
    min_version: str = "0.1.0"


def _hostlocal_tuning(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """host-local v4 under a bridge-mode macvlan with its own MTU; tuning sets MAC, MTU, promisc, a sysctl."""
    return {"cniVersion": version, "name": NAME, "plugins": [
        {"type": "macvlan", "master": master, "mode": "bridge", "mtu": 1450,
         "ipam": host_local(data_dir, [{"subnet": "198.51.100.0/24", "gateway": "198.51.100.1"}],
                            routes=[{"dst": "198.18.0.0/15", "gw": "198.51.100.254"}])},
        tuning(mac=TUNED_MAC, mtu=1400, promisc=True, sysctl={"net.ipv4.conf.net1.arp_filter": "1"}),
    ]}


def _dualstack_dad(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """host-local dual-stack with an IPv6 gateway (both plugins wait for DAD), private mode."""
    return {"cniVersion": version, "name": NAME, "plugins": [
        {"type": "macvlan", "master": master, "mode": "private",
         "ipam": host_local(data_dir,
                            [{"subnet": "198.18.10.0/24", "gateway": "198.18.10.1"}],
                            [{"subnet": "2001:db8:10::/64", "gateway": "2001:db8:10::1"}],
                            routes=[{"dst": "0.0.0.0/0", "gw": "198.18.10.1"},
                                    {"dst": "2001:db8:20::/48", "gw": "2001:db8:10::1"}])},
        tuning(sysctl={"net.ipv6.conf.net1.hop_limit": "33"}),
    ]}


def _static_dns(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """static IPAM (v4 with gateway, v6 without), routes and DNS from the IPAM, vepa mode, config MAC."""
    del data_dir
    return {"cniVersion": version, "name": NAME, "plugins": [
        {"type": "macvlan", "master": master, "mode": "vepa", "mac": CONFIG_MAC,
         "ipam": {"type": "static",
                  "addresses": [{"address": "198.18.5.10/24", "gateway": "198.18.5.1"},
                                {"address": "2001:db8:5::10/64"}],
                  "routes": [{"dst": "198.51.100.0/24", "gw": "198.18.5.1"},
                             {"dst": "2001:db8:6::/48", "gw": "2001:db8:5::1"}],
                  "dns": {"nameservers": ["198.18.5.53"], "domain": "example.test",
                          "search": ["example.test"]}}},
        tuning(promisc=True, sysctl={"net.ipv4.conf.net1.arp_ignore": "1"}),
    ]}


def _static_config_dns(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """DNS in the macvlan config replaces the IPAM's; passthru mode; no tuning."""
    conf = _static_dns(version, master, data_dir)
    conf["plugins"] = [{**conf["plugins"][0], "mode": "passthru", "dns": {"nameservers": ["2001:db8:5::53"]}}]
    conf["plugins"][0].pop("mac")
    return conf


def _l2_only(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """No IPAM (`"ipam": {}`): link only, up; tuning sets the MTU."""
    del data_dir
    return {"cniVersion": version, "name": NAME, "plugins": [
        {"type": "macvlan", "master": master, "ipam": {}}, tuning(mtu=1300)]}


def _mac_sources(version: str, master: str, data_dir: str) -> dict[str, Any]:
    """MAC from config, CNI_ARGS and runtimeConfig (capability): runtimeConfig wins."""
    return {"cniVersion": version, "name": NAME, "plugins": [
        {"type": "macvlan", "master": master, "mac": CONFIG_MAC, "capabilities": {"mac": True},
         "ipam": host_local(data_dir, [{"subnet": "198.51.100.0/25"}], routes=[])},
    ]}


SCENARIOS = {
    "host-local+tuning": Scenario(_hostlocal_tuning, mac=TUNED_MAC,
                                  sysctl_keys=("net.ipv4.conf.net1.arp_filter",)),
    "dual-stack+dad": Scenario(_dualstack_dad, sysctl_keys=(
        "net.ipv6.conf.net1.hop_limit", "net.ipv6.conf.net1.disable_ipv6",
        "net.ipv6.conf.net1.keep_addr_on_down", "net.ipv6.conf.lo.disable_ipv6")),
    "static+dns": Scenario(_static_dns, mac=CONFIG_MAC, sysctl_keys=(
        "net.ipv4.conf.net1.arp_ignore", "net.ipv6.conf.net1.keep_addr_on_down")),
    "config-dns+passthru": Scenario(_static_config_dns),
    "l2-only": Scenario(_l2_only, min_version="0.3.0"),
    "mac-precedence": Scenario(_mac_sources, mac=CAP_MAC,
                               cni_args="IgnoreUnknown=true;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=pod;"
                                        "MAC=02:00:5e:c0:00:04",
                               cap_args={"mac": CAP_MAC}),
}


def _cases() -> list[Any]:
    from cni import spec

    return [pytest.param(name, v, id=f"{name}-{v}") for name, s in SCENARIOS.items() for v in VERSIONS
            if spec.at_least(v, s.min_version)]


@pytest.mark.parametrize(("scenario", "version"), _cases())
def test_same_as_reference(e2e: E2E, scenario: str, version: str) -> None:
    s = SCENARIOS[scenario]

    def make(data_dir: str) -> dict[str, Any]:
        return s.build(version, e2e.topo.uplink, data_dir)

    kw: dict[str, Any] = {"random_mac": not s.mac, "sysctl_keys": s.sysctl_keys, "cni_args": s.cni_args,
                          "cap_args": s.cap_args}
    ref = e2e.attach(e2e.reference, make, **kw)
    ours = e2e.attach(e2e.pycni, make, **kw)
    assert ref.add.ok, f"the reference failed, the scenario is wrong: {ref.add.out} {ref.add.stderr}"
    diffs = compare(ref, ours)
    if s.mac:
        assert ours.state["real_mac"] == s.mac, f"pycni's link has MAC {ours.state['real_mac']}, not {s.mac}"
    assert not diffs, "pycni differs from Debian's macvlan:\n  " + "\n  ".join(diffs)
