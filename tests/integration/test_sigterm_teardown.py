"""A test run stopped with SIGTERM (a CI job's timeout, `kill`, `timeout`) tears down what its fixtures set
up, as Ctrl-C does (tests/conftest.py turns SIGTERM into an interrupt): a child pytest run holds a
Topology (a host namespace with a veth pair, a pod namespace) when it gets SIGTERM, and nothing of it
is left. Python's default SIGTERM ends the process without running a single finalizer: the namespaces
stayed (they were found after a killed run)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.nsutil import REPO, delete_netns, sh

CHILD = """
import os, time
from pathlib import Path

def test_holds_a_topology(topo):
    topo.pod()
    Path(os.environ["PYCNI_TEST_MARK"]).write_text(" ".join(topo.namespaces))
    time.sleep(600)
"""


def _namespaces(prefix: str) -> list[str]:
    listed = sh("ip", "netns", "list").stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith(prefix)]


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    prefix = "ps" + secrets.token_hex(2)  # the child's own run prefix (tests/nsutil.py RUN)
    mark = tmp_path / "holding"
    (tmp_path / "test_child.py").write_text(CHILD)
    env = {**os.environ, "PYCNI_TEST_RUN": prefix, "PYCNI_TEST_MARK": str(mark)}
    child = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "--rootdir", str(tmp_path), str(tmp_path / "test_child.py")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():  # the child says when it holds the topology
            assert child.poll() is None, child.communicate()[0].decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the child never set its topology up"
            time.sleep(0.05)
        held = mark.read_text().split()
        assert sorted(held) == sorted(_namespaces(prefix)) and len(held) == 2
        child.send_signal(signal.SIGTERM)
        out = child.communicate(timeout=120)[0].decode(errors="replace")
        assert child.returncode != 0, out  # interrupted, not passed
        assert _namespaces(prefix) == [], out
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for name in _namespaces(prefix):  # exactly the child's, whatever happened
            delete_netns(name)


def test_a_topology_that_fails_half_way_removes_what_it_made() -> None:
    """Its uplink's name too long for a link (15 bytes): the host namespace, made first, goes again."""
    import pytest

    from tests.nsutil import RUN, Topology

    tag = f"{RUN}long{secrets.token_hex(4)}"
    try:
        with pytest.raises(subprocess.CalledProcessError):
            Topology(tag=tag)
        assert _namespaces(tag) == []
    finally:
        for name in _namespaces(tag):
            delete_netns(name)
