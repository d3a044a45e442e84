"""A failed ADD leaves nothing behind: no link in the pod, no IPAM allocation; once IPAM ADD has run,
IPAM DEL runs before the error is returned."""

from __future__ import annotations

import pytest

from tests.integration.macvlan.harness import HOST_LOCAL_VERSIONS, Env, error, ipam_result


def assert_nothing_left(env: Env) -> None:
    assert env.pod_links() == ["lo"]
    assert env.allocations() == []


def test_ipam_add_fails(env: Env) -> None:
    call = env.run("ADD", env.conf(env.fake_ipam(failOn=["ADD"])))
    error(call, 11, "fakeipam", "told to fail on ADD")
    assert_nothing_left(env)
    assert env.calls()[0] == ("ADD", "c1", "net1")
    # the spec: a delegate that fails on ADD gets a DEL before the error is returned
    assert env.calls()[1:] == [("DEL", "c1", "net1")]


@pytest.mark.parametrize("version", HOST_LOCAL_VERSIONS)
def test_host_local_exhausted(env: Env) -> None:
    """A real IPAM failing: a one-address range already held by another container."""
    conf = env.conf(env.host_local(rangeStart="198.51.100.9", rangeEnd="198.51.100.9"))
    env.add(conf, container_id="other", netns=env.new_pod("q"))
    call = env.run("ADD", conf)
    assert not call.ok
    assert "host-local" in call.out["msg"] and "no IP addresses available" in call.out["msg"], call.out
    assert env.pod_links() == ["lo"]
    assert env.host_local_ips() == ["198.51.100.9"]  # the other container's address only


def test_route_rejected_by_kernel(env: Env) -> None:
    result = ipam_result()
    result["routes"] = [{"dst": "198.18.0.0/16", "gw": "198.19.0.1"}]  # not on any subnet of the link
    call = env.run("ADD", env.conf(env.fake_ipam(result)))
    error(call, 103, "198.18.0.0/16", "198.19.0.1")
    assert_nothing_left(env)
    assert env.calls() == [("ADD", "c1", "net1"), ("DEL", "c1", "net1")]


def test_address_rejected_by_kernel(env: Env) -> None:
    """IPv6 cannot live on a link with an MTU below 1280: the kernel refuses the address."""
    call = env.run("ADD", env.conf(mtu=1200))
    error(call, 103, "2001:db8:1::5/64")
    assert_nothing_left(env)
    assert env.calls() == [("ADD", "c1", "net1"), ("DEL", "c1", "net1")]


BAD_DATA: dict[str, tuple[str, int, str]] = {
    "not-json": ("this is not JSON", 6, "fakeipam"),
    "bad-address": ('{"cniVersion": "%s", "ips": [{"address": "198.51.100.300/24"}], '
                    '"ip4": {"ip": "198.51.100.300/24"}}', 6, "198.51.100.300/24"),
    "no-ips": ('{"cniVersion": "%s", "dns": {}}', 7, "no IP"),
    "gateway-family": ('{"cniVersion": "%s", '
                       '"ips": [{"address": "198.51.100.5/24", "gateway": "2001:db8::1"}], '
                       '"ip4": {"ip": "198.51.100.5/24", "gateway": "2001:db8::1"}}', 6, "2001:db8::1"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_ipam_returns_bad_data(env: Env, case: str) -> None:
    raw, code, word = BAD_DATA[case]
    call = env.run("ADD", env.conf(env.fake_ipam(rawResult=raw.replace("%s", env.version))))
    error(call, code, word)
    assert_nothing_left(env)
    assert env.calls() == [("ADD", "c1", "net1"), ("DEL", "c1", "net1")]


def test_link_creation_rejected(env: Env) -> None:
    """A master in passthru mode takes no second macvlan: the kernel refuses, nothing is left and the
    IPAM is never asked for this container."""
    conf = env.conf(mode="passthru")
    first = env.new_pod("q")
    env.add(conf, netns=first, container_id="c0")
    call = env.run("ADD", conf)
    error(call, 103, "macvlan")
    assert_nothing_left_for_c1(env)
    assert env.run("DEL", conf, netns=first, container_id="c0").ok


def assert_nothing_left_for_c1(env: Env) -> None:
    assert env.pod_links() == ["lo"]
    assert [c for c in env.calls() if c[1] == "c1"] == []


def test_duplicate_address_detected(env: Env) -> None:
    """Another pod on the master already holds the IPv6 address: DAD fails (104), and the ADD is
    undone after IPAM ADD had succeeded."""
    conf = env.conf(dad="on")
    first = env.new_pod("q")
    env.add({**conf, "dad": "off"}, netns=first, container_id="c0")  # its address is valid at once
    call = env.run("ADD", conf)
    error(call, 104, "net1", "2001:db8:1::5/64")
    assert env.pod_links() == ["lo"]
    assert env.allocations() == ["c0--net1"]
    assert [c for c in env.calls() if c[1] == "c1"] == [("ADD", "c1", "net1"), ("DEL", "c1", "net1")]
    assert env.run("DEL", conf, netns=first, container_id="c0").ok


def test_failed_rollback_is_reported(env: Env) -> None:
    """IPAM DEL fails during the rollback too: the caller still gets the original error, and its
    details say the rollback is incomplete."""
    call = env.run("ADD", env.conf(env.fake_ipam(failOn=["ADD", "DEL"])))
    error(call, 11, "told to fail on ADD", "rollback incomplete", "told to fail on DEL")
    assert env.pod_links() == ["lo"]
