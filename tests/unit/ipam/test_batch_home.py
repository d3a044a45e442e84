"""The agent's batch threads run in the agent's own network namespace and working directory (given at
start-up: ipam.batch.install `home`), not in those of the call thread that happened to start them (the
agent's call threads enter their caller's namespace and directory: cni.agent.server enter_caller)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam import batch, combiner
from ipam.config import from_dict
from ipam.model import Allocation
from ipam.operation import Op
from tests import nsutil
from tests.skips import ROOT
from tests.unit.helpers import written

pytestmark = pytest.mark.skipif(not nsutil.is_root(), reason=f"{ROOT}makes a network namespace")


def _netns() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """The agent's start-up: its namespace and directory opened once and handed to ipam.batch."""
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    net = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    cwd = os.open(agent_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    batch.install(home=(net, cwd))
    try:
        yield agent_dir
    finally:
        batch.uninstall()
        os.close(net)
        os.close(cwd)


def test_a_batch_started_from_a_call_in_another_namespace_runs_in_the_agents(
    home: Path, tmp_path: Path
) -> None:
    rng = from_dict({"datastore": "local", "range": "198.51.100.0/24"}).ranges[0]
    op = Op("add", rng, Allocation("c1", "ns/p1", "net1"), False)
    seen: dict[str, object] = {}
    caller_dir = tmp_path / "caller"
    caller_dir.mkdir()

    def execute(group: list[Op]) -> None:  # the combiner's batch thread ("pool-batch")
        seen["thread"] = threading.current_thread().name
        seen["netns"], seen["cwd"] = _netns(), os.getcwd()
        for o in group:
            written(o)

    def call() -> None:  # an agent call thread, in its caller's namespace and directory
        try:
            os.unshare(os.CLONE_FS)
            os.chdir(caller_dir)
            os.unshare(os.CLONE_NEWNET)  # a namespace of this thread alone, gone with it
            seen["caller"] = _netns()
            combiner.combiner(("store", "pool")).run([op], execute)
        except BaseException as e:  # reported to the test's thread
            seen["error"] = e

    agent_netns = _netns()
    t = threading.Thread(target=call)
    t.start()
    t.join(60)
    assert "error" not in seen, seen.get("error")
    assert op.done and seen["thread"] == "pool-batch"
    assert seen["caller"] != agent_netns  # the call thread was elsewhere ...
    assert seen["netns"] == agent_netns and seen["cwd"] == str(home)  # ... its batch ran at home
