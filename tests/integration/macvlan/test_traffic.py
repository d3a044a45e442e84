"""Frames between pods: two pods on one master reach each other, and every address is announced
exactly once (gratuitous ARP / unsolicited neighbour advertisement) when ADD configures it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cni import spec
from tests.integration.macvlan.capture import Capture
from tests.integration.macvlan.harness import Env, ipam_result
from tests.nsutil import sh


def ping(src_pod: str, address: str) -> None:
    proc = sh("ip", "netns", "exec", os.path.basename(src_pod), "ping", "-c1", "-W2", address, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_two_pods_ping_each_other(env: Env) -> None:
    pods = [(env.pod, "c1", 11), (env.new_pod("q"), "c2", 12)]
    confs = []
    for pod, cid, n in pods:
        conf = env.conf(env.fake_ipam(ipam_result(n)))
        env.add(conf, netns=pod, container_id=cid)
        confs.append(conf)
    for src, dst in ((0, 1), (1, 0)):
        ping(pods[src][0], f"198.51.100.{pods[dst][2]}")
        ping(pods[src][0], f"2001:db8:1::{pods[dst][2]}")
    for (pod, cid, _), conf in zip(pods, confs, strict=True):
        assert env.run("DEL", conf, netns=pod, container_id=cid).ok
    assert env.allocations() == []


def four_addresses() -> dict[str, Any]:
    """Two addresses per family (0.1.0/0.2.0 results carry only the first of each)."""
    result = ipam_result()
    result["ips"] += [{"address": "198.18.0.5/24"}, {"address": "2001:db8:2::5/64"}]
    return result


@pytest.mark.parametrize("dad", ["on", "off", "optimistic"])
def test_every_address_announced_once(env: Env, dad: str) -> None:
    capture = Capture(env.topo.host, env.topo.peer)
    try:
        conf = env.conf(env.fake_ipam(four_addresses()), dad=dad)
        env.add(conf)
        capture.collect(0.3)  # late duplicates would come from the kernel, at once
        # the kernel also announces the link-local address; only the IPAM's are the plugin's business
        seen = {a: n for a, n in capture.announcements(env.link()["address"]).items()
                if not a.startswith("fe80:")}
    finally:
        capture.close()
    expected = {"198.51.100.5", "2001:db8:1::5"}
    if spec.family(env.version) != "0.2":
        expected |= {"198.18.0.5", "2001:db8:2::5"}
    assert seen == dict.fromkeys(expected, 1)
    assert env.run("DEL", conf).ok
