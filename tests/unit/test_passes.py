"""tests/passes.py, make test's sessions side by side: together they are the three passes, and a failed
session's exit status is never lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import conftest, passes


def test_the_source_sessions_cover_tests_once_and_the_frozen_ones_both_modes() -> None:
    got = passes.sessions("/dist")
    source = [s for s in got if s.name.startswith("source")]
    rest = next(s for s in source if s.name == "source: the rest")
    ignored = {a.removeprefix("--ignore=") for a in rest.args if a.startswith("--ignore=")}
    apart = {a for s in source if s is not rest for a in s.args if a.startswith("tests/")}
    assert "tests" in rest.args and ignored == apart == set(passes.APART)
    assert all(Path(passes.REPO, d).is_dir() for d in apart)
    frozen = [dict(s.env) for s in got if not s.name.startswith("source")]
    assert frozen == [{"PYCNI_PLUGIN_DIR": "/dist", conftest.AGENT_PASS_FOLLOWS: "1"},
                      {"PYCNI_PLUGIN_DIR": "/dist", "PYCNI_TEST_AGENT": "1"}]


def collected(env: dict[str, str]) -> set[str]:
    """The test ids a frozen session with `env` runs (collected only)."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *passes.FROZEN], cwd=passes.REPO, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYCNI_PLUGIN_DIR": "/dist", **env}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {line for line in proc.stdout.splitlines() if "::" in line}


def test_the_frozen_session_leaves_to_the_agent_session_only_what_that_runs() -> None:
    """Both frozen sessions together run every test the frozen pass alone would run; both run only the
    frozen plugins' in-process path (FROZEN_IN_PROCESS), which only the session without an agent takes."""
    alone = collected({})
    frozen = collected({conftest.AGENT_PASS_FOLLOWS: "1"})
    agent = collected({"PYCNI_TEST_AGENT": "1"})
    assert frozen | agent == alone
    both = frozen & agent
    assert both and all(t.startswith(conftest.FROZEN_IN_PROCESS) for t in both), sorted(both)[:5]
    assert all(t.split("::")[0] in conftest.NO_SESSION_AGENT for t in frozen - agent)


def test_each_ended_session_is_collected_with_its_own_exit_status(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    waiting = passes.Running(passes.Session("waits", ()),
                             subprocess.Popen(["sh", "-c", f"read x < {gate}; exit 5"]), tmp_path, 0.0)
    failing = passes.Running(passes.Session("fails", ()),
                             subprocess.Popen(["sh", "-c", "exit 3"]), tmp_path, 0.0)
    running = [waiting, failing]
    first = passes.wait_one(running)
    assert first is failing and first.proc.returncode == 3
    running.remove(first)
    with gate.open("w") as w:  # only now can the other one end
        w.write("go\n")
    second = passes.wait_one(running)
    assert second is waiting and second.proc.returncode == 5
