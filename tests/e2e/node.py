"""A node's /var/lib for one test: upstream programs with fixed paths (libcni's cache in /var/lib/cni,
Multus' kubelet device-plugin checkpoint in /var/lib/kubelet/device-plugins, pycni's default device state
dir /var/lib/cni/pycni/devices) run in a private mount namespace per command (`unshare --mount`) where
/var/lib is a directory under the test's tmp_path. Propagation is slave: pod namespaces made on the host
after a command started still show in /run/netns, and nothing mounted here reaches the host.

With `cni_conf_dir`, the node's /etc/cni/net.d is that directory too (the IPAM's default flat file
/etc/cni/net.d/whereabouts.d/whereabouts.conf is then the test's own): it must exist on the machine, as
a mount point (`CNI_CONF_ABSENT` says why a test skips).

With PYCNI_TEST_AGENT=1 the plugins are served by an agent, which resolves paths in its own mount
namespace: `agent()` starts one for this node (inside the same view), and `env()` points the shims at it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from cni.agent.client import FIFO_ENV
from ipam.config import FLAT_FILES
from tests import agentutil
from tests.logtee import PYTHONPATH
from tests.skips import OWN_FLAT_FILE

ENTER = 'mount --bind "$1" /var/lib && shift && exec "$@"'
ENTER_CONF = 'mount --bind "$1" /var/lib && mount --bind "$2" /etc/cni/net.d && shift 2 && exec "$@"'
CNI_CONF = "/etc/cni/net.d"


def cni_conf_absent() -> str:
    """Why a node cannot have its own /etc/cni/net.d here ("" when it can)."""
    return "" if os.path.isdir(CNI_CONF) else f"{CNI_CONF} does not exist on this machine (a mount point)"


def own_flat_file_impossible() -> str:
    """Why a node cannot have its own IPAM flat file here ("" when it can): the IPAM looks at every
    default location, and only /etc/cni/net.d is replaced by the node's own directory."""
    reason = cni_conf_absent()
    foreign = [p for p in FLAT_FILES if not p.startswith(f"{CNI_CONF}/") and os.path.lexists(p)]
    if not reason and foreign:
        reason = f"{OWN_FLAT_FILE} the test cannot hide: {foreign}"
    return reason


class Node:
    def __init__(self, root: Path, cni_conf_dir: Path | None = None) -> None:
        self.root = root
        self.var_lib = root / "var-lib"
        self.var_lib.mkdir(parents=True, exist_ok=True)
        self.cni_conf_dir = cni_conf_dir
        if cni_conf_dir is not None:
            assert not cni_conf_absent(), cni_conf_absent()
            cni_conf_dir.mkdir(parents=True, exist_ok=True)
        self.agent_fifo: Path | None = None

    def path(self, host_path: str) -> Path:
        """Where a /var/lib/... path of the node really is."""
        rel = Path(host_path).relative_to("/var/lib")
        return self.var_lib / rel

    def command(self, *cmd: str) -> list[str]:
        if self.cni_conf_dir is not None:
            return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", ENTER_CONF, "node",
                    str(self.var_lib), str(self.cni_conf_dir), *cmd]
        return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", ENTER, "node",
                str(self.var_lib), *cmd]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        if self.agent_fifo is not None:
            env[FIFO_ENV] = str(self.agent_fifo)
        return env

    def files(self, host_dir: str) -> list[str]:
        """Files under a /var/lib/... directory of the node (relative names, sorted)."""
        d = self.path(host_dir)
        return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()) if d.is_dir() else []

    @contextmanager
    def agent(self, env: Mapping[str, str] | None = None) -> Iterator[agentutil.Agent | None]:
        """With PYCNI_TEST_AGENT=1: this node's own agent for the block (its log tells what it served);
        otherwise nothing (the shims run in-process). `env`: more of the agent's process environment
        (PYCNI_SYSFS_ROOT: the agent's own, never a request's)."""
        if not agentutil.agent_up():
            yield None
            return
        sock, log = self.root / "agent.fifo", self.root / "agent.log"
        agent = agentutil.Agent(sock, log)
        with open(log, "ab") as fh:
            agent.proc = subprocess.Popen(
                self.command(*agentutil.command(), "--fifo", str(sock), *agent.args), stdout=fh, stderr=fh,
                env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}, cwd="/")
        deadline = time.monotonic() + agentutil.START_TIMEOUT
        while not agentutil.connectable(sock):
            if agent.proc.poll() is not None:
                raise RuntimeError(f"node agent exited with {agent.proc.returncode}: {log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node agent not serving {sock} after {agentutil.START_TIMEOUT} s")
            time.sleep(0.05)
        self.agent_fifo = sock
        agentutil.RUNNING.add(agent)
        try:
            yield agent
        finally:
            self.agent_fifo = None
            agent.stop()
            # the session's "the agent served requests" check (tests/conftest.py) counts these too
            session = sys.modules.get("tests.conftest")
            if session is not None:
                session._SERVED.extend(agent.served())
