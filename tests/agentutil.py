"""The node-local agent (cni.agent) as a test process: started from source, or from the frozen bundle's
`pycni-agent` entry when PYCNI_PLUGIN_DIR is set; its log tells which requests it served.

`make test`'s third pass sets PYCNI_TEST_AGENT=1: tests/conftest.py then runs one supervised agent for
the session (restarted when a test kills it) and every plugin call of the integration and e2e suites
goes through it; without it, the session points the shims at a FIFO that does not exist, so every
call takes the in-process path after the shim's failed open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cni.agent import proto
from tests.logtee import PYTHONPATH

START_TIMEOUT = 60.0  # importing the plugins and the IPAM on a loaded 2-core machine
RUNNING: set[Agent] = set()  # agents this process started and has not stopped


def command() -> list[str]:
    bindir = os.environ.get("PYCNI_PLUGIN_DIR")
    if bindir:
        return [os.path.join(bindir, "pycni-agent")]
    return [sys.executable, "-m", "cni", "pycni-agent"]


def connectable(path: Path) -> bool:
    """Whether an agent reads the FIFO at `path` (opening it for writing without waiting succeeds)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


class Agent:
    """One agent process on `fifo`, logging to `log` (appended across restarts). Its metrics endpoint is
    on a free port of 127.0.0.1 (never the node default, which another agent may hold): `metrics_url`."""

    def __init__(self, fifo: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.fifo, self.log, self.env = fifo, log, env or {}
        has_metrics = any(a == "--metrics" or a.startswith("--metrics=") for a in args)
        self.args = args if has_metrics else ("--metrics=127.0.0.1:0", *args)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Agent:
        env = {**os.environ, "PYTHONPATH": PYTHONPATH, **self.env}
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([*command(), "--fifo", str(self.fifo), *self.args],
                                         stdout=fh, stderr=fh, env=env, cwd="/")
        deadline = time.monotonic() + START_TIMEOUT
        while not connectable(self.fifo):
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited with {self.proc.returncode}: {self.log.read_text()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"agent not serving {self.fifo} after {START_TIMEOUT} s")
            time.sleep(0.05)
        RUNNING.add(self)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> int:
        RUNNING.discard(self)
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.proc = None
        return rc

    def metrics_url(self) -> str:
        """The endpoint of the running agent (the last 'metrics on URL' line of its log)."""
        lines = [x for x in self.log.read_text(errors="replace").splitlines() if ": metrics on http" in x]
        assert lines, f"no metrics endpoint in the agent's log: {self.log.read_text(errors='replace')}"
        return lines[-1].rsplit(" ", 1)[1]

    def served(self, what: str = "") -> list[str]:
        """Log lines of served requests ('served <plugin> <COMMAND> rc=N ...'), optionally filtered."""
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return [x for x in lines if ": served " in x and what in x]


class Supervised(Agent):
    """An agent that is started again whenever it dies while the session still wants it."""

    def __init__(self, fifo: Path, log: Path, *args: str) -> None:
        super().__init__(fifo, log, *args)
        self.wanted = True
        self.restarts = 0
        self.watcher = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> Supervised:
        super().start()
        self.watcher.start()
        return self

    def _watch(self) -> None:
        while self.wanted:
            proc = self.proc
            if proc is not None and proc.poll() is not None and self.wanted:
                self.restarts += 1
                super().start()
            time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> int:
        self.wanted = False
        self.watcher.join()
        return super().stop(timeout)


def agent_up() -> bool:
    return os.environ.get("PYCNI_TEST_AGENT") == "1"


class Claimed:
    """One request taken from a scripted agent's FIFO, claimed as the agent claims it
    (cni.agent.server.claim_request), with its three frames read from the caller's memfd."""

    def __init__(self, line: bytes) -> None:
        from cni.agent.server import claim_request

        claim = claim_request(line)
        assert claim is not None, "the shim withdrew its request before the scripted agent took it"
        self.pipe, self.pid, self.w, self.inode, self.podns = (claim.pipe, claim.pid, claim.w, claim.inode,
                                                               claim.podns)
        fd = os.open(f"/proc/{self.pid}/fd/{claim.memfd}", os.O_RDONLY)
        try:
            r = proto.Reader(fd)
            self.frames = [r.read() for _ in range(3)]
        finally:
            os.close(fd)

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        proto.send(self.pipe, kind, payload)

    def close(self) -> None:
        """Close the answer pipe (once: a script may close it before fake_agent does)."""
        if self.pipe >= 0:
            os.close(self.pipe)
            self.pipe = -1


def make_fifo(path: Path) -> int:
    """A FIFO at `path`, opened for reading and writing (as the agent opens its own)."""
    os.mkfifo(path, 0o600)
    return os.open(path, os.O_RDWR)


def read_line(fd: int) -> bytes:
    """One request line from a FIFO (read a byte at a time: nothing after it is taken)."""
    line = b""
    while not line.endswith(b"\n"):
        line += os.read(fd, 1)
    return line[:-1]


def fake_agent(path: Path, script: Callable[[Claimed], None]) -> threading.Thread:
    """Take one request from a FIFO at `path` and run `script` on it (after claiming it and reading its
    three frames); then close the answer pipe and the FIFO."""
    fifo = make_fifo(path)

    def serve() -> None:
        try:
            claimed = Claimed(read_line(fifo))
            try:
                assert [kind for kind, _ in claimed.frames] == [proto.REQUEST, proto.ENV, proto.STDIN]
                script(claimed)
            finally:
                claimed.close()
        finally:
            os.close(fifo)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def listener(fifo: Path) -> subprocess.Popen[bytes]:
    """A process that holds the FIFO `fifo` open for reading and never reads it (an agent hung before it
    takes a request), until killed; its pid is in the FIFO's lock file, as an agent's is."""
    code = ("import os, sys; os.mkfifo(sys.argv[1], 0o600); fd = os.open(sys.argv[1], os.O_RDWR); "
            "open(sys.argv[1] + '.lock', 'w').write(str(os.getpid())); "
            "print('ready', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(fifo)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    return p
