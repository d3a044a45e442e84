"""An ADD killed between its reservation and its pool write (a real plugin process SIGKILLed at the
fault point `store-reserve`, tests/launch.py), then retried: with the same container id, or as the
kubelet does, with a new sandbox for the same pod and interface; on the real kube-apiserver, without the
agent. The retry frees the reservation the killed ADD left (ipam.reservations: it was noted in the pool's
node lock) and allocates as any ADD: one reservation and one pool entry, both naming the retried
container; the old sandbox's DEL then leaves them alone and the new one's DEL leaves nothing. Every
request of the retry is counted."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from tests import launch
from tests.concurrency.harness import base_conf
from tests.kubeup import Tenant
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO

POOL = "198.51.100.0-24"
KINDS = ("ippools", "overlappingrangeipreservations")


def _env(command: str, cid: str, pod: str, node: str = "node-1") -> dict[str, str]:
    ns, name = pod.split("/")
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/run/netns/none",
            "CNI_IFNAME": "net1", "CNI_PATH": "/usr/lib/cni", "NODENAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"}  # fmt: skip


def _call(conf: dict[str, Any], env: dict[str, str], faults: str = "") -> subprocess.CompletedProcess[bytes]:
    """A plugin process (no agent) from source through the test launcher (`faults`: cni/faults.py)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(env, PYTHONPATH=PYTHONPATH, PYCNI_AGENT="off")
    return subprocess.run(launch.command("whereabouts", faults), input=jsonio.dumps(conf), cwd=REPO,
                          env=full, capture_output=True, timeout=120, check=False)  # fmt: skip


Spent = dict[tuple[str, str], float]


def _counted(tenant: Tenant, conf: dict[str, Any], env: dict[str, str]) -> tuple[str, Spent]:
    """One call that must succeed: its address (ADD) and its requests on pools and reservations."""
    before = tenant.server.request_counts()
    p = _call(conf, env)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    spent: Spent = {}
    for (verb, resource, code), n in tenant.server.request_counts().items():
        if resource in KINDS and n > before.get((verb, resource, code), 0):
            key = (f"{verb} {code}", resource)
            spent[key] = spent.get(key, 0) + n - before.get((verb, resource, code), 0)
    out = jsonio.loads(p.stdout) if p.stdout.strip() else {}
    return (out["ips"][0]["address"].split("/")[0] if out.get("ips") else ""), spent


def _held(tenant: Tenant) -> tuple[dict[str, str], dict[str, str]]:
    """(pool entry offset -> container id, reservation name -> container id)."""
    pool = {k: a["id"] for k, a in tenant.pools().get(POOL, {}).items()}
    return pool, {name: spec.get("containerid", "") for name, spec in tenant.reservations().items()}


RETRY = {"same": ("1" * 64, "1" * 64), "new sandbox": ("1" * 64, "2" * 64)}


@pytest.mark.parametrize("freed_below", [False, True], ids=["nothing-freed", "lower-address-freed"])
@pytest.mark.parametrize("retry", list(RETRY))
def test_a_killed_add_retried_leaves_one_reservation_and_one_entry(
    tenant: Tenant, tmp_path: Path, retry: str, freed_below: bool
) -> None:
    """`freed_below`: a lower address is freed between the kill and the retry (on another node, whose
    calls take another node lock), so the retry would not pick the killed ADD's address again."""
    conf = base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}},
                     tmp_path, range="198.51.100.0/24")  # fmt: skip
    pod, other = f"{tenant.namespace}/p", f"{tenant.namespace}/x"
    first, again = RETRY[retry]
    _counted(tenant, conf, _env("ADD", "x" * 64, other, node="node-2"))  # .1 (creates the pool)

    killed = _call(conf, _env("ADD", first, pod), faults="store-reserve!")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-2000:]
    assert _held(tenant) == ({"1": "x" * 64}, {"198.51.100.1": "x" * 64, "198.51.100.2": first})

    if freed_below:
        _counted(tenant, conf, _env("DEL", "x" * 64, other, node="node-2"))
    ip, spent = _counted(tenant, conf, _env("ADD", again, pod))
    offset = ip.rsplit(".", 1)[1]
    assert offset == ("1" if freed_below else "2")
    pool, reservations = _held(tenant)
    assert pool.get(offset) == again and reservations.get(ip) == again
    assert [c for c in (*pool.values(), *reservations.values()) if c != "x" * 64] == [again, again]
    # the leftover: the pool read and the reservation read and deleted (with its version) once; then
    # the ADD as any: the pool read, the address reserved, the pool written
    assert spent == {("GET 200", "ippools"): 2, ("GET 200", "overlappingrangeipreservations"): 1,
                     ("DELETE 200", "overlappingrangeipreservations"): 1,
                     ("POST 201", "overlappingrangeipreservations"): 1, ("PATCH 200", "ippools"): 1}

    _, spent = _counted(tenant, conf, _env("ADD", again, pod))  # the notes were taken off: nothing left
    assert spent == {("GET 200", "ippools"): 1, ("POST 409", "overlappingrangeipreservations"): 1,
                     ("GET 200", "overlappingrangeipreservations"): 1}  # (its own reservation: kept)
    if first != again:  # the old sandbox's DEL: nothing of it left, nothing of the new one touched
        before = _held(tenant)
        _counted(tenant, conf, _env("DEL", first, pod))
        assert _held(tenant) == before
    _counted(tenant, conf, _env("DEL", again, pod))
    pool, reservations = _held(tenant)
    assert again not in (*pool.values(), *reservations.values())
    if not freed_below:
        _counted(tenant, conf, _env("DEL", "x" * 64, other, node="node-2"))
    assert _held(tenant) == ({}, {})


def test_an_add_killed_after_its_pool_write_keeps_its_address(tenant: Tenant, tmp_path: Path) -> None:
    """Killed after the pool write (`store-commit`), before the lock's release took its note off: the
    next holder finds the address written, frees nothing, and the retry answers the same address."""
    conf = base_conf("blue", {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}},
                     tmp_path, range="198.51.100.0/24")  # fmt: skip
    pod, cid = f"{tenant.namespace}/p", "3" * 64
    killed = _call(conf, _env("ADD", cid, pod), faults="store-commit!")
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr[-2000:]
    assert _held(tenant) == ({"1": cid}, {"198.51.100.1": cid})
    ip, spent = _counted(tenant, conf, _env("ADD", cid, pod))
    assert ip == "198.51.100.1" and _held(tenant) == ({"1": cid}, {"198.51.100.1": cid})
    assert ("DELETE 200", "overlappingrangeipreservations") not in spent
    _counted(tenant, conf, _env("DEL", cid, pod))
    assert _held(tenant) == ({}, {})
