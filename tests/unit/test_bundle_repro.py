"""Two real builds from the same lock give the same bundle, byte for byte (bundler/repro.py, also
`make check-repro`): the second from a copy of the sources at another path, each with its own work
directory and a PyInstaller cache of its own inside the test's temp dir. Slow for a unit test (two full
PyInstaller runs: ~15 s of CPU with a warm machine, up to a minute or two on a fresh one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bundler import repro


@pytest.mark.skipif(shutil.which("strip") is None or shutil.which("objdump") is None,
                    reason="PyInstaller needs binutils (strip, objdump) to build: `make deps` installs it")
def test_two_builds_from_the_same_lock_are_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYINSTALLER_CONFIG_DIR", str(tmp_path / "pyinstaller-cache"))
    rc = repro.main(["--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "reproducible: two builds" in out and "identical" in out
