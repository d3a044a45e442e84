"""Failure paths where pycni must behave like Debian's macvlan, through libcni: DEL after the pod's
namespace is gone, CHECK after an address was removed, ADD onto an interface name already taken."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import E2E
from tests.e2e.libcni import VERSIONS
from tests.nsutil import sh

CHECK_VERSIONS = tuple(v for v in VERSIONS if v >= "0.4.0")


def conflist(version: str, master: str, data_dir: str) -> dict[str, Any]:
    return {"cniVersion": version, "name": "failnet", "plugins": [
        {"type": "macvlan", "master": master,
         "ipam": {"type": "host-local", "dataDir": data_dir,
                  "ranges": [[{"subnet": "198.51.100.0/24", "gateway": "198.51.100.1"}]]}},
        {"type": "tuning", "promisc": True}]}


@pytest.mark.parametrize("version", VERSIONS)
def test_del_after_netns_gone_releases_the_address(e2e: E2E, version: str) -> None:
    for side in e2e.sides:
        run = e2e.session(side, lambda d: conflist(version, e2e.topo.uplink, d))
        assert run.call("add").ok
        assert len(run.allocations()) == 1
        sh("ip", "netns", "del", run.netns.rsplit("/", 1)[1])
        delete = run.call("del")
        assert delete.ok, f"{side.label}: DEL with the namespace gone failed: {delete.out}"
        assert run.allocations() == [], f"{side.label}: address not released"
        assert run.call("del").ok, f"{side.label}: second DEL failed"


@pytest.mark.parametrize("version", CHECK_VERSIONS)
def test_check_fails_after_an_address_is_removed(e2e: E2E, version: str) -> None:
    outcomes = {}
    for side in e2e.sides:
        run = e2e.session(side, lambda d: conflist(version, e2e.topo.uplink, d))
        add = run.call("add")
        assert add.ok and run.call("check").ok
        address = add.out["ips"][0]["address"]
        e2e.topo.ip(run.netns, "addr", "del", address, "dev", "net1")
        outcomes[side.label] = run.call("check")
        assert run.call("del").ok
    assert not outcomes["reference"].ok
    ours = outcomes["pycni"]
    assert not ours.ok and address in ours.out["msg"], ours.out


@pytest.mark.parametrize("version", VERSIONS)
def test_add_onto_a_taken_interface_name_fails_and_leaves_it_alone(e2e: E2E, version: str) -> None:
    for side in e2e.sides:
        run = e2e.session(side, lambda d: conflist(version, e2e.topo.uplink, d))
        # no dummy module on these machines: a veth pair stands in for whatever holds the name
        e2e.topo.ip(run.netns, "link", "add", "net1", "type", "veth", "peer", "name", "net1p")
        add = run.call("add")
        assert not add.ok, f"{side.label}: ADD over an existing net1 succeeded"
        link = e2e.topo.link(run.netns, "net1")
        assert link is not None and link["linkinfo"]["info_kind"] == "veth", f"{side.label}: net1 replaced"
        assert run.allocations() == [], f"{side.label}: address allocated by a failed ADD"
        assert sorted(x["ifname"] for x in e2e.topo.links(run.netns)) == ["lo", "net1", "net1p"], side.label
