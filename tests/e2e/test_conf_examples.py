"""The macvlan conflists of conf-examples/local run through real libcni in namespaces (against the frozen
entries in the frozen pass): ADD gives an address from the example's range on the pod's interface,
CHECK passes, DEL removes the interface and releases the address."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from tests import examples
from tests.e2e import bundle_driver
from tests.nsutil import Topology


def macvlan_conflists() -> list[Path]:
    return [p for p in examples.conflists()
            if all(pl["type"] == "macvlan" for pl in jsonio.loads(p.read_bytes())["plugins"])]


def localize(doc: dict[str, Any], topo: Topology, tmp: Path) -> dict[str, Any]:
    """Point the example at the test's uplink and keep its state under tmp."""
    for plugin in doc["plugins"]:
        plugin["master"] = topo.uplink
        ipam = plugin.get("ipam", {})
        if "local_db" in ipam:
            ipam["local_db"] = str(tmp / "pycni.db")
        if ipam.get("type") == "host-local":
            ipam["dataDir"] = str(tmp / "host-local")
    return doc


def ranges(ipam: dict[str, Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    if ipam["type"] == "host-local":
        return [ipaddress.ip_network(r["subnet"]) for rs in ipam["ranges"] for r in rs]
    return [ipaddress.ip_network(r["range"]) for r in ([ipam] if "range" in ipam else ipam["ipRanges"])]


@pytest.mark.parametrize("path", macvlan_conflists(), ids=lambda p: p.name)
def test_example_conflist_through_libcni(path: Path, topo: Topology, tmp_path: Path) -> None:
    doc = localize(jsonio.loads(path.read_bytes()), topo, tmp_path)
    ipam = doc["plugins"][0].get("ipam", {})
    conf = tmp_path / path.name
    conf.write_bytes(jsonio.dumps(doc))
    first = None
    for round_ in range(2):
        pod = topo.pod(f"p{round_}")
        add = bundle_driver.drive(topo, "add", conf, tmp_path, netns=pod, container_id=f"c{round_}")
        assert add.ok, (add.out, add.stderr)
        got = [ipaddress.ip_interface(ip["address"]) for ip in add.out["ips"]]
        assert len(got) == len(ranges(ipam))
        assert all(any(ip.ip in net for net in ranges(ipam)) for ip in got), got
        assert sorted(topo.addrs(pod, "net1")) == sorted(str(ip) for ip in got)
        check = bundle_driver.drive(topo, "check", conf, tmp_path, netns=pod, container_id=f"c{round_}")
        assert check.ok, (check.out, check.stderr)
        delete = bundle_driver.drive(topo, "del", conf, tmp_path, netns=pod, container_id=f"c{round_}")
        assert delete.ok, (delete.out, delete.stderr)
        assert topo.link(pod, "net1") is None
        if ipam["type"] == "host-local":  # round-robin: check the reservation files instead
            held = [f.name for f in (tmp_path / "host-local" / doc["name"]).iterdir() if f.name[0].isdigit()]
            assert held == [], "DEL released the address"
        else:
            first = first or got
            assert got == first, "DEL freed the address: the next ADD gets the same lowest one"
