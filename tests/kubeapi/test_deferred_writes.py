"""The agent's deferred pool writes (`pycni-agent --defer-writes`, ipam.batch) on the real kube-apiserver:
an ADD is answered once its address is reserved (OverlappingRangeIPReservation), before the IPPool
write. An agent killed (SIGKILL) inside that window leaves the address held by its reservation alone:
another node's ADD does not get it, and the pod's DEL frees the reservation (Reservations.sweep).
Nothing is ever handed out twice. The agent runs from source, a plugin call is a fresh process."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests import kubeup
from tests.bench.ipam_scale import Pod, Pycni, Workload, held, network_config, one_call
from tests.nsutil import is_root
from tests.unit.helpers import in_threads

# a window of 60 s that no lull ends: the write is held until the agent dies or stops
HELD = ("--defer-writes", "60", "--defer-idle", "60")
WL = Workload(pods=2, networks=1, nodes=1, concurrency=1, mode="shared", budget=120.0, call_timeout=60.0)


def test_an_agent_killed_before_its_deferred_write(tenant: kubeup.Tenant, tmp_path: Path) -> None:
    if not is_root():
        pytest.skip("the agent serves root only")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    agent = Pycni(None, agents=1, scratch=tmp_path / "a", agent_args=HELD, agent_timeout=120)
    try:
        agent.setup(tenant, tmp_path / "a")
        first = one_call(agent, WL, "ADD", Pod(0, tenant.namespace, "k"), 1,
                         {1: network_config(agent, WL, 1)}, time.monotonic() + 60)  # fmt: skip
        assert first.ok, first.error
        assert agent.served()["ADD"] == 1  # answered by the agent, not in-process
        # answered with its reservation made and its pool write still to come (a 60 s window)
        assert [r for r in tenant.reservations() if r.endswith(first.ip)] != []
        assert first.ip not in [ip for _, ip, _ in held(tenant)]
        node = agent.agents["node-0"]
        assert node.unwritten() == 1
        node.signal(signal.SIGKILL)
        assert node.proc is not None and node.proc.wait(30) == -signal.SIGKILL
    finally:
        agent.close()
    solo = Pycni(None, agents=0, scratch=tmp_path / "b")
    solo.setup(tenant, tmp_path / "b")
    confs = {1: network_config(solo, WL, 1)}
    second = one_call(solo, WL, "ADD", Pod(1, tenant.namespace, "k"), 1, confs, time.monotonic() + 60)
    assert second.ok, second.error
    assert second.ip != first.ip  # the reservation alone kept the address from being handed out again
    gone = one_call(solo, WL, "DEL", Pod(0, tenant.namespace, "k"), 1, confs, time.monotonic() + 60)
    assert gone.ok, gone.error
    assert [ip for _, ip, _ in held(tenant)] == [second.ip]
    assert [r for r in tenant.reservations() if r.endswith(first.ip)] == []
    assert len(tenant.reservations()) == 1


def test_sigterm_during_a_deferred_write_writes_it_within_the_grace(
    tenant: kubeup.Tenant, tmp_path: Path
) -> None:
    """The agent stopping closes the window under way and writes what it answered, inside its one
    budget (--grace) for requests and writes: the pool then holds the address, the agent exits 0 and
    says nothing was left unwritten."""
    if not is_root():
        pytest.skip("the agent serves root only")
    agent = Pycni(None, agents=1, scratch=tmp_path, agent_args=(*HELD, "--grace", "30"), agent_timeout=120)
    try:
        agent.setup(tenant, tmp_path)
        first = one_call(agent, WL, "ADD", Pod(0, tenant.namespace, "t"), 1,
                         {1: network_config(agent, WL, 1)}, time.monotonic() + 60)  # fmt: skip
        assert first.ok, first.error
        node = agent.agents["node-0"]
        assert node.unwritten() == 1  # answered, its write held by the 60 s window
        assert first.ip not in [ip for _, ip, _ in held(tenant)]
        node.signal(signal.SIGTERM)
        assert node.proc is not None and node.proc.wait(60) == 0
        log = node.log.read_text(errors="replace")
    finally:
        agent.close()
    assert [ip for _, ip, _ in held(tenant)] == [first.ip]
    assert "pool writes still to come" not in log, log


def test_concurrent_adds_through_the_agent_cost_one_reservation_post_each(
    tenant: kubeup.Tenant, tmp_path: Path
) -> None:
    """Calls that meet in the agent's batch, each answered as soon as its reservation is made
    (ipam.exec_agent Agent.each): exactly one POST per ADD, no 409, no reservation read, every
    address once, all answered before the pool is written; the pool is written once for all of them
    (the window held until the agent stops); their DELs leave nothing."""
    if not is_root():
        pytest.skip("the agent serves root only")
    n = 6
    wl = Workload(pods=n, networks=1, nodes=1, concurrency=n, mode="shared", budget=120.0, call_timeout=60.0)
    agent = Pycni(None, agents=1, scratch=tmp_path, agent_args=(*HELD, "--grace", "30"), agent_timeout=120)
    server = tenant.server

    def counts() -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for (verb, res, code), v in server.request_counts().items():
            if res in ("overlappingrangeipreservations", "ippools"):
                key = (f"{verb} {code}", res)
                out[key] = out.get(key, 0.0) + v
        return out

    def delta(before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        return {k: v - before.get(k, 0.0) for k, v in counts().items() if v - before.get(k, 0.0) > 0}

    try:
        agent.setup(tenant, tmp_path)
        confs = {1: network_config(agent, wl, 1)}
        pods = [Pod(i, tenant.namespace, "f") for i in range(n)]
        before = counts()
        adds = in_threads(n, lambda i: one_call(agent, wl, "ADD", pods[i], 1, confs, time.monotonic() + 90),
                          timeout=150)
        assert all(c.ok for c in adds), [c.error for c in adds]
        assert agent.served()["ADD"] == n
        assert len({c.ip for c in adds}) == n
        assert delta(before) == {("POST 201", "overlappingrangeipreservations"): n,
                                 ("GET 404", "ippools"): 1}  # fmt: skip
        node = agent.agents["node-0"]
        assert node.unwritten() == n  # all answered, the window holding their one write
        node.signal(signal.SIGTERM)
        assert node.proc is not None and node.proc.wait(60) == 0
    finally:
        agent.close()
    assert sorted(ip for _, ip, _ in held(tenant)) == sorted(c.ip for c in adds)
    writes = {k: v for k, v in delta(before).items()
              if k[1] == "ippools" and k[0].split()[0] in ("POST", "PUT", "PATCH")}  # fmt: skip
    assert sum(writes.values()) == 1, writes
    (tmp_path / "del").mkdir()
    again = Pycni(None, agents=1, scratch=tmp_path / "del", agent_timeout=120)
    try:
        again.setup(tenant, tmp_path / "del")
        confs = {1: network_config(again, wl, 1)}
        before = counts()
        dels = in_threads(n, lambda i: one_call(again, wl, "DEL", pods[i], 1, confs, time.monotonic() + 90),
                          timeout=150)
        assert all(c.ok for c in dels), [c.error for c in dels]
        again.settle()
    finally:
        again.close()
    assert held(tenant) == [] and tenant.reservations() == {}
    deletes = delta(before).get(("DELETE 200", "overlappingrangeipreservations"), 0.0)
    assert deletes == n
