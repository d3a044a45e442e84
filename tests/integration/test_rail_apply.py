"""cni.plugins.rail.apply in process on a real namespace: applied twice it changes nothing the second
time and reuses the first table, and a failure after the second application rolls back nothing of the
first (what existed is not the repeated ADD's to undo)."""

from __future__ import annotations

import ipaddress
import os

import pytest

from cni import ifconfig, jsonio, netns
from cni.netlink import links
from cni.netlink.socket import opened
from cni.plugins import rail
from cni.types.result import Interface, IPConfig, Result
from cni.undo import Undo
from tests.nsutil import Topology, sh

pytestmark = pytest.mark.root


def state(pod: str) -> tuple[str, ...]:
    ns = os.path.basename(pod)
    return tuple(sh("ip", *args).stdout for args in (
        ("-n", ns, "rule"), ("-n", ns, "-6", "rule"), ("-n", ns, "route", "show", "table", "all"),
        ("-n", ns, "-6", "route", "show", "table", "all")))


def test_repeated_apply_is_idempotent_and_its_rollback_spares_the_first(topo: Topology) -> None:
    pod = topo.pod()
    sh("ip", "-n", os.path.basename(pod), "link", "add", "net1", "type", "veth", "peer", "name", "net1p")
    sh("ip", "-n", os.path.basename(pod), "link", "set", "net1p", "up")
    fd = netns.open_netns(pod)
    try:
        with opened(fd) as nl:
            link = links.get(nl, "net1")
        assert link is not None
        result = Result(interfaces=(Interface("net1", link.mac, pod),), ips=(
            IPConfig(ipaddress.ip_interface("198.51.100.5/24"), ipaddress.ip_address("198.51.100.1"), 0),
            IPConfig(ipaddress.ip_interface("2001:db8:1::5/64"), None, 0)))
        ifconfig.configure(fd, link.index, result, dad="off", notify=False)
        conf = rail.RailConf(rail=True)
        with Undo() as undo:
            first = rail.apply(fd, link.index, result, conf, "1.1.0", undo)
            undo.commit()
        before = state(pod)
        assert "lookup" in before[0] and "lookup" in before[1]
        with pytest.raises(RuntimeError), Undo() as undo:
            second = rail.apply(fd, link.index, result, conf, "1.1.0", undo)
            raise RuntimeError("a later step of the repeated ADD fails")
        assert second == first
        assert state(pod) == before
        table = next(r.table for r in first.routes if r.table is not None)
        shown = jsonio.loads(sh("ip", "-j", "-n", os.path.basename(pod), "route", "show", "table",
                                str(table)).stdout)
        assert {r["dst"] for r in shown} == {"198.51.100.0/24", "default"}
    finally:
        os.close(fd)
