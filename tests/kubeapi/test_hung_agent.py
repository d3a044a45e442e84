"""A node-local agent frozen (SIGSTOP) while it holds a pool's node lock (ipam.nodelock), on the real
kube-apiserver: the shims' calls of that node must still complete in-process, on that pool and on
another one (issue 28: on the real node, a pod never became Ready with the agent stopped).

The agent is held inside its deferred-write window (60 s, no lull ends it): it answered an ADD and
holds the pool's node lock until its write, so the SIGSTOP lands while the lock is held, every time.
Before the fix the in-process calls waited PATIENCE (60 s) for a holder that never moves and ended with
code 11; the kubelet's retries met the same lock. The agent is resumed and stopped in teardown; its
write, decided before the in-process calls, must then neither undo theirs nor hand out an address twice."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests import kubeup
from tests.bench.ipam_scale import Pod, Pycni, Workload, held, network_config, one_call
from tests.nsutil import is_root

HELD = ("--defer-writes", "60", "--defer-idle", "60")
# per-network: net 1 and net 2 are two pools (198.19.1.0/24, 198.19.2.0/24)
WL = Workload(pods=4, networks=2, nodes=1, concurrency=1, mode="per-network", budget=120.0,
              call_timeout=120.0)  # fmt: skip


def test_a_stopped_agent_holding_a_pool_lock_does_not_block_in_process_calls(
    tenant: kubeup.Tenant, tmp_path: Path
) -> None:
    if not is_root():
        pytest.skip("the agent serves root only")
    agent = Pycni(None, agents=1, scratch=tmp_path, agent_args=HELD)  # the shims' default READY timeout
    node = None
    try:
        agent.setup(tenant, tmp_path)
        confs = {net: network_config(agent, WL, net) for net in (1, 2)}

        def call(command: str, pod: int, net: int) -> str:
            done = one_call(agent, WL, command, Pod(pod, tenant.namespace, "h"), net, confs,
                            time.monotonic() + 120)  # fmt: skip
            assert done.ok, f"{command} pod {pod} net {net}: {done.error}"
            return done.ip

        first = call("ADD", 0, 1)
        node = agent.agents["node-0"]
        assert agent.served()["ADD"] == 1
        assert node.unwritten() == 1  # answered inside its window: the agent holds net 1's node lock
        node.signal(signal.SIGSTOP)

        same = call("ADD", 1, 1)  # the pool whose lock the stopped agent holds
        other = call("ADD", 2, 2)  # another pool
        assert same != first
        call("DEL", 1, 1)
        call("DEL", 2, 2)
        call("DEL", 3, 1)  # a DEL of an attachment never added, on the held pool
        assert agent.served() == {"ADD": 1}  # every call after the stop ran in-process
        assert other not in [ip for _, ip, _ in held(tenant)]
        locks = tmp_path / "state" / "pool-locks"  # beside local_db
        assert sorted(p.suffix for p in locks.iterdir()) == [".lock", ".lock"]  # the two pools', nothing else

        node.signal(signal.SIGCONT)
        assert node.proc is not None
        node.signal(signal.SIGTERM)  # ends the window: the agent writes what it answered
        assert node.proc.wait(60) == 0
    finally:
        if node is not None and node.proc is not None:
            node.signal(signal.SIGCONT)
        agent.close()
    assert [ip for _, ip, _ in held(tenant)] == [first]
    assert [r for r in tenant.reservations() if r.endswith(first)] != []
    assert len(tenant.reservations()) == 1
