"""Where pycni is deliberately better than Debian's macvlan (issue 2 §3, anchor-behaviour §2.2/§2.4),
shown through libcni on the same conflists: our behaviour is asserted; the reference runs the same
steps so the scenario is known to be the failing one there too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import E2E
from tests.e2e.libcni import VERSIONS

CHECK_VERSIONS = tuple(v for v in VERSIONS if v >= "0.4.0")


def macvlan(version: str, master: str, ipam: dict[str, Any], *more: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": version, "name": "beyond", "plugins": [
        {"type": "macvlan", "master": master, "ipam": ipam}, *more]}


def host_local(data_dir: str, routes: list[dict[str, str]], start: str = "", end: str = "") -> dict[str, Any]:
    rng = {"subnet": "198.51.100.0/24", "gateway": "198.51.100.1"}
    rng.update({k: v for k, v in (("rangeStart", start), ("rangeEnd", end)) if v})
    return {"type": "host-local", "dataDir": data_dir, "ranges": [[rng]], "routes": routes}


@pytest.mark.parametrize("version", CHECK_VERSIONS)
def test_check_accepts_routes_without_gateway(e2e: E2E, version: str) -> None:
    """host-local routes without `gw` are installed via the range gateway (both plugins do that). The
    reference's CHECK then looks for a gateway-less route and fails on its own ADD; ours matches a
    route without `gw` against any next hop, so a healthy attachment passes."""
    routes = [{"dst": "198.18.0.0/15"}]
    checks = {}
    for side in e2e.sides:
        run = e2e.session(side, lambda d: macvlan(version, e2e.topo.uplink, host_local(d, routes)))
        assert run.call("add").ok
        assert "198.18.0.0/15 via 198.51.100.1" in e2e.topo.ip(run.netns, "route")
        checks[side.label] = run.call("check")
        assert run.call("del").ok
    assert not checks["reference"].ok and "198.18.0.0" in checks["reference"].out["msg"]
    assert checks["pycni"].ok, checks["pycni"].out


@pytest.mark.parametrize("version", VERSIONS)
def test_failed_ipam_leaves_no_link(e2e: E2E, version: str) -> None:
    """The range holds one address and another container has it: IPAM ADD fails. The reference leaks
    its macvlan in the pod until the runtime's DEL; ours removes it before returning the error."""
    for side in e2e.sides:
        def make(d: str) -> dict[str, Any]:
            return macvlan(version, e2e.topo.uplink, host_local(d, [], "198.51.100.10", "198.51.100.10"))

        first = e2e.session(side, make, container_id="c0")
        assert first.call("add").ok
        second = e2e.session(side, make)
        add = second.call("add")
        assert not add.ok and "no IP addresses available" in add.out["msg"], add.out
        if side is e2e.pycni:
            assert e2e.topo.link(second.netns, "net1") is None, "pycni left its link after IPAM failed"
            assert [x["ifname"] for x in e2e.topo.links(second.netns)] == ["lo"]
        assert second.call("del").ok and e2e.topo.link(second.netns, "net1") is None
        assert first.call("del").ok and first.allocations() == []


@pytest.mark.parametrize("version", VERSIONS)
def test_failure_after_ipam_releases_address_and_link(e2e: E2E, version: str) -> None:
    """IPAM succeeds, then a route cannot be installed (its gateway is off-link). Ours removes the link
    and releases the address before returning the error; the reference releases the address but
    leaves the link for the runtime's DEL."""
    routes = [{"dst": "198.18.0.0/15", "gw": "198.18.99.1"}]
    for side in e2e.sides:
        run = e2e.session(side, lambda d: macvlan(version, e2e.topo.uplink, host_local(d, routes)))
        add = run.call("add")
        assert not add.ok and "198.18" in add.out["msg"], add.out
        assert run.allocations() == [], f"{side.label}: address kept after a failed ADD"
        if side is e2e.pycni:
            assert [x["ifname"] for x in e2e.topo.links(run.netns)] == ["lo"], "pycni left its link behind"
        assert run.call("del").ok and e2e.topo.link(run.netns, "net1") is None


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_l2_only_in_a_version_without_interfaces_rolls_back(e2e: E2E, version: str) -> None:
    """0.1.0/0.2.0 results cannot express an attachment without addresses: both plugins fail the ADD;
    ours deletes the link it made first (the reference leaves it for the runtime's DEL)."""
    for side in e2e.sides:
        run = e2e.session(side, lambda d: macvlan(version, e2e.topo.uplink, {}))
        add = run.call("add")
        assert not add.ok, f"{side.label}: L2-only ADD in {version} succeeded: {add.out}"
        if side is e2e.pycni:
            assert "without IP addresses" in add.out["msg"], add.out
            assert [x["ifname"] for x in e2e.topo.links(run.netns)] == ["lo"], "pycni left its link behind"
        assert run.call("del").ok and e2e.topo.link(run.netns, "net1") is None


@pytest.mark.parametrize("version", ["0.3.1", "1.0.0"])
def test_missing_master_error_names_master_and_namespace(e2e: E2E, version: str) -> None:
    for side in e2e.sides:
        run = e2e.session(side, lambda d: macvlan(version, "nosuchuplink", host_local(d, [])))
        add = run.call("add")
        assert not add.ok, add.out
        if side is e2e.pycni:
            assert add.out["code"] == 7 and 'master: interface "nosuchuplink"' in add.out["msg"], add.out
            assert "host network namespace" in add.out["msg"], add.out
        assert run.allocations() == []
        assert [x["ifname"] for x in e2e.topo.links(run.netns)] == ["lo"]
