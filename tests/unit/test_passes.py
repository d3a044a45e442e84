"""tests/passes.py, make test's sessions side by side: together they are the three passes, and a failed
session's exit status is never lost."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests import passes


def test_the_source_sessions_cover_tests_once_and_the_frozen_ones_both_modes() -> None:
    got = passes.sessions("/dist")
    source = [s for s in got if s.name.startswith("source")]
    rest = next(s for s in source if s.name == "source: the rest")
    ignored = {a.removeprefix("--ignore=") for a in rest.args if a.startswith("--ignore=")}
    apart = {a for s in source if s is not rest for a in s.args if a.startswith("tests/")}
    assert "tests" in rest.args and ignored == apart == set(passes.APART)
    assert all(Path(passes.REPO, d).is_dir() for d in apart)
    frozen = [dict(s.env) for s in got if not s.name.startswith("source")]
    assert frozen == [{"PYCNI_PLUGIN_DIR": "/dist"}, {"PYCNI_PLUGIN_DIR": "/dist", "PYCNI_TEST_AGENT": "1"}]


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
