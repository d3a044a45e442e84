"""The reference for `rail` (issue 35): what pycni's macvlan does alone with `"rail": true`, Debian's Go
plugins do chained: macvlan + tuning (arp_ignore, arp_announce, rp_filter of the interface) + sbr (a
table and rules per interface). Both run through real libcni (the driver, one conflist per rail) on the
same two four-rail pods (tests/railab.py), one subnet for every rail and a subnet per rail with a
gateway: every flow leaves on its own rail, and each address resolves only to its holder's MAC."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from tests.e2e import libcni
from tests.e2e.harness import E2E
from tests.railab import COUNT, RAILS, Rails, flows, mac_of, neighbours, one_subnet, per_rail

pytestmark = [pytest.mark.root, pytest.mark.e2e]
VERSION = "1.0.0"  # Debian's sbr and tuning (1.1.1) and host-local accept configs up to 1.0.0


class DriverRails(Rails):
    """Rails whose calls go through libcni with a conflist: `chain` = the reference (Go macvlan +
    tuning + sbr, CNI_PATH /usr/lib/cni), else pycni's macvlan with `rail` alone."""

    def __init__(self, e2e: E2E, subnets: Any, chain: bool) -> None:
        self.e2e, self.chain = e2e, chain
        super().__init__(e2e.topo, e2e.scratch, subnets)

    def call(self, command: str, p: int, rail: int, extra: dict[str, Any]) -> Any:
        ifname = f"net{rail + 1}"
        main = self.conf(p, rail, **extra)
        if self.chain:
            tuning = {"type": "tuning", "sysctl": {f"net.ipv4.conf.{ifname}.arp_ignore": "1",
                                                   f"net.ipv4.conf.{ifname}.arp_announce": "2",
                                                   f"net.ipv4.conf.{ifname}.rp_filter": "2"}}
            plugins = [main, tuning, {"type": "sbr"}]
            side = self.e2e.reference
        else:
            plugins = [{**main, "rail": True}]
            side = self.e2e.pycni
        conflist = {"cniVersion": VERSION, "name": "rails",
                    "plugins": [{k: v for k, v in c.items() if k not in ("cniVersion", "name")}
                                for c in plugins]}
        path = libcni.write_conflist(self.e2e.scratch, f"rail-{p}-{rail}", conflist)
        verb = {"ADD": "add", "DEL": "del"}[command]
        pod = self.pods[p]
        call = self.e2e.driver.run(verb, path, side, netns=pod.path, ifname=ifname, container_id=pod.cid)
        assert call.ok, (call.out, call.stderr)
        return call.out


@pytest.mark.parametrize("subnets", [one_subnet, per_rail], ids=["one-subnet", "subnet-per-rail"])
@pytest.mark.parametrize("chain", [True, False], ids=["go-macvlan+tuning+sbr", "pycni-rail"])
def test_reference_chain_and_rail_agree(e2e: E2E, subnets: Any, chain: bool) -> None:
    rails = DriverRails(e2e, subnets, chain)
    rails.add_all()
    a, b = rails.pods
    for family in (4, 6):
        for (src, dst), (ok, sent) in flows(rails, family).items():
            assert ok, (family, src, dst)
            me = f"net{src + 1}"
            assert sent[me] >= COUNT and all(n < COUNT for k, n in sent.items() if k != me), (family, sent)
        for rail in range(RAILS):
            for addr in b.addrs[rail]:
                if ipaddress.ip_address(addr).version == family:
                    assert neighbours(a.ns, addr) <= {mac_of(b.ns, f"net{rail + 1}")}, addr
    rails.delete_all()
