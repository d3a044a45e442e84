"""Multi-rail pods through Multus on the real node (issue 35): four NADs made from
conf-examples/kubernetes/rail-macvlan.yaml, one per rail (each on a veth master of its own, all four in
one subnet, the hard case), two pods with all four: from each pod's rail-r address, the peer's rail-r
address answers, and the packets leave on the pod's own rail-r interface (its counters), not on the first.

What the test changes in the example: the namespace and NAD names (the test's own), `master` (per-run
veths), the range (198.18.64.0/24: this node's Service and pod networks are 198.18.0.0/24 and
198.18.1.0/24, tests/cluster/test_pods.py uses 198.18.48.0/20), and the IPAM's paths as
`example_nad` sets them."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

from tests.cluster import kubenode
from tests.cluster.conftest import Installed
from tests.cluster.pods import addresses, example_nad, pod, ready
from tests.nsutil import RUN, sh

RAILS = 4
COUNT = 5
RANGE = ipaddress.ip_network("198.18.64.0/24")


@pytest.fixture(scope="module")
def rails(installed: Installed) -> Iterator[tuple[kubenode.Cluster, str]]:
    node = installed.cluster
    ns = f"{RUN}-rail"
    masters = [f"{RUN}rl{r}" for r in range(RAILS)]
    try:
        for master in masters:
            sh("ip", "link", "add", master, "type", "veth", "peer", "name", master + "p")
            for link in (master, master + "p"):
                sh("ip", "link", "set", link, "up")
        node.kubectl("create", "namespace", ns)
        nads = []
        for r, master in enumerate(masters):
            doc = example_nad("rail-macvlan.yaml", ns, {
                "name": f"rail-{r}", "master": master, "mtu": 1500, "ipam.range": str(RANGE),
                "ipam.exclude": ["198.18.64.0/28"], "ipam.gateway": "198.18.64.1"}, node)
            doc["metadata"]["name"] = f"rail-{r}"
            nads.append(doc)
        node.apply(nads)
        yield node, ns
    finally:
        try:
            node.drop_namespace(ns)
        finally:
            for master in masters:
                sh("ip", "link", "del", master, check=False)


def tx(node: kubenode.Cluster, ns: str, name: str) -> dict[str, int]:
    script = "for i in 1 2 3 4; do echo net$i $(cat /sys/class/net/net$i/statistics/tx_packets); done"
    out = node.kubectl("-n", ns, "exec", name, "--", "sh", "-c", script).stdout
    return {k: int(v) for k, v in (line.split() for line in out.splitlines())}


def test_four_rails_each_carry_their_own_traffic(rails: tuple[kubenode.Cluster, str]) -> None:
    node, ns = rails
    networks = ",".join(f"rail-{r}" for r in range(RAILS))
    node.apply([pod("rail-a", ns, networks), pod("rail-b", ns, networks)])
    ready(node, ns, "rail-a", "rail-b")
    got = {name: {r: addresses(node, ns, name, f"net{r + 1}") for r in range(RAILS)}
           for name in ("rail-a", "rail-b")}
    for name, by_rail in got.items():
        assert all(len(a) == 1 and a[0].ip in RANGE for a in by_rail.values()), (name, by_rail)
    for r in range(RAILS):
        src, dst = str(got["rail-a"][r][0].ip), str(got["rail-b"][r][0].ip)

        def ping(src: str = src, dst: str = dst) -> bool:
            cmd = ("-n", ns, "exec", "rail-a", "--", "ping", "-c", str(COUNT), "-i", "0.2", "-W", "2", "-I",
                   src, dst)
            return node.kubectl(*cmd, check=False).returncode == 0

        kubenode.wait_for(f"rail {r}: ARP settles and the peer answers", lambda: ping() or None, 60)
        before = tx(node, ns, "rail-a")
        assert ping(), f"rail {r}: {src} -> {dst}"
        after = tx(node, ns, "rail-a")
        sent = {k: after[k] - before[k] for k in after}
        me = f"net{r + 1}"
        assert sent[me] >= COUNT and all(n < COUNT for k, n in sent.items() if k != me), (r, sent)
    rules = node.kubectl("-n", ns, "exec", "rail-a", "--", "ip", "rule", "show", check=False).stdout
    for r in range(RAILS):
        assert f"from {got['rail-a'][r][0].ip} lookup" in rules, rules
    node.kubectl("-n", ns, "delete", "pod", "rail-a", "rail-b", "--wait=true", "--timeout=180s", timeout=240)
