"""Multus thick as users run it (tests/cluster/thick.py: upstream v4.3.0's thick DaemonSet, changed only
where this node needs it, with its 100m CPU / 50Mi limits, in place of the kit's thin plugin) and pycni
installed by its own DaemonSet (the package fixture; its FIFO and state in the test's directory). Under
thick every delegate runs inside multus-daemon's container (chrooted into the host's "/", hostPID), so
each in-process plugin counts against the daemon's 50Mi: with pycni's agent up the plugin entries only
hand their calls to it.

Pods with the roce-shared NAD (pycni macvlan + whereabouts IPAM on the Kubernetes store, dual-stack)
attach and detach through the agent: every delegate ADD and DEL multus-daemon logs is one the agent
counted as served (its metrics on the node's address), none failed, multus-daemon never restarted, and
the pools hold nothing of the pods once they are gone. The node is left as it was (thin Multus back).

The kube-multus container gets PYCNI_AGENT_FIFO: the agent's FIFO of this test (the node's runtime has it
too, tests/cluster/kubenode.py); multus-daemon runs delegates with its own environment, not the runtime's,
so on a real node, where the FIFO is the default /run/pycni/agent.fifo, nothing is added. What happens
without the agent (6 and 12 pods) is measured by tests/bench/thick.py, not asserted here."""

from __future__ import annotations

from pathlib import Path

from tests.bundle_layouts import snapshot
from tests.cluster import kubenode, thick
from tests.cluster.pods import (
    SETTLE,
    Net,
    addresses,
    agent_served,
    pinged,
    pod,
    pool_owners,
    ready,
    reservations,
    sandbox_failures,
    settled,
)

PODS = 4
NETWORK = "roce-shared"


def served_once(node: kubenode.Cluster, command: str, since: dict[tuple[str, str], float],
                calls: int) -> dict[tuple[str, str], float]:
    """The agent's counts once it has counted `calls` macvlan `command`s since `since` (bounded wait);
    exactly that many: none more (the agent served each call multus-daemon made, once)."""
    def probe() -> dict[tuple[str, str], float] | None:
        got = agent_served(node)
        return got if got.get(("macvlan", command), 0) - since.get(("macvlan", command), 0) >= calls else None

    got = kubenode.wait_for(f"the agent counting {calls} macvlan {command}s", probe, 60)
    assert got[("macvlan", command)] - since.get(("macvlan", command), 0) == calls, (since, got)
    return got


def test_pods_attach_and_detach_through_the_agent_under_multus_thick(net: Net) -> None:
    node, ns = net.node, net.ns
    dirs = {d: snapshot(Path(node.env[d])) for d in ("CNI_BIN_DIR", "CNI_CONF_DIR")}
    names = [f"thick-{i}" for i in range(PODS)]
    refs = {f"{ns}/{n}" for n in names}
    got = thick.prepare(node)
    try:
        thick.install(got, {"PYCNI_AGENT_FIFO": str(node.agent_fifo_dir / "agent.fifo")})
        before = agent_served(node)
        node.apply([pod(n, ns, NETWORK) for n in names])
        ready(node, ns, *names)
        ips = {n: addresses(node, ns, n, "net1") for n in names}
        assert all(sorted(a.version for a in v) == [4, 6] for v in ips.values()), ips
        assert len({a.ip for v in ips.values() for a in v}) == 2 * PODS, ips
        owners = set().union(*pool_owners(node).values())
        assert refs <= owners and refs <= set(reservations(node).values()), owners
        first = ips[names[0]][0].ip if ips[names[0]][0].version == 4 else ips[names[0]][1].ip
        kubenode.wait_for(f"{names[1]} pings {first}", lambda: pinged(node, ns, names[1], str(first)), 60)

        adds = thick.delegate_calls(thick.daemon_log(node), ns, NETWORK, "Add")
        assert sorted(adds) == sorted(names), adds  # one delegate ADD per pod, no retry
        # every ADD multus-daemon ran was served by the agent (an in-process call is not counted there);
        # awaited: the agent counts a call once it has answered it
        served = served_once(node, "ADD", before, len(adds))
        assert served[("errors", "all")] == before[("errors", "all")], served
        assert thick.daemon_restarts(node) == (0, 0)

        node.kubectl("-n", ns, "delete", "pod", *names, "--wait=true", f"--timeout={SETTLE:.0f}s",
                     timeout=SETTLE + 30)
        kubenode.wait_for("the pools and reservations free of the deleted pods",
                          lambda: settled(node, refs), SETTLE)
        dels = thick.delegate_calls(thick.daemon_log(node), ns, NETWORK, "Del")
        assert set(dels) == set(names), dels
        after = served_once(node, "DEL", served, len(dels))
        assert after[("errors", "all")] == before[("errors", "all")], after
        assert not any(o.startswith(f"{ns}/") for o in set().union(*pool_owners(node).values()))
        assert sandbox_failures(node, ns) == []
        assert thick.daemon_restarts(node) == (0, 0)
    finally:
        node.kubectl("-n", ns, "delete", "pod", *names, "--ignore-not-found", "--wait=true", "--timeout=300s",
                     check=False, timeout=330)
        thick.uninstall(got)
    assert {d: snapshot(Path(node.env[d])) for d in dirs} == dirs  # thin Multus back, nothing of thick left
