"""The `rail` option's life cycle on one macvlan (the traffic is tests/integration/test_rail.py): what
ADD sets (sysctls, table, rules; the table's routes in a 1.1 result), CHECK, a repeated application,
DEL of exactly its own rules (another rail of the pod keeps its own), DEL without the namespace, a
failed ADD rolled back, and the configuration errors."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cni import spec
from tests.integration.macvlan.harness import Env, error, ipam_result
from tests.nsutil import sh


def rules(env: Env, family: str = "-4") -> list[dict[str, Any]]:
    out = sh("ip", "-j", family, "-n", os.path.basename(env.pod), "rule", "show").stdout
    return [r for r in (eval_json(out)) if r.get("priority") == 1000]


def eval_json(out: str) -> list[dict[str, Any]]:
    from cni import jsonio

    return list(jsonio.loads(out)) if out.strip() else []


def table(env: Env, number: int, family: str = "-4") -> list[dict[str, Any]]:
    pod = os.path.basename(env.pod)
    out = sh("ip", "-j", family, "-n", pod, "route", "show", "table", str(number)).stdout
    return eval_json(out)


def sysctl(env: Env, key: str) -> str:
    return sh("ip", "netns", "exec", os.path.basename(env.pod), "sysctl", "-n", key).stdout.strip()


def prev(conf: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    return {**conf, "prevResult": result}


def test_add_check_del(env: Env) -> None:
    conf = env.conf(rail=True, sysctl={"net.ipv4.conf.IFNAME.arp_notify": "1",
                                       "net.ipv6.conf.net1.accept_ra": "0"})
    result = env.add(conf)
    index = int(env.link()["ifindex"])
    number = 100 + index
    assert [(r["src"], r["table"]) for r in rules(env)] == [("198.51.100.5", str(number))]
    assert [(r["src"], r["table"]) for r in rules(env, "-6")] == [("2001:db8:1::5", str(number))]
    v4 = {(r["dst"], r.get("gateway")) for r in table(env, number)}
    assert v4 == {("198.51.100.0/24", None), ("198.18.0.0/15", "198.51.100.1"), ("default", "198.51.100.1")}
    v6 = {(r["dst"], r.get("gateway")) for r in table(env, number, "-6")}
    assert v6 == {("2001:db8:1::/64", None), ("2001:db8:fe::/48", "2001:db8:1::1"),
                  ("2001:db8:ff::/48", "2001:db8:1::fe"), ("default", "2001:db8:1::1")}
    for key, value in (("arp_ignore", "1"), ("arp_announce", "2"), ("rp_filter", "2"), ("arp_notify", "1")):
        assert sysctl(env, f"net.ipv4.conf.net1.{key}") == value
    assert sysctl(env, "net.ipv6.conf.net1.accept_ra") == "0"
    if spec.at_least(env.version, "0.3.0"):  # 0.1/0.2 results keep routes per family
        tables = {r.get("table") for r in result["routes"]}
        assert tables == ({None, number} if env.version == "1.1.0" else {None})
    if spec.at_least(env.version, "0.4.0"):
        assert env.run("CHECK", prev(conf, result)).ok
        pod = os.path.basename(env.pod)
        sh("ip", "netns", "exec", pod, "sysctl", "-qw", "net.ipv4.conf.net1.arp_ignore=0")
        error(env.run("CHECK", prev(conf, result)), 105, "arp_ignore")
        sh("ip", "netns", "exec", pod, "sysctl", "-qw", "net.ipv4.conf.net1.arp_ignore=1")
        sh("ip", "-n", os.path.basename(env.pod), "rule", "del", "from", "198.51.100.5", "priority", "1000")
        error(env.run("CHECK", prev(conf, result)), 105, "198.51.100.5")
        sh("ip", "-n", os.path.basename(env.pod), "rule", "add", "from", "198.51.100.5", "table",
           str(number), "priority", "1000")
        sh("ip", "-n", os.path.basename(env.pod), "route", "del", "default", "table", str(number))
        error(env.run("CHECK", prev(conf, result)), 105, f"table {number}")
    for _ in range(2):
        assert env.run("DEL", prev(conf, result)).ok
        assert rules(env) == [] and rules(env, "-6") == [] and table(env, number) == []


def test_del_leaves_other_rails_alone(env: Env) -> None:
    first = env.conf(rail=True)
    env.add(first)
    other = ipam_result(6)
    second = env.conf(env.fake_ipam(other), rail={"table": 1234})
    env.add(second, ifname="net2", container_id="c1")
    own = str(100 + int(env.link()["ifindex"]))
    assert {(r["src"], r["table"]) for r in rules(env)} == {("198.51.100.5", own), ("198.51.100.6", "1234")}
    assert env.run("DEL", first).ok
    assert [(r["src"], r["table"]) for r in rules(env)] == [("198.51.100.6", "1234")]
    assert {r["dst"] for r in table(env, 1234)} == {"198.51.100.0/24", "198.18.0.0/15", "default"}
    assert env.run("DEL", second, ifname="net2").ok
    assert rules(env) == [] and table(env, 1234) == []


def test_del_when_the_link_is_gone(env: Env) -> None:
    """The rules of the interface's addresses go by prevResult when the link is no longer there (a
    0.1.0/0.2.0 result names no interface: its addresses are the attachment's own)."""
    conf = env.conf(rail=True)
    result = env.add(conf)
    sh("ip", "-n", os.path.basename(env.pod), "link", "del", "net1")
    assert len(rules(env)) == 1
    assert env.run("DEL", prev(conf, result)).ok
    assert rules(env) == [] and rules(env, "-6") == []


def test_sysctl_value_refused_by_the_kernel(env: Env) -> None:
    error(env.run("ADD", env.conf(sysctl={"net.ipv4.conf.net1.arp_ignore": "nine"})), 7,
          "sysctl.net.ipv4.conf.net1.arp_ignore", "nine")
    assert "net1" not in env.pod_links()
    assert env.allocations() == []


def test_del_without_the_namespace(env: Env) -> None:
    conf = env.conf(rail=True)
    env.add(conf)
    assert env.run("DEL", conf, netns="").ok
    assert env.run("DEL", conf, netns="/run/netns/pycni-test-no-such-netns").ok


def test_failed_add_is_rolled_back(env: Env) -> None:
    conf = env.conf(rail=True)
    call = env.topo.run("macvlan", "ADD", conf, netns=env.pod, path="", env=env.extra_env,
                        seams=["--faults", "rail"])
    assert not call.ok
    assert rules(env) == [] and rules(env, "-6") == []
    assert "net1" not in env.pod_links()
    assert env.allocations() == []


@pytest.mark.parametrize(("fields", "words"), [
    ({"rail": "yes"}, ["rail", "true"]),
    ({"rail": {"tabel": 5}}, ["rail.tabel"]),
    ({"rail": {"table": 254}}, ["rail.table", "reserved"]),
    ({"rail": {"table": -1}}, ["rail.table"]),
    ({"sysctl": {"net.ipv4.conf.all.rp_filter": "0"}}, ["sysctl.net.ipv4.conf.all.rp_filter"]),
    ({"sysctl": {"net.core.somaxconn": "5"}}, ["sysctl.net.core.somaxconn"]),
    ({"sysctl": {"net.ipv4.conf.net1.arp_ignore": 1}}, ["sysctl.net.ipv4.conf.net1.arp_ignore", "string"]),
    ({"sysctl": {"net.ipv4.conf.net1.no_such_thing": "1"}}, ["net.ipv4.conf.net1.no_such_thing"]),
])
def test_config_errors(env: Env, fields: dict[str, Any], words: list[str]) -> None:
    error(env.run("ADD", env.conf(**fields)), 7, *words)
    assert "net1" not in env.pod_links()
    assert env.allocations() == []
