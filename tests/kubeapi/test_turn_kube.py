"""The write turn of a shared pool (ipam/turn.py) on the real kube-apiserver, with real plugin processes
(no agent, from source through tests/launch.py) on simulated nodes (NODENAME): a writer waiting for a
held turn, many nodes at once (and an agent's threads beside plugin processes on one node), a writer
killed while it holds the turn, a holder stalled and resumed after it was taken over, and the API server
restarted while writers wait. Every case ends the same way: each attachment one pool entry and one
reservation, no address twice, and after the DELs nothing left: no entry, no reservation, no intent,
the turn free. Calls that fail with code 11 are retried, as the runtime retries them; no other failure."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam import batch, plugin
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation
from ipam.store.kubeturn import INTENT_OF, KubeTurn, digest, turn_name
from ipam.turn import TURN_SECONDS, Outcome
from tests import kubeup, launch
from tests.concurrency.harness import base_conf
from tests.kubeapi.factory import open_kube
from tests.kubeup import Tenant
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO
from tests.waits import until

RANGE, POOL = "198.51.100.0/24", "198.51.100.0-24"
RETRIES = 4  # a call answered code 11 is run again this often (the runtime retries it)


def _env(command: str, cid: str, node: str, ns: str) -> dict[str, str]:
    name = f"p-{cid[:8]}"
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/none",
            "CNI_IFNAME": "net1", "CNI_PATH": "/usr/lib/cni", "NODENAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID=uid-{cid[:8]}"}  # fmt: skip


def _start(conf: dict[str, Any], env: dict[str, str], faults: str = "") -> subprocess.Popen[bytes]:
    """A plugin process (no agent) from source through the test launcher (`faults`: cni/faults.py)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(env, PYTHONPATH=PYTHONPATH, PYCNI_AGENT="off")
    r, w = os.pipe()  # the config, whole in the pipe before the process starts (a few KB)
    os.write(w, jsonio.dumps(conf))
    os.close(w)
    try:
        return subprocess.Popen(launch.command("whereabouts", faults), stdin=r, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=REPO, env=full)  # fmt: skip
    finally:
        os.close(r)


def _finish(proc: subprocess.Popen[bytes], timeout: float = 150) -> tuple[int, bytes, bytes]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def _call(conf: dict[str, Any], env: dict[str, str]) -> str:
    """One call as the runtime makes it: run again while it answers code 11, at most RETRIES times; it
    must succeed. The address it answered (ADD), else ""."""
    said = []
    for _ in range(RETRIES):
        rc, out, err = _finish(_start(conf, env))
        doc = jsonio.loads(out) if out.strip() else {}
        if rc == 0:
            return str(doc["ips"][0]["address"].split("/")[0]) if doc.get("ips") else ""
        assert doc.get("code") == 11, (rc, out, err[-3000:])
        said.append(f"{doc.get('msg')} ({doc.get('details')}); {err.decode(errors='replace')[-1500:]}")
    raise AssertionError(f"{env['CNI_COMMAND']} {env['CNI_CONTAINERID']}: code 11 {RETRIES} times: {said}")


def _conf(tenant: Tenant, tmp: Path) -> dict[str, Any]:
    return base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}},
                     tmp, range=RANGE)  # fmt: skip


def _intents(tenant: Tenant) -> list[str]:
    doc = tenant.server.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{tenant.namespace}/leases",
                                query={"labelSelector": f"{INTENT_OF}={digest(POOL)}"})  # fmt: skip
    return [i["metadata"]["name"] for i in doc.get("items") or []]


def _turn(tenant: Tenant) -> dict[str, Any]:
    path = f"/apis/coordination.k8s.io/v1/namespaces/{tenant.namespace}/leases/{turn_name(POOL)}"
    return tenant.server.request("GET", path)  # type: ignore[no-any-return]


def _held(tenant: Tenant) -> dict[str, str]:
    """Every attachment's address: pool entries and reservations must agree, one of each per
    attachment, no address twice."""
    entries = {k: a["id"] for k, a in tenant.pools().get(POOL, {}).items()}
    reservations = {name: spec.get("containerid", "") for name, spec in tenant.reservations().items()}
    by_entry = {cid: f"198.51.100.{k}" for k, cid in entries.items()}
    assert len(by_entry) == len(entries), f"a container holds two entries: {entries}"
    assert {v: k for k, v in reservations.items()} == by_entry and len(reservations) == len(entries), (
        entries, reservations)
    return by_entry


def _nothing_left(tenant: Tenant) -> None:
    assert tenant.pools().get(POOL, {}) == {} and tenant.reservations() == {}
    until(lambda: not _intents(tenant), "every intent deleted", 30)
    assert _turn(tenant)["spec"].get("holderIdentity", "") == ""


def _cid(i: int) -> str:
    return f"{i:08x}" + "c" * 56


def test_a_writer_waits_for_a_held_turn_and_its_intent_is_written(tenant: Tenant, tmp_path: Path) -> None:
    """The turn held by someone: a second node's ADD posts its intent and waits; the turn freed, it takes
    it and writes. The pool then says it is shared (its turn's name), and nothing of the turn stays."""
    conf, ns = _conf(tenant, tmp_path), tenant.namespace
    _call(conf, _env("ADD", _cid(1), "node-a", ns))  # creates the pool, written by node-a alone
    assert "pycni.io/turn" not in (tenant.server.request(
        "GET", tenant.path("ippools", POOL))["metadata"].get("annotations") or {})  # fmt: skip
    store = open_kube(tenant.node)
    turn = KubeTurn(store, POOL)
    state = turn.turn() or turn.create()
    held = turn.take(state, "test/1/hold")
    assert held is not None
    # node-b's ADD in this process (as a plugin process runs it: the requests are recorded, test_rbac)
    b_store = open_kube(tenant.node)
    b_conf = from_dict({"range": RANGE, "datastore": "kubernetes",
                        "kubernetes": {"kubeconfig": str(tenant.node)},
                        "local_db": str(tmp_path / "state" / "whereabouts.db")})  # fmt: skip
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(Engine(b_store, b_conf).add(
        Allocation(_cid(2), f"{ns}/p-{_cid(2)[:8]}", "net1", "", "blue", "node-b"))))  # fmt: skip
    waiter.start()
    until(lambda: len(_intents(tenant)) == 1, "the waiting writer's intent", 60)
    assert waiter.is_alive(), "it waits while the turn is held"
    assert turn.release(held, "test/1/hold", Outcome(), "") is not None
    waiter.join(60)
    assert not waiter.is_alive() and got and got[0][0][1] == 2
    b_store.close()
    assert _held(tenant) == {_cid(1): "198.51.100.1", _cid(2): "198.51.100.2"}
    pool = tenant.server.request("GET", tenant.path("ippools", POOL))
    assert pool["metadata"]["annotations"]["pycni.io/turn"] == turn_name(POOL)
    assert not _intents(tenant) and _turn(tenant)["spec"]["holderIdentity"] == ""
    store.close()
    for i, node in ((1, "node-a"), (2, "node-b")):
        _call(conf, _env("DEL", _cid(i), node, ns))
    _nothing_left(tenant)


@pytest.fixture
def agent() -> Iterator[None]:
    """This test process as node-a's agent (the pool's calls meet in its combiners)."""
    batch.install()
    yield
    batch.uninstall()


def test_many_nodes_at_once_and_an_agent_beside_plugin_processes(
    agent: None, tenant: Tenant, tmp_path: Path
) -> None:
    """Eight nodes' plugin processes, four at a time each, and node-a's agent (this process, four calls
    in threads) beside node-a's plugin processes, all on one pool at once: every ADD succeeds (code 11
    retried), each attachment one entry and one reservation, no address twice; the DELs leave nothing."""
    conf, ns = _conf(tenant, tmp_path), tenant.namespace
    _call(conf, _env("ADD", _cid(999), "node-b", ns))  # the pool exists, written by another node
    nodes = [f"node-{c}" for c in "abcdefgh"]
    work = [(_cid(i), nodes[i % len(nodes)]) for i in range(32)]
    answered: dict[str, str] = {}
    lock = threading.Lock()
    engine_conf = from_dict({"range": RANGE, "datastore": "kubernetes",
                             "kubernetes": {"kubeconfig": str(tenant.node)},
                             "local_db": str(tmp_path / "state" / "whereabouts.db")})  # node-a's node locks

    def by_agent(cid: str) -> None:
        store = open_kube(tenant.node)
        try:
            e = Engine(store, engine_conf, execute=plugin.EXECUTE)
            [(rng, offset)] = e.add(Allocation(cid, f"{ns}/agent-{cid[:8]}", "net1", "", "blue", "node-a"))
            with lock:
                answered[cid] = str(rng.address(offset))
        finally:
            store.close()

    def by_process(cid: str, node: str) -> None:
        ip = _call(conf, _env("ADD", cid, node, ns))
        with lock:
            answered[cid] = ip

    threads = [threading.Thread(target=by_process, args=w) for w in work]
    threads += [threading.Thread(target=by_agent, args=(_cid(100 + i),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads)
    held = _held(tenant)
    assert len(answered) == 36 and all(held[cid] == ip for cid, ip in answered.items()), (answered, held)
    for cid, node in [*work, (_cid(999), "node-b")]:
        _call(conf, _env("DEL", cid, node, ns))
    store = open_kube(tenant.node)
    for i in range(4):
        cid = _cid(100 + i)
        owner = Allocation(cid, f"{ns}/agent-{cid[:8]}", "net1", "", "blue", "node-a")
        Engine(store, engine_conf, execute=plugin.EXECUTE).delete(owner)
    store.close()
    _nothing_left(tenant)


def test_a_writer_killed_holding_the_turn_is_taken_over(tenant: Tenant, tmp_path: Path) -> None:
    """node-b's ADD takes the free turn and is SIGKILLed before its pool write (`turn-round!`): node-c's
    ADD waits, takes the silent turn over within TURN_SECONDS (plus a watch's length) and writes; node-b's
    retry (the runtime's) then allocates and frees the reservation the killed one claimed."""
    conf, ns = _conf(tenant, tmp_path), tenant.namespace
    _call(conf, _env("ADD", _cid(1), "node-a", ns))
    _call(conf, _env("ADD", _cid(9), "node-b", ns))  # shared from here: node-a and node-b wrote it
    rc, out, err = _finish(_start(conf, _env("ADD", _cid(2), "node-b", ns), faults="turn-round!"))
    assert rc == -signal.SIGKILL, (out, err[-3000:])
    assert _turn(tenant)["spec"]["holderIdentity"].startswith("node-b/")
    began = time.monotonic()
    _call(conf, _env("ADD", _cid(3), "node-c", ns))
    took = time.monotonic() - began
    print(f"\ntaken over after {took:.1f} s (TURN_SECONDS {TURN_SECONDS:g})")
    assert took >= TURN_SECONDS - 0.5 and took < 2 * TURN_SECONDS + 20, took
    _call(conf, _env("ADD", _cid(2), "node-b", ns))
    assert set(_held(tenant)) == {_cid(i) for i in (1, 2, 3, 9)}
    for i, node in ((1, "node-a"), (9, "node-b"), (2, "node-b"), (3, "node-c")):
        _call(conf, _env("DEL", _cid(i), node, ns))
    _nothing_left(tenant)


def test_a_stalled_holder_is_taken_over_and_resumes_harmlessly(tenant: Tenant, tmp_path: Path) -> None:
    """node-b's ADD takes the turn and stalls (SIGSTOP: a frozen node, a network stall) before its pool
    write; node-c's ADD takes the turn over and writes; node-b resumed writes its own guarded entry (its
    address is its reservation's), finds the turn no longer its own, and answers: both hold one address."""
    conf, ns = _conf(tenant, tmp_path), tenant.namespace
    _call(conf, _env("ADD", _cid(1), "node-a", ns))
    _call(conf, _env("ADD", _cid(9), "node-b", ns))
    stalled = _start(conf, _env("ADD", _cid(2), "node-b", ns), faults="turn-round~")
    try:
        until(lambda: _state(stalled.pid) == "T", "node-b's ADD stopped holding the turn", 60)
        assert _turn(tenant)["spec"]["holderIdentity"].startswith("node-b/")
        _call(conf, _env("ADD", _cid(3), "node-c", ns))
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    rc, out, err = _finish(stalled)
    assert rc == 0, (out, err[-3000:])
    held = _held(tenant)
    assert set(held) == {_cid(i) for i in (1, 2, 3, 9)}
    assert held[_cid(2)] == jsonio.loads(out)["ips"][0]["address"].split("/")[0]
    for i, node in ((1, "node-a"), (9, "node-b"), (2, "node-b"), (3, "node-c")):
        _call(conf, _env("DEL", _cid(i), node, ns))
    _nothing_left(tenant)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[kubeup.KubeServer]:
    """A kube-apiserver of this test's own (it is restarted)."""
    reason = kubeup.absent()
    if reason:
        pytest.skip(reason)
    server = kubeup.KubeServer.start(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def test_the_api_server_restarted_while_writers_wait(own_server: kubeup.KubeServer, tmp_path: Path) -> None:
    """Sixteen ADDs of eight nodes on one shared pool; once intents wait, the API server is restarted
    (down a second): a call whose intent waits keeps it and is written once the server is back; a call
    that failed all the same answers code 11 and its retry succeeds; one entry per attachment (a call
    that answered code 11 while its intent could still be written would hold two after its retry), no
    address twice, and the DELs leave nothing."""
    tenant = Tenant(own_server, tmp_path / "kube")
    conf, ns = _conf(tenant, tmp_path), tenant.namespace
    _call(conf, _env("ADD", _cid(999), "node-a", ns))
    _call(conf, _env("ADD", _cid(998), "node-b", ns))
    work = [(_cid(i), f"node-{'abcdefgh'[i % 8]}") for i in range(16)]
    first = [(w, _start(conf, _env("ADD", *w, ns))) for w in work]
    until(lambda: bool(_intents(tenant)) or all(p.poll() is not None for _, p in first),
          "writers waiting for the turn", 120)  # fmt: skip
    own_server.restart_apiserver(down=1.0)
    retried = 0
    for (cid, node), proc in first:
        rc, out, err = _finish(proc)
        if rc != 0:
            assert jsonio.loads(out).get("code") == 11, (rc, out, err[-3000:])
            retried += 1
            _call(conf, _env("ADD", cid, node, ns))
    print(f"\n{retried} of {len(first)} ADDs answered code 11 and were retried")
    assert set(_held(tenant)) == {cid for cid, _ in work} | {_cid(999), _cid(998)}
    for cid, node in [*work, (_cid(999), "node-a"), (_cid(998), "node-b")]:
        _call(conf, _env("DEL", cid, node, ns))
    _nothing_left(tenant)
