"""The agent answers a call after its pool write (issue 37), on the real kube-apiserver, through the
shims of plugin processes: when an ADD has returned, its IPPool entry exists and names its container,
also when it took over the entry of a StatefulSet pod of the same name; when a DEL has returned, its
entry and reservation are gone. The agent runs from source, a plugin call is a fresh process; what each
call checks, it checks right after its own return, whatever the other calls are doing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests import kubeup
from tests.bench.ipam_scale import Pod, Pycni, Workload, held, network_config, one_call
from tests.nsutil import is_root
from tests.skips import ROOT
from tests.unit.helpers import in_threads

pytestmark = pytest.mark.skipif(not is_root(), reason=f"{ROOT}the agent serves root only")


def _entry(tenant: kubeup.Tenant, ip: str) -> dict[str, Any] | None:
    found = [entry for _, at, entry in held(tenant) if at == ip]
    return found[0] if found else None


def _counts(server: kubeup.KubeServer) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for (verb, res, code), v in server.request_counts().items():
        if res in ("overlappingrangeipreservations", "ippools"):
            key = (f"{verb} {code}", res)
            out[key] = out.get(key, 0.0) + v
    return out


def test_calls_through_the_agent_return_after_their_pool_write(tenant: kubeup.Tenant, tmp_path: Path) -> None:
    n = 6
    wl = Workload(pods=n, networks=1, nodes=1, concurrency=n, mode="shared", budget=120.0, call_timeout=60.0)
    agent = Pycni(None, agents=1, scratch=tmp_path, agent_timeout=120)
    try:
        agent.setup(tenant, tmp_path)
        confs = {1: network_config(agent, wl, 1)}
        pods = [Pod(i, tenant.namespace, "a") for i in range(n)]
        before = _counts(tenant.server)

        def add(i: int) -> tuple[Any, dict[str, Any] | None, bool]:
            c = one_call(agent, wl, "ADD", pods[i], 1, confs, time.monotonic() + 90)
            reserved = any(r.endswith(c.ip or "-") for r in tenant.reservations())
            return c, (_entry(tenant, c.ip) if c.ok and c.ip else None), reserved

        adds = in_threads(n, add, timeout=150)
        assert all(c.ok for c, _, _ in adds), [c.error for c, _, _ in adds]
        assert agent.served()["ADD"] == n  # every call served by the agent, none in-process
        for (c, entry, reserved), pod in zip(adds, pods, strict=True):
            assert entry is not None and entry["id"] == pod.sandbox and entry["podref"].endswith(pod.name)
            assert reserved, c.ip
        assert len({c.ip for c, _, _ in adds}) == n
        now = _counts(tenant.server)
        spent = {k: v - before.get(k, 0.0) for k, v in now.items() if v > before.get(k, 0.0)}
        assert spent.get(("POST 201", "overlappingrangeipreservations")) == n  # one reservation each
        writes = sum(v for (verb, res), v in spent.items() if res == "ippools" and verb.split()[0] in
                     ("POST", "PATCH", "PUT"))  # fmt: skip
        assert 1 <= writes <= n, spent  # calls that arrive during a write share the next one

        def delete(i: int) -> tuple[Any, bool, bool]:
            c = one_call(agent, wl, "DEL", pods[i], 1, confs, time.monotonic() + 90)
            ip = adds[i][0].ip
            return c, _entry(tenant, ip) is None, not any(r.endswith(ip) for r in tenant.reservations())

        dels = in_threads(n, delete, timeout=150)
        assert all(c.ok and entry_gone and res_gone for c, entry_gone, res_gone in dels), dels
        assert held(tenant) == [] and tenant.reservations() == {}
    finally:
        agent.close()


def test_an_add_that_takes_over_a_statefulset_pods_entry_returns_after_the_entry_names_it(
    tenant: kubeup.Tenant, tmp_path: Path
) -> None:
    """A StatefulSet pod replaced by one of the same name (a new sandbox and UID; its DEL never ran):
    the new pod's ADD takes the old entry over, and when it returns the entry names the new container."""
    wl = Workload(pods=1, networks=1, nodes=1, concurrency=1, mode="shared", budget=120.0, call_timeout=60.0)
    agent = Pycni(None, agents=1, scratch=tmp_path, agent_timeout=120)
    try:
        agent.setup(tenant, tmp_path)
        confs = {1: network_config(agent, wl, 1)}
        old, new = Pod(0, tenant.namespace, "o"), Pod(0, tenant.namespace, "n")
        assert old.name == new.name and old.sandbox != new.sandbox
        first = one_call(agent, wl, "ADD", old, 1, confs, time.monotonic() + 90)
        assert first.ok, first.error
        again = one_call(agent, wl, "ADD", new, 1, confs, time.monotonic() + 90)
        assert again.ok, again.error
        entry = _entry(tenant, again.ip)
        assert again.ip == first.ip and entry is not None and entry["id"] == new.sandbox
        assert [e["id"] for _, _, e in held(tenant)] == [new.sandbox]
        assert agent.served()["ADD"] == 2
    finally:
        agent.close()
