"""The `rail` option in sriov and host-device (the same module as macvlan's, cni.plugins.rail): two
devices of one pod become rails (sysctls, a table each, the rules of their addresses), CHECK passes
and sees a missing rule, DEL removes exactly each one's rules before the device goes home, and a
failure after the rail step rolls it all back. The devices are veth ends named by a fake sysfs tree
(tests/devlab.py); the traffic over rails is tests/integration/test_rail.py's."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cni import jsonio
from tests.devlab import VF_PCIS, Lab
from tests.nsutil import sh

pytestmark = pytest.mark.root


def rail_rules(pod: str, family: str = "-4") -> set[tuple[str, str]]:
    out = sh("ip", "-j", family, "-n", os.path.basename(pod), "rule", "show", "priority", "1000").stdout
    return {(r["src"], r["table"]) for r in (jsonio.loads(out) if out.strip() else [])}


def table(pod: str, number: str) -> set[tuple[str, str | None]]:
    out = sh("ip", "-j", "-n", os.path.basename(pod), "route", "show", "table", number).stdout
    return {(r["dst"], r.get("gateway")) for r in (jsonio.loads(out) if out.strip() else [])}


def sysctl(pod: str, key: str) -> str:
    return sh("ip", "netns", "exec", os.path.basename(pod), "sysctl", "-n", key).stdout.strip()


def selectors(lab: Lab, plugin: str) -> list[dict[str, Any]]:
    if plugin == "sriov":
        return [{"deviceID": VF_PCIS[0]}, {"deviceID": VF_PCIS[1]}]
    return [{"device": lab.nic}, {"device": lab.sf}]


def ipam(lab: Lab, n: int) -> dict[str, Any]:
    return {"type": "static", "addresses": [
        {"address": f"198.18.{n}.5/24", "gateway": f"198.18.{n}.1"},
        {"address": f"2001:db8:{n + 1}::5/64", "gateway": f"2001:db8:{n + 1}::1"}]}


@pytest.mark.parametrize("plugin", ["sriov", "host-device"])
def test_two_device_rails(lab: Lab, plugin: str) -> None:
    pod = lab.topo.pod()
    confs, results = [], []
    for n, sel in enumerate(selectors(lab, plugin)):
        conf = lab.conf(plugin, ipam=ipam(lab, n), rail=True, dad="off",
                        sysctl={"net.ipv4.conf.IFNAME.arp_notify": "1"}, **sel)
        add = lab.run(plugin, "ADD", conf, netns=pod, ifname=f"net{n + 1}")
        assert add.ok, (add.out, add.stderr)
        confs.append(conf)
        results.append(add.out)
    tables = {}
    for n in range(2):
        shown = sh("ip", "-j", "-n", os.path.basename(pod), "link", "show", f"net{n + 1}").stdout
        index = jsonio.loads(shown)
        tables[n] = str(100 + index[0]["ifindex"])
        assert table(pod, tables[n]) == {(f"198.18.{n}.0/24", None), ("default", f"198.18.{n}.1")}
        for key, value in (("arp_ignore", "1"), ("arp_announce", "2"), ("rp_filter", "2"),
                           ("arp_notify", "1")):
            assert sysctl(pod, f"net.ipv4.conf.net{n + 1}.{key}") == value
    assert rail_rules(pod) == {(f"198.18.{n}.5", tables[n]) for n in range(2)}
    assert rail_rules(pod, "-6") == {(f"2001:db8:{n + 1}::5", tables[n]) for n in range(2)}
    for n in range(2):
        check = lab.run(plugin, "CHECK", {**confs[n], "prevResult": results[n]}, netns=pod,
                        ifname=f"net{n + 1}")
        assert check.ok, (check.out, check.stderr)
    sh("ip", "-n", os.path.basename(pod), "rule", "del", "from", "198.18.1.5", "priority", "1000")
    check = lab.run(plugin, "CHECK", {**confs[1], "prevResult": results[1]}, netns=pod, ifname="net2")
    assert check.out["code"] == 105 and "198.18.1.5" in check.out["msg"], check.out
    delete = lab.run(plugin, "DEL", {**confs[0], "prevResult": results[0]}, netns=pod, ifname="net1")
    assert delete.ok, (delete.out, delete.stderr)
    assert rail_rules(pod) == set() and rail_rules(pod, "-6") == {("2001:db8:2::5", tables[1])}
    assert table(pod, tables[1]) == {("198.18.1.0/24", None), ("default", "198.18.1.1")}
    for _ in range(2):
        assert lab.run(plugin, "DEL", {**confs[1], "prevResult": results[1]}, netns=pod, ifname="net2").ok
    assert rail_rules(pod, "-6") == set()
    assert lab.records() == {"attachments": [], "owners": []}


@pytest.mark.parametrize("plugin", ["sriov", "host-device"])
def test_failure_after_the_rail_step_rolls_it_back(lab: Lab, plugin: str) -> None:
    pod = lab.topo.pod()
    conf = lab.conf(plugin, ipam=ipam(lab, 0), rail=True, dad="off", **selectors(lab, plugin)[0])
    add = lab.run(plugin, "ADD", conf, netns=pod, faults="rail")
    assert not add.ok and "injected fault" in add.out["msg"], add.out
    assert rail_rules(pod) == set() and rail_rules(pod, "-6") == set()
    assert lab.topo.link(pod, "net1") is None
    assert lab.records() == {"attachments": [], "owners": []}


@pytest.mark.parametrize("plugin", ["sriov", "host-device"])
def test_foreign_sysctl_refused(lab: Lab, plugin: str) -> None:
    pod = lab.topo.pod()
    conf = lab.conf(plugin, rail=True, sysctl={"net.ipv4.conf.all.forwarding": "1"},
                    **selectors(lab, plugin)[0])
    add = lab.run(plugin, "ADD", conf, netns=pod)
    assert add.out["code"] == 7 and "sysctl.net.ipv4.conf.all.forwarding" in add.out["msg"], add.out
    assert lab.topo.link(pod, "net1") is None
