"""Smoke: a macvlan ADD/CHECK/DEL round trip with host-local, from source."""

from __future__ import annotations

from tests.nsutil import Topology


def test_add_check_del(topo: Topology, tmp_path) -> None:
    pod = topo.pod()
    conf = {"cniVersion": "1.0.0", "name": "smoke", "type": "macvlan", "master": topo.uplink,
            "ipam": {"type": "host-local", "dataDir": str(tmp_path),
                     "ranges": [[{"subnet": "198.51.100.0/24"}]]}}
    add = topo.run("macvlan", "ADD", conf, netns=pod)
    assert add.ok, add.out
    assert add.out["interfaces"][0]["name"] == "net1"
    assert topo.addrs(pod, "net1") == [add.out["ips"][0]["address"]]
    check = topo.run("macvlan", "CHECK", {**conf, "prevResult": add.out}, netns=pod)
    assert check.ok, check.out
    assert topo.run("macvlan", "DEL", conf, netns=pod).ok
    assert topo.link(pod, "net1") is None
