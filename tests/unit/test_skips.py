"""A session fails on a skip tests/skips.py does not allow (issue 45: a prerequisite missing in CI is a
red CI, not a pass): pytest sessions of their own with tests/skips.py as their plugin, skipping for
reasons allowed and not, and ../shared absent allowed only when it really is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import kubeup, skips
from tests.nsutil import REPO

SKIPPING = '''
import pytest
from tests import kubeup, skips

def test_optional():
    pytest.skip(skips.NO_EXCLUSIVE)

def test_shared():
    pytest.skip(kubeup.ABSENT_REASON)

def test_root():
    pytest.skip(skips.ROOT + "creates network namespaces and links")

@pytest.mark.skipif(True, reason="etcd-server is not installed")
def test_package():
    pass

def test_runs():
    pass
'''


def session(tmp_path: Path, *tests: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of `tests` of SKIPPING, with tests/skips.py as its plugin."""
    module = tmp_path / "test_skipping.py"
    module.write_text(SKIPPING)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.skips", "-q", "-rs", "-p", "no:cacheprovider",
           "--rootdir", str(tmp_path), "-c", os.devnull, *(f"{module}::test_{t}" for t in tests)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})


def test_an_allowed_skip_passes_and_is_counted(tmp_path: Path) -> None:
    run = session(tmp_path, "optional", "runs")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"skips allowed (tests/skips.py): 1\n  1 x {skips.NO_EXCLUSIVE}" in run.stdout


def test_a_skip_for_a_missing_prerequisite_fails_the_session(tmp_path: Path) -> None:
    run = session(tmp_path, "package", "runs", "optional")
    assert run.returncode == 1, run.stdout + run.stderr
    assert ("SKIP NOT ALLOWED (tests/skips.py; the session fails): etcd-server is not installed: 1 x, "
            "e.g. test_skipping.py::test_package") in run.stdout
    assert "1 passed, 2 skipped" in run.stdout


def test_shared_absent_is_allowed_only_when_it_is(tmp_path: Path) -> None:
    nowhere = tmp_path / "no-shared"
    run = session(tmp_path, "shared", PYCNI_SHARED=str(nowhere))
    assert run.returncode == 0 and f"{nowhere}/upstream is absent" in run.stdout, run.stdout + run.stderr
    assert kubeup.UPSTREAM.exists(), "../shared is beside the clone in CI"
    run = session(tmp_path, "shared", PYCNI_SHARED=str(kubeup.SHARED))
    assert run.returncode == 1 and "SKIP NOT ALLOWED" in run.stdout, run.stdout + run.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason=f"{skips.ROOT}what a root session refuses")
def test_a_root_skip_fails_a_root_session(tmp_path: Path) -> None:
    run = session(tmp_path, "root")
    assert run.returncode == 1 and "SKIP NOT ALLOWED" in run.stdout, run.stdout + run.stderr


def test_every_allowed_reason_says_why() -> None:
    assert all(a.reason and len(a.why) > 20 for a in skips.ALLOWED)
    assert len({a.reason for a in skips.ALLOWED}) == len(skips.ALLOWED)
