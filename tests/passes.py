"""`make test`'s pytest runs, side by side (`python -m tests.passes`).

The suite is the same as three passes one after the other (everything from source; the integration and
e2e suites against the frozen entries; the same through the frozen node-local agent), split into nine
pytest sessions run at most JOBS at a time, longest first. Most of a session waits on processes, the
kernel and API servers, not on the two cores: one after the other the machine sat half idle.

The source pass is cut where nothing crosses the cut: the cluster suite (one real node per session), the
Kubernetes and contract suites (tests/kubeapi/test_rbac.py checks the requests the contract suite's
Kubernetes variant and tests/kubeapi sent in its session), the concurrency suite, the unit and hardening
suites, the macvlan matrix (tests/integration/macvlan: every scenario at every cniVersion) and tests/e2e,
all three cut off the rest, which was the long pole, and the rest (`tests` without those, so a new
directory lands there). Sessions are safe side by side as two CI runs on one machine are: per-process
name prefixes (tests/nsutil.py), their own temp dirs and ports, host-wide locks where the host has one
resource (kube-proxy, the netns mount).

The frozen session leaves to the agent session, which always follows it here, the tests that one runs
(PYCNI_TEST_AGENT_PASS_FOLLOWS: tests/conftest.py frozen_selection).

Each session's output is printed whole when it ends, then a line per session with its wall time and its
CPU time (its own and its reaped children's: not the servers it starts detached) and how busy the whole
machine was; the exit status is non-zero if any session failed.
JOBS: `PYCNI_TEST_JOBS` (default 3; 1 runs them one after the other)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PYTEST = [sys.executable, "-m", "pytest", "-q"]
APART = ("tests/cluster", "tests/kubeapi", "tests/contract", "tests/concurrency", "tests/unit",
         "tests/hardening", "tests/integration/macvlan", "tests/e2e")
FROZEN = ("tests/integration", "tests/e2e")


@dataclass(frozen=True)
class Session:
    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def sessions(plugin_dir: str) -> list[Session]:
    """Longest first, by their durations in make test (docs/testing.md, which also has the run that
    started the concurrency suite first: slower)."""
    frozen = (("PYCNI_PLUGIN_DIR", plugin_dir),)
    return [
        Session("source: tests/cluster", ("--durations=10", "tests/cluster")),
        Session("source: tests/unit tests/hardening", ("--durations=10", "tests/unit", "tests/hardening")),
        Session("source: tests/kubeapi tests/contract",
                ("--durations=10", "tests/kubeapi", "tests/contract")),
        Session("source: tests/integration/macvlan", ("--durations=10", "tests/integration/macvlan")),
        Session("source: tests/e2e", ("--durations=10", "tests/e2e")),
        Session("source: tests/concurrency", ("--durations=5", "tests/concurrency")),
        Session("frozen", ("--durations=10", *FROZEN), (*frozen, ("PYCNI_TEST_AGENT_PASS_FOLLOWS", "1"))),
        Session("source: the rest", ("--durations=10", "tests", *(f"--ignore={d}" for d in APART))),
        Session("frozen + agent", ("--durations=10", *FROZEN), (*frozen, ("PYCNI_TEST_AGENT", "1"))),
    ]


@dataclass
class Running:
    session: Session
    proc: subprocess.Popen[bytes]
    log: Path
    started: float
    cpu: float = 0.0  # user + system seconds of the session and the descendants it reaped


def cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def machine_busy() -> tuple[float, float]:
    """(busy, all) CPU seconds of the whole machine since boot, every CPU (/proc/stat)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / hz, sum(ticks) / hz


def start(session: Session, logs: Path) -> Running:
    log = logs / (session.name.replace(" ", "_").replace("/", "-").replace(":", "") + ".log")
    with log.open("wb") as out:
        proc = subprocess.Popen([*PYTEST, *session.args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={**os.environ, **dict(session.env)})
    command = " ".join(session.args)
    print(f"== {time.strftime('%H:%M:%S')} started: {session.name}: pytest {command}", flush=True)
    return Running(session, proc, log, time.monotonic())


def main(argv: list[str]) -> int:
    plugin_dir = argv[0] if argv else str(REPO / "dist" / "cni-bin")
    jobs = max(1, int(os.environ.get("PYCNI_TEST_JOBS", "3")))
    todo = sessions(plugin_dir)
    results: list[tuple[str, int, float, float]] = []
    busy0, all0 = machine_busy()
    with tempfile.TemporaryDirectory(prefix="pycni-passes-") as tmp:
        running: list[Running] = []
        while todo or running:
            while todo and len(running) < jobs:
                running.append(start(todo.pop(0), Path(tmp)))
            done = wait_one(running)
            running.remove(done)
            took = time.monotonic() - done.started
            rc = done.proc.returncode
            results.append((done.session.name, rc, took, done.cpu))
            print(f"== {time.strftime('%H:%M:%S')} finished: {done.session.name}: exit {rc} in {took:.0f} s "
                  f"({done.cpu:.0f} CPU s)", flush=True)
            sys.stdout.buffer.write(done.log.read_bytes())
            sys.stdout.flush()
    busy1, all1 = machine_busy()
    print("\n== sessions (wall; CPU: the session's and what it reaped of its children)")
    for name, rc, took, cpu in results:
        print(f"{'ok    ' if rc == 0 else 'FAILED'} {took:6.0f} s {cpu:6.0f} CPU s  {name}")
    busy, total = busy1 - busy0, all1 - all0
    print(f"the machine: {busy:.0f} of {total:.0f} CPU s busy ({busy / total:.0%}), whatever ran on it")
    return 0 if all(rc == 0 for _, rc, _, _ in results) else 1


def wait_one(running: list[Running]) -> Running:
    """The first of `running` to end: waitid with WNOWAIT sleeps until a child exits without reaping it,
    so that Popen.poll still collects its exit status."""
    while True:
        for r in running:
            before = cpu_children()
            if r.proc.poll() is not None:
                r.cpu = cpu_children() - before
                return r
        ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        if ended is not None and ended.si_pid not in {r.proc.pid for r in running}:
            time.sleep(0.5)  # a child not ours (none in make test) stays a zombie: do not spin on it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
