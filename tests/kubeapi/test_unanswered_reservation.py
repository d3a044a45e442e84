"""A reservation POST that the real kube-apiserver applied but answered past the client's read timeout
(issue 45: recorded nowhere, its retry took another address and the first reservation, naming the live
attachment, stayed until the pod was gone). The fault: tests/kubeapi/stallproxy.py between the client
and the server forwards the POST, receives the server's answer and never sends it; the client gives up
at its read timeout (StoreBusy) and retries. Meanwhile the lower address another node held is freed, so
the retry takes that one: the ADD must end with one reservation, the attachment's, at the address it
answered (ipam.reservations: the create recorded as maybe made, deleted at the ADD's end when not
kept), and its DEL must leave none. In the agent's mode (ipam.batch.install) and a plugin process' (no
sharing), as tests/kubeapi/test_lost_release.py. Then a plugin process killed while its POST waits for
the withheld answer: the POST was noted in the pool's node lock before it was sent, and the retried
ADD frees that reservation."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni import jsonio
from ipam import plugin, rbac
from ipam.config import IpamConfig, from_dict
from ipam.engine import Engine
from ipam.kubeapi import Client, load_kubeconfig
from ipam.model import Allocation, PoolUpdate
from ipam.store.kube import KubeStore
from tests import launch
from tests.concurrency.harness import base_conf
from tests.kubeapi.stallproxy import StallProxy
from tests.kubeapi.test_killed_add import _call, _env, _held
from tests.kubeup import Tenant
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO
from tests.unit.ipam.test_unanswered_reservation import mode

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
B = Allocation("b" * 64, "ns/b", "net1", "uid-b", "blue", "node-2")
POOL = "198.51.100.0-24"
READ = 3.0  # the read timeout of the stores under test here (the product's: ipam.kubeapi.TIMEOUT)


def _creates_reservation(method: str, path: str) -> bool:
    return method == "POST" and path.partition("?")[0].endswith("/overlappingrangeipreservations")


@pytest.fixture
def proxy(tenant: Tenant) -> Iterator[StallProxy]:
    p = StallProxy(tenant.server)
    try:
        yield p
    finally:
        p.close()
    assert not p.errors, p.errors


def _store(kubeconfig: Path) -> KubeStore:
    conf = load_kubeconfig(str(kubeconfig))
    return KubeStore(Client(conf, timeout=(3.0, READ)), conf.namespace, role=rbac.NODE)


def _conf(kubeconfig: Path, tmp: Path) -> IpamConfig:
    return from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes",
                      "kubernetes": {"kubeconfig": str(kubeconfig)},
                      "local_db": str(tmp / "state" / "whereabouts.db")})  # fmt: skip


def _free_1(tenant: Tenant) -> None:
    """B's DEL on its node, at the store: its entry at .1, then its reservation."""
    store = _store(tenant.node)
    pool = store.get_pool(POOL)
    assert pool is not None and pool.allocations["1"].container_id == B.container_id
    store.commit_pool(pool, PoolUpdate(remove=frozenset({"1"})))
    res = store.get_reservation("198.51.100.1")
    assert res is not None and res.owner.container_id == B.container_id
    store.delete_reservation(res)


def _reservations(tenant: Tenant) -> dict[str, str]:
    return {name: spec.get("containerid", "") for name, spec in tenant.reservations().items()}


@pytest.mark.parametrize("how", ["agent", "plugin"])
def test_a_reservation_applied_and_answered_too_late_is_freed_by_the_add(
    tenant: Tenant, tmp_path: Path, proxy: StallProxy, how: str
) -> None:
    assert Engine(_store(tenant.node), _conf(tenant.node, tmp_path)).add(B)[0][1] == 1  # node-2: .1
    kubeconfig = proxy.kubeconfig(tenant.node, tmp_path / "proxied.kubeconfig")
    store, conf = _store(kubeconfig), _conf(kubeconfig, tmp_path)

    def engine() -> Engine:  # as the plugin builds it, in the execution mode of `mode`
        return Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=plugin.EXECUTE)

    proxy.stall(_creates_reservation, meanwhile=lambda: _free_1(tenant))
    with mode(how):
        [(rng, offset)] = engine().add(A)
    assert (proxy.status, proxy.hung_up) == (201, 1)  # .2 created, and the client gave up on the answer
    answered = str(rng.address(offset))
    assert answered == "198.51.100.1"  # the retry took the address freed meanwhile
    assert _reservations(tenant) == {answered: A.container_id}
    assert {k: a["id"] for k, a in tenant.pools()[POOL].items()} == {"1": A.container_id}
    with mode(how):
        engine().delete(A)
    assert tenant.pools() == {POOL: {}}
    assert tenant.reservations() == {}


def test_an_add_killed_while_its_post_waits_for_the_answer_is_freed_by_its_retry(
    tenant: Tenant, tmp_path: Path, proxy: StallProxy
) -> None:
    """A plugin process (no agent) whose reservation POST the server applied is SIGKILLed while it waits
    for the answer; a lower address is freed; the retried ADD (a new process, the same container) frees
    the reservation the killed one noted in the pool's node lock and takes the lower address."""
    assert Engine(_store(tenant.node), _conf(tenant.node, tmp_path / "b")).add(B)[0][1] == 1
    kubeconfig = proxy.kubeconfig(tenant.node, tmp_path / "proxied.kubeconfig")
    conf = base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)}},
                     tmp_path, range="198.51.100.0/24")  # fmt: skip
    pod = f"{tenant.namespace}/p"
    proxy.stall(_creates_reservation)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(_env("ADD", A.container_id, pod), PYTHONPATH=PYTHONPATH, PYCNI_AGENT="off")
    proc = subprocess.Popen(launch.command("whereabouts"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=REPO, env=env)  # fmt: skip
    try:
        assert proc.stdin is not None
        proc.stdin.write(jsonio.dumps(conf))
        proc.stdin.close()
        assert proxy.stalled.wait(60), "the ADD never sent its reservation POST"
        assert proxy.status == 201
    finally:
        proc.kill()
        proc.wait(60)
    assert proc.stderr is not None and proc.stdout is not None
    err = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert _held(tenant) == ({"1": B.container_id}, {"198.51.100.1": B.container_id,
                                                      "198.51.100.2": A.container_id})  # fmt: skip
    _free_1(tenant)
    p = _call(conf, _env("ADD", A.container_id, pod))
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert jsonio.loads(p.stdout)["ips"][0]["address"] == "198.51.100.1/24"
    assert _held(tenant) == ({"1": A.container_id}, {"198.51.100.1": A.container_id})
    p = _call(conf, _env("DEL", A.container_id, pod))
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert _held(tenant) == ({}, {})
