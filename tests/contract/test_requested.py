"""Requested addresses (ipam.requested, issue 25) on every store (local, etcd, Kubernetes on the session's
real kube-apiserver), each standalone (the plugin as a process) and through the node-local agent
(cni.agent, from source): exactly the requested
address, the other family allocated as usual, a repeated ADD answered alike; a second pod asking for it,
and a pod of another network on an overlapping range, get code 109 naming the holder and leave nothing
behind; an unrequested ADD never gets it; DEL releases it for the next pod that asks. Node slices on
the Kubernetes store likewise (tests/kubeapi/test_node_slices.py has the slices of several nodes)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam import config
from ipam.store.handles import store_for
from tests import etcdutil
from tests.agentutil import Agent
from tests.concurrency.harness import base_conf
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO, is_root
from tests.skips import ROOT

WANT = "198.51.100.77"


@pytest.fixture(scope="module")
def etcd() -> Iterator[etcdutil.Etcd]:
    etcdutil.require_etcd()
    with etcdutil.running() as e:
        yield e


@pytest.fixture(params=["local", "etcd", "kubernetes"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "local":
        return {"datastore": "local", "local_db": str(tmp_path / "state" / "w.db")}
    if request.param == "etcd":
        return {**request.getfixturevalue("etcd").ipam(), "local_db": str(tmp_path / "state" / "w.db")}
    tenant = request.getfixturevalue("tenant")
    return {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)},
            "local_db": str(tmp_path / "state" / "w.db")}  # fmt: skip


@pytest.fixture(params=["standalone", "agent"])
def via(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Agent | None]:
    if request.param == "standalone":
        yield None
        return
    if not is_root():
        pytest.skip(f"{ROOT}the agent serves root only")
    agent = Agent(tmp_path / "run" / "agent.fifo", tmp_path / "agent.log").start()
    try:
        yield agent
    finally:
        agent.stop()


def call(
    agent: Agent | None, command: str, conf: dict[str, Any], pod: str, cid: str, ip_arg: str = ""
) -> tuple[int, Any]:
    """The plugin as a process (`python -m cni whereabouts`), through `agent` when given."""
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=req;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": PYTHONPATH, "NODENAME": "node-1",
        "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": "net1", "CNI_PATH": "/usr/lib/cni",
        "CNI_ARGS": args + (f";IP={ip_arg}" if ip_arg else ""),
        "PYCNI_AGENT_FIFO": str(agent.fifo) if agent else "/nonexistent/agent.fifo",
        "PYCNI_AGENT_TIMEOUT": "120",
    }  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "cni", "whereabouts"], input=jsonio.dumps(conf), env=env,
                          capture_output=True, cwd=REPO, timeout=300, check=False)  # fmt: skip
    return proc.returncode, jsonio.loads(proc.stdout) if proc.stdout.strip() else None


def held(conf: dict[str, Any]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Who holds what as stored: {pool: sorted 'offset=podref'}, {reservation: podref}."""
    with store_for(config.load(conf["ipam"], ()).store) as store:
        pools = {
            p.name: sorted(f"{k}={a.podref}" for k, a in p.allocations.items())
            for p in store.iter_pools() if p.name.startswith(conf["ipam"]["network_name"])
        }  # fmt: skip
        res = {r.name: r.owner.podref for r in store.iter_reservations()
               if r.name.startswith(conf["ipam"]["network_name"])}  # fmt: skip
    return pools, res


@contextlib.contextmanager
def nothing_more(conf: dict[str, Any]) -> Iterator[None]:
    before = held(conf)
    yield
    assert held(conf) == before


def test_requested_address_on_every_store(target: dict[str, Any], via: Agent | None, tmp_path: Path) -> None:
    name = f"req{os.getpid()}x{abs(hash(tmp_path.name)) % 10**6}"
    ranges = [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/64"}]
    dual = base_conf("netA", target, tmp_path, ipRanges=ranges, network_name=name)
    other = base_conf("netB", target, tmp_path, range="198.51.100.64/26", network_name=name)
    asked = {**dual, "runtimeConfig": {"ips": [f"{WANT}/24"]}}

    rc, out = call(via, "ADD", asked, "pod-1", "c1")
    assert rc == 0, out
    assert [ip["address"] for ip in out["ips"]] == [f"{WANT}/24", "2001:db8::1/64"]
    assert call(via, "ADD", asked, "pod-1", "c1") == (0, out)

    with nothing_more(dual):
        rc, err = call(via, "ADD", dual, "pod-2", "c2", ip_arg=WANT)
        assert rc == 1 and err["code"] == 109, err
        assert err["msg"] == f"requested address {WANT} is held by pod req/pod-1 (container c1 net1)"
        rc, err = call(via, "ADD", {**other, "args": {"cni": {"ips": [WANT]}}}, "pod-4", "c4")
        assert rc == 1 and err["code"] == 109 and "req/pod-1" in err["msg"], err

    rc, out = call(via, "ADD", dual, "pod-3", "c3")
    assert rc == 0 and [ip["address"] for ip in out["ips"]] == ["198.51.100.1/24", "2001:db8::2/64"], out
    pools, res = held(dual)
    assert "77=req/pod-1" in pools[f"{name}-198.51.100.0-24"]
    assert res[f"{name}-198.51.100.77"] == "req/pod-1"

    assert call(via, "DEL", asked, "pod-1", "c1")[0] == 0
    pools, res = held(dual)
    assert f"{name}-198.51.100.77" not in res and "77=req/pod-1" not in pools[f"{name}-198.51.100.0-24"]
    rc, out = call(via, "ADD", {**other, "args": {"cni": {"ips": [WANT]}}}, "pod-4", "c4")
    assert rc == 0 and [ip["address"] for ip in out["ips"]] == [f"{WANT}/26"], out
    if via is not None:
        assert (len(via.served("whereabouts ADD")), len(via.served("whereabouts DEL"))) == (6, 1)


def test_requested_address_in_a_node_slice(tenant: Any, via: Agent | None, tmp_path: Path) -> None:
    """Node slices (Kubernetes store), standalone and through the agent: this node (node-1, its first
    ADD assigns it the first /26) gets a requested address of its slice, a second pod asking for it code
    109, an address of a slice no node has code 7 saying so."""
    target = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)},
              "local_db": str(tmp_path / "state" / "w.db")}  # fmt: skip
    conf = base_conf("slicenet", target, tmp_path, range="198.51.100.0/24", node_slice_size="/26")
    rc, out = call(via, "ADD", {**conf, "runtimeConfig": {"ips": ["198.51.100.20"]}}, "pod-1", "c1")
    assert rc == 0 and [ip["address"] for ip in out["ips"]] == ["198.51.100.20/24"], out
    rc, err = call(via, "ADD", conf, "pod-2", "c2", ip_arg="198.51.100.20")
    assert rc == 1 and err["code"] == 109 and "req/pod-1" in err["msg"], err
    rc, err = call(via, "ADD", conf, "pod-2", "c2", ip_arg="198.51.100.70")
    assert rc == 1 and err["code"] == 7, err
    assert err["msg"] == ("CNI_ARGS IP[0]: 198.51.100.70 is in node slice 198.51.100.64/26, assigned to no "
                          "node, not in this node's (node-1: 198.51.100.0/26)")  # fmt: skip
    assert call(via, "DEL", conf, "pod-1", "c1")[0] == 0
    rc, out = call(via, "ADD", conf, "pod-2", "c2", ip_arg="198.51.100.20")
    assert rc == 0 and [ip["address"] for ip in out["ips"]] == ["198.51.100.20/24"], out
    if via is not None:
        assert len(via.served("whereabouts ADD")) == 4, via.log.read_text()
