"""Real pods on the real node, attached by Multus and the kubelet through pycni's DaemonSet: the NADs of
conf-examples/kubernetes/ (RoCE shared macvlan + whereabouts on the Kubernetes store, made dual-stack;
host-device on a spare veth end this test creates), one network and two networks per pod. Each pod gets
its interfaces, Multus's network-status, its pool entries and reservations; pods reach each other over the
secondary network (IPv4 and IPv6); deletion, graceful and forced, leaks no address. The agent (on the
node's address) served the calls.

What the test changes in the examples, and why (`example_nad`):
- the namespace: the test's own;
- roce-shared: `master` is the test's veth (per-run name, MTU 9000 as the NAD asks); `range` moves from
  198.18.0.0/20 to 198.18.48.0/20 (this node's Service and pod networks are 198.18.0.0/24 and
  198.18.1.0/24), `exclude` and `gateway` with it; an IPv6 range is added (`ipRanges`, dual-stack);
- hostdev-pf: no `resourceName` annotation (no device plugin here): the device is named (`device`);
- both: `configuration_path` (this node's CNI conf dir is not /etc/cni/net.d, like OpenShift's), and
  the plugin state under the test's own directory (`local_db`: the pool locks live beside it; host-device
  `stateDir`), never the node's /var/lib/cni/pycni."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import threading
import urllib.request
from typing import Any

from bundler import manifest
from tests.cluster import kubenode
from tests.cluster.conftest import Installed
from tests.cluster.pods import (
    HOSTDEV_V4,
    SETTLE,
    STATUS,
    V4,
    V6,
    Net,
    addresses,
    agent_served,
    host_has,
    pinged,
    pod,
    pool_owners,
    ready,
    reservations,
    sandbox_failures,
    settled,
)
from tests.nsutil import REPO, RUN


def test_roce_shared_pods_dual_stack_reach_each_other_and_release_on_delete(net: Net) -> None:
    node, ns = net.node, net.ns
    before = agent_served(node)
    node.apply([pod("roce-a", ns, "roce-shared"), pod("roce-b", ns, "roce-shared")])
    ready(node, ns, "roce-a", "roce-b")
    got: dict[str, list[Any]] = {}
    for name in ("roce-a", "roce-b"):
        got[name] = addresses(node, ns, name, "net1")
        assert sorted(a.version for a in got[name]) == [4, 6], got[name]
        v4 = next(a for a in got[name] if a.version == 4)
        v6 = next(a for a in got[name] if a.version == 6)
        assert v4.ip in V4 and v4.network == V4 and v6.ip in V6 and v6.network == V6
        assert v4.ip not in ipaddress.ip_network("198.18.48.0/28")  # the NAD's exclude
        # Multus wrote what the plugin returned
        status = json.loads(node.get("-n", ns, "pod", name)["metadata"]["annotations"][STATUS])
        (sec,) = [s for s in status if s["name"] == f"{ns}/roce-shared"]
        assert sec["interface"] == "net1" and sorted(sec["ips"]) == sorted(str(a.ip) for a in got[name])
    owners = pool_owners(node)
    refs = {f"{ns}/roce-a", f"{ns}/roce-b"}
    assert owners["198.18.48.0-20"] >= refs and owners["2001-db8-28---64"] >= refs
    held = reservations(node)
    for name in ("roce-a", "roce-b"):
        for a in got[name]:
            assert held[str(a.ip).replace(":", "-")] == f"{ns}/{name}"
    for a in got["roce-b"]:
        kubenode.wait_for(f"roce-a pings {a.ip}", lambda a=a: pinged(node, ns, "roce-a", str(a.ip)), 60)
    after = agent_served(node)
    # through the agent, whose mounts are private: the namespaces were opened by the shims (cni.netns.GIVEN)
    assert after.get(("macvlan", "ADD"), 0) >= before.get(("macvlan", "ADD"), 0) + 2, (before, after)
    assert after[("errors", "all")] == 0, after

    node.kubectl("-n", ns, "delete", "pod", "roce-a", "--wait=true", "--timeout=120s", timeout=180)
    node.kubectl("-n", ns, "delete", "pod", "roce-b", "--force", "--grace-period=0", timeout=180)
    kubenode.wait_for("the deleted pods' addresses and reservations released", lambda: settled(node, refs),
                      SETTLE)
    assert sandbox_failures(node, ns) == []

def test_two_networks_in_one_pod_and_the_device_comes_back(net: Net) -> None:
    node, ns = net.node, net.ns
    node.apply([pod("two-nets", ns, "roce-shared,hostdev-pf")])
    ready(node, ns, "two-nets")
    net1 = addresses(node, ns, "two-nets", "net1")
    net2 = addresses(node, ns, "two-nets", "net2")
    assert sorted(a.version for a in net1) == [4, 6]
    assert [a.network for a in net2] == [HOSTDEV_V4]
    assert not host_has(net.device)  # the device is in the pod now
    status = json.loads(node.get("-n", ns, "pod", "two-nets")["metadata"]["annotations"][STATUS])
    assert [s["interface"] for s in status if s["name"].startswith(f"{ns}/")] == ["net1", "net2"]
    ref = {f"{ns}/two-nets"}
    assert ref <= pool_owners(node)["198.18.32.0-20"]
    node.kubectl("-n", ns, "delete", "pod", "two-nets", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("the pod's addresses released", lambda: settled(node, ref), SETTLE)
    kubenode.wait_for(f"{net.device} back in the host namespace", lambda: host_has(net.device), SETTLE)
    assert sandbox_failures(node, ns) == []


def agent_pid(node: kubenode.Cluster) -> int:
    """The host pid of the agent container's process (containerd's task of the container)."""
    (ds_pod,) = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    (status,) = [s for s in ds_pod["status"]["containerStatuses"] if s["name"] == "agent"]
    cid = status["containerID"].removeprefix("containerd://")
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        task, pid, state = line.split()[:3]
        if task == cid and state == "RUNNING":
            return int(pid)
    raise AssertionError(f"no running task for the agent container {cid}")


def agent_restarts(node: kubenode.Cluster) -> tuple[int, bool]:
    (ds_pod,) = node.get("-n", kubenode.NS, "pods", "-l", "app.kubernetes.io/name=pycni-node")["items"]
    (status,) = [s for s in ds_pod["status"]["containerStatuses"] if s["name"] == "agent"]
    return int(status["restartCount"]), bool(status["ready"])


def test_agent_killed_nothing_fails(net: Net) -> None:
    """The agent container's process killed (SIGKILL; the kubelet restarts the container): a pod created
    right after gets its attachment (in-process while no agent listens, or from the restarted agent: the
    shim takes whichever is there), its deletion releases it, no sandbox fails, the agent comes back."""
    node, ns = net.node, net.ns
    pid = agent_pid(node)
    restarts, _ = agent_restarts(node)
    os.kill(pid, signal.SIGKILL)
    node.apply([pod("killed-agent", ns, "roce-shared")])
    ready(node, ns, "killed-agent")
    assert sorted(a.version for a in addresses(node, ns, "killed-agent", "net1")) == [4, 6]
    kubenode.wait_for("the agent container restarted and Ready",
                      lambda: agent_restarts(node) == (restarts + 1, True), SETTLE)
    node.kubectl("-n", ns, "delete", "pod", "killed-agent", "--wait=true", "--timeout=120s", timeout=180)
    kubenode.wait_for("the pod's addresses released", lambda: settled(node, {f"{ns}/killed-agent"}), SETTLE)
    assert sandbox_failures(node, ns) == []


def agent_build(node: kubenode.Cluster) -> str | None:
    """The build the agent on the node's address reports (pycni_build_info), None when not answering."""
    url = f"http://{node.env['NODE_IP']}:9736/metrics"
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    m = re.search(r'^pycni_build_info\{[^}]*build="([^"]+)"[^}]*\} 1\.0$', text, re.M)
    return m.group(1) if m else None


def test_upgrade_rolls_the_daemonset_to_a_second_image_under_a_create_delete_loop(
        net: Net, installed: Installed) -> None:
    """docs/install.md step 7: a second image version (same bundle, another build id) imported, the
    overlay's tag changed, `kubectl apply -k`, the rollout awaited, while a loop creates and deletes pods:
    every pod of the loop gets its attachment, every deletion releases it, no sandbox fails. The plugin
    entries then point to the new build and the agent on the node's address reports it."""
    node, ns = net.node, net.ns
    old = manifest.load(REPO / "dist" / "cni-bin" / manifest.FILENAME).build
    assert agent_build(node) == old
    tag = f"{kubenode.REGISTRY}:{RUN}-2"
    archive = kubenode.image_archive(tag, node.host.parent / "image2", version_suffix="+upgrade")
    node.ctr("images", "import", str(archive))
    archive.unlink()
    started, rolled = threading.Event(), threading.Event()
    errors: list[str] = []
    cycles = [0, 0]  # all, and those begun after the rollout

    def loop() -> None:
        i = 0
        while cycles[1] < 2 and not errors:
            after = rolled.is_set()
            name = f"loop-{i}"
            try:
                node.apply([pod(name, ns, "roce-shared")])
                ready(node, ns, name)
                started.set()  # the rollout begins once a pod of the loop is up (cycle 0 is before it)
                assert sorted(a.version for a in addresses(node, ns, name, "net1")) == [4, 6]
                node.kubectl("-n", ns, "delete", "pod", name, "--wait=true", "--timeout=120s", timeout=180)
            except AssertionError as e:
                errors.append(f"{name}: {e}")
                started.set()
            i += 1
            cycles[0] += 1
            cycles[1] += after

    worker = threading.Thread(target=loop)
    worker.start()
    try:
        assert started.wait(timeout=SETTLE) and errors == [], errors
        kubenode.write_overlay(node, tag, installed.overlay)
        node.kubectl("apply", "-k", str(installed.overlay))
        node.kubectl("-n", kubenode.NS, "rollout", "status", "daemonset/pycni-node", "--timeout=300s",
                     timeout=330)
        rolled.set()
    finally:
        if not rolled.is_set():
            errors.append("the rollout failed")
        worker.join(timeout=900)
    assert not worker.is_alive() and errors == [], errors
    assert cycles[0] > cycles[1] >= 2  # pods came and went before, during and after the rollout
    target = os.readlink(node.cni_bin_dir / "macvlan")
    assert target.startswith(".pycni/") and old not in target, target
    kubenode.wait_for("the new agent on the node's address", lambda: (b := agent_build(node)) and b != old
                      and b in target and b, SETTLE)
    refs = {f"{ns}/loop-{i}" for i in range(cycles[0])}
    kubenode.wait_for("the loop pods' addresses released", lambda: settled(node, refs), SETTLE)
    assert sandbox_failures(node, ns) == []
