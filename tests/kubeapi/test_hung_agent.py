"""A node-local agent frozen (SIGSTOP), and a pool's node lock (ipam.nodelock) held by a frozen process,
on the real kube-apiserver: the shims' calls of that node must still complete in-process, on that pool
and on another one (issue 28: on the real node, a pod never became Ready with the agent stopped).

The agent answers a call only after its pool write and holds a pool's lock only during one attempt, so
a frozen agent holds a lock only if it froze inside an attempt; that holder is here a process of the
test holding the lock file and frozen (deterministic, where freezing the agent inside its write would
be a race). Before the fix the in-process calls waited PATIENCE (60 s) for a holder that never moves
and ended with code 11; the kubelet's retries met the same lock."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import kubeup
from tests.bench.ipam_scale import Pod, Pycni, Workload, held, network_config, one_call
from tests.nsutil import is_root
from tests.skips import ROOT

pytestmark = pytest.mark.skipif(not is_root(), reason=f"{ROOT}the agent serves root only")
# per-network: net 1 and net 2 are two pools (198.19.1.0/24, 198.19.2.0/24)
WL = Workload(pods=4, networks=2, nodes=1, concurrency=1, mode="per-network", budget=120.0,
              call_timeout=120.0)  # fmt: skip


def _frozen_holder(path: Path) -> subprocess.Popen[bytes]:
    """Another process holding the lock at `path`, then stopped (SIGSTOP)."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_EX); "
            "print('held', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == b"held\n"
    p.send_signal(signal.SIGSTOP)
    return p


def test_a_stopped_agent_and_a_stopped_lock_holder_do_not_block_in_process_calls(
    tenant: kubeup.Tenant, tmp_path: Path
) -> None:
    agent = Pycni(None, agents=1, scratch=tmp_path)  # the shims' default READY timeout
    holder = None
    try:
        agent.setup(tenant, tmp_path)
        confs = {net: network_config(agent, WL, net) for net in (1, 2)}

        def call(command: str, pod: int, net: int) -> str:
            done = one_call(agent, WL, command, Pod(pod, tenant.namespace, "h"), net, confs,
                            time.monotonic() + 120)  # fmt: skip
            assert done.ok, f"{command} pod {pod} net {net}: {done.error}"
            return done.ip

        first = call("ADD", 0, 1)
        assert agent.served()["ADD"] == 1
        [lock] = (tmp_path / "state" / "pool-locks").glob("*.lock")  # net 1's, beside local_db
        node = agent.agents["node-0"]
        node.signal(signal.SIGSTOP)
        holder = _frozen_holder(lock)

        same = call("ADD", 1, 1)  # the pool whose lock the stopped process holds
        other = call("ADD", 2, 2)  # another pool
        assert same != first and other
        call("DEL", 1, 1)
        call("DEL", 2, 2)
        call("DEL", 3, 1)  # a DEL of an attachment never added, on the held pool
        assert agent.served() == {"ADD": 1}  # every call after the stop ran in-process
        assert [ip for _, ip, _ in held(tenant)] == [first]
        locks = tmp_path / "state" / "pool-locks"
        assert sorted(p.suffix for p in locks.iterdir()) == [".lock", ".lock"]  # the two pools', nothing else
        node.signal(signal.SIGCONT)
        assert node.proc is not None
        node.signal(signal.SIGTERM)
        assert node.proc.wait(60) == 0
    finally:
        if holder is not None:
            holder.send_signal(signal.SIGCONT)
            holder.kill()
            holder.wait()
        node_agent = agent.agents.get("node-0")
        if node_agent is not None and node_agent.proc is not None:
            node_agent.signal(signal.SIGCONT)
        agent.close()
    assert [ip for _, ip, _ in held(tenant)] == [first]
    assert len(tenant.reservations()) == 1
