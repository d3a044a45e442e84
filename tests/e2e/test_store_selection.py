"""Which store serves a NAD that names none (docs/ipam-store-selection.md), through plugin processes
as a runtime runs them: our macvlan delegating to our whereabouts, from source in the first pass and
the frozen bundle's entries in the frozen pass (PYCNI_PLUGIN_DIR), through the node's agent in the
agent pass.

The NAD is one as the NVIDIA Network Operator renders it (cniVersion 0.3.1, a range and an exclude, no
datastore, no kubeconfig): it relies on the node's flat file /etc/cni/net.d/whereabouts.d/whereabouts.conf.
The node is a private mount namespace whose /etc/cni/net.d and /var/lib are the test's own directories
(tests/e2e/node.py): the flat file is absent until the test writes it as the installer would, and the
default local store (/var/lib/cni/pycni/whereabouts.db) is under tmp_path, where the test sees whether
anything was written. Without the flat file ADD fails with code 7 naming the paths looked at, rolls back
its macvlan and writes no store; DEL succeeds; STATUS is code 50. With the flat file (the window between
the binaries and the flat file closed) the same NAD allocates on the real kube-apiserver."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam.config import FLAT_FILES
from tests import agentutil, kubeup
from tests.e2e import bundle_driver
from tests.e2e.node import Node, own_flat_file_impossible
from tests.nsutil import REPO, Call, Topology, plugin_command

FLAT = "/etc/cni/net.d/whereabouts.d/whereabouts.conf"
KUBECONFIG = "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"
STATE = "/var/lib/cni/pycni"
CID = "5e1ec7" + "0" * 58


def netop_nad(master: str, version: str = "0.3.1") -> dict[str, Any]:
    return {
        "cniVersion": version,
        "name": "netop-rdma",
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {"type": "whereabouts", "range": "198.51.100.0/24", "exclude": ["198.51.100.0/28"]},
    }


class NodeView:
    """One node: its own /etc/cni/net.d (empty: no flat file yet) and /var/lib, the plugins on
    CNI_PATH, the server reachable from the test's host namespace."""

    def __init__(self, topo: Topology, tenant: kubeup.Tenant, tmp: Path) -> None:
        self.topo, self.tenant = topo, tenant
        self.conf_dir = tmp / "etc-cni-net.d"
        self.node = Node(tmp / "node", cni_conf_dir=self.conf_dir)
        self.cni_path = f"{bundle_driver.plugin_dir(tmp)}:{bundle_driver.REFERENCE}"

    def install_flat_file(self) -> None:
        """What the installer writes on a cluster node (bundler/hostconf.py): the flat file naming the
        kubernetes store, and the node's kubeconfig beside it (here the tenant's node ServiceAccount)."""
        sub = self.conf_dir / "whereabouts.d"
        sub.mkdir()
        shutil.copy(self.tenant.node, sub / "whereabouts.kubeconfig")
        doc = {"datastore": "kubernetes", "configuration_path": os.path.dirname(FLAT),
               "kubernetes": {"kubeconfig": KUBECONFIG}}
        (sub / "whereabouts.conf").write_bytes(jsonio.dumps(doc))

    def call(self, command: str, conf: dict[str, Any], netns: str, pod: str = "netop-pod") -> Call:
        env = self.node.env({k: v for k, v in os.environ.items() if not k.startswith("CNI_")})
        env.update(CNI_COMMAND=command, CNI_CONTAINERID=CID, CNI_NETNS=netns, CNI_IFNAME="net1",
                   CNI_PATH=self.cni_path, PYTHONPATH=str(REPO),
                   CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={self.tenant.namespace};K8S_POD_NAME={pod};"
                            f"K8S_POD_INFRA_CONTAINER_ID={CID};K8S_POD_UID=uid-{pod}")
        cmd = self.node.command("ip", "netns", "exec", self.topo.host, *plugin_command("macvlan"))
        proc = subprocess.run(cmd, input=jsonio.dumps(conf), env=env, capture_output=True, check=False,
                              timeout=300, cwd=REPO)
        out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
        return Call(proc.returncode, out, proc.stderr.decode(errors="replace"))

    def written(self) -> list[str]:
        """Files under the node's /etc/cni/net.d and /var/lib/cni/pycni (the default local store, the
        pool locks beside it)."""
        conf = sorted(str(p.relative_to(self.conf_dir)) for p in self.conf_dir.rglob("*"))
        return conf + [f"{STATE}/{f}" for f in self.node.files(STATE)]


@pytest.fixture
def view(topo: Topology, tenant: kubeup.Tenant, tmp_path: Path) -> Iterator[NodeView]:
    if own_flat_file_impossible():
        pytest.skip(own_flat_file_impossible())
    v = NodeView(topo, tenant, tmp_path)
    forwarder = kubeup.Forwarder(tenant.server, topo.host)  # the IPAM runs in topo.host
    try:
        with v.node.agent() as agent:
            yield v
    finally:
        forwarder.close()
    if agent is not None:
        assert agent.served("macvlan"), f"the node's agent served nothing ({agent.log})"


def unprefixed(msg: str) -> str:
    """The IPAM's message as the delegating plugin passes it on: prefixed with the IPAM's name when the
    IPAM ran as its own process (from source), as is when in-process (the frozen bundle)."""
    return msg.removeprefix("whereabouts: ")


def host_links(topo: Topology) -> list[tuple[str, str]]:
    return sorted((link["ifname"], link.get("linkinfo", {}).get("info_kind", ""))
                  for link in topo.links(topo.host))


def test_a_netop_nad_fails_without_the_flat_file_and_allocates_once_it_is_there(
    view: NodeView, topo: Topology, tenant: kubeup.Tenant
) -> None:
    pod = topo.pod("nop")
    nad = netop_nad(topo.uplink)
    links_before = host_links(topo)

    # the window: binaries installed, no flat file yet
    got = view.call("ADD", nad, pod)
    assert got.rc == 1 and isinstance(got.out, dict), got
    assert got.out["code"] == 7 and got.out["cniVersion"] == "0.3.1", got.out
    assert unprefixed(got.out["msg"]).startswith("ipam.datastore: no store configured"), got.out
    assert f"no flat file at {', '.join(FLAT_FILES)}" in got.out["details"], got.out
    assert '"datastore": "local"' in got.out["details"], got.out
    assert [link["ifname"] for link in topo.links(pod)] == ["lo"], "the macvlan was not rolled back"
    assert host_links(topo) == links_before
    assert view.written() == [] and tenant.pools() == {} and tenant.reservations() == {}

    # DEL has nothing to release (the runtime's cleanup of the failed ADD); STATUS: not ready
    for _ in range(2):
        got = view.call("DEL", nad, pod)
        assert (got.rc, got.out) == (0, None), got
        assert "nothing to release" in got.stderr or agentutil.agent_up(), got.stderr
    status = view.call("STATUS", netop_nad(topo.uplink, "1.1.0"), "")
    assert status.rc == 1 and status.out["code"] == 50, status
    assert unprefixed(status.out["msg"]).startswith("ipam.datastore: no store configured"), status.out
    assert view.written() == [] and tenant.pools() == {}

    # the installer writes the flat file: the same NAD is served by the cluster store
    view.install_flat_file()
    got = view.call("ADD", nad, pod)
    assert got.rc == 0, got
    assert [ip["address"] for ip in got.out["ips"]] == ["198.51.100.16/24"], got.out
    assert topo.addrs(pod, "net1") == ["198.51.100.16/24"]
    pools = tenant.pools()
    assert list(pools) == ["198.51.100.0-24"] and pools["198.51.100.0-24"]["16"]["id"] == CID, pools
    assert list(tenant.reservations()) == ["198.51.100.16"]
    assert not [f for f in view.written() if f.startswith(f"{STATE}/whereabouts.db")]  # never the local store
    assert view.call("STATUS", netop_nad(topo.uplink, "1.1.0"), "").rc == 0

    got = view.call("DEL", nad, pod)
    assert got.rc == 0, got
    assert topo.link(pod, "net1") is None
    assert tenant.pools() == {"198.51.100.0-24": {}} and tenant.reservations() == {}
    assert host_links(topo) == links_before


def test_a_flat_file_choosing_the_local_store_serves_the_nad_from_it(view: NodeView, topo: Topology) -> None:
    """The embedded store, chosen on the node (installer --ipam-datastore local): the default database
    under the node's /var/lib."""
    sub = view.conf_dir / "whereabouts.d"
    sub.mkdir()
    (sub / "whereabouts.conf").write_bytes(jsonio.dumps({"datastore": "local"}))
    pod = topo.pod("loc")
    got = view.call("ADD", netop_nad(topo.uplink), pod)
    assert got.rc == 0 and [ip["address"] for ip in got.out["ips"]] == ["198.51.100.16/24"], got
    assert f"{STATE}/whereabouts.db" in view.written()
    assert view.call("DEL", netop_nad(topo.uplink), pod).rc == 0
    assert topo.link(pod, "net1") is None
