"""The harness itself: libcni finds our `macvlan` before Debian's, PYCNI_PLUGIN_DIR is honoured, and the
driver says plainly that libcni 1.1.2 has no GC/STATUS."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e import libcni
from tests.e2e.harness import E2E


def test_libcni_finds_our_macvlan_first(e2e: E2E) -> None:
    ours = e2e.driver.version("macvlan", e2e.pycni)
    ref = e2e.driver.version("macvlan", e2e.reference)
    assert ours.ok and ref.ok, (ours, ref)
    assert ref.out["supportedVersions"] == list(libcni.VERSIONS)  # Debian's plugins 1.1.1
    assert "1.1.0" in ours.out["supportedVersions"]  # only pycni's macvlan knows spec 1.1.0
    assert e2e.pycni.cni_path.endswith(":" + libcni.REFERENCE_DIR)


@pytest.mark.parametrize("verb", ["gc", "status"])
def test_driver_explains_missing_gc_and_status(driver_binary: Path, verb: str) -> None:
    proc = subprocess.run([str(driver_binary), verb], capture_output=True, text=True, check=False)
    assert proc.returncode == 3
    assert "libcni 1.1.2" in proc.stderr and "v1.2.0" in proc.stderr


def test_plugin_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PYCNI_PLUGIN_DIR", str(empty))
    with pytest.raises(RuntimeError, match="no executable macvlan"):
        libcni.pycni_plugin_dir(tmp_path / "unused")
    ready = libcni.source_plugin_dir(tmp_path / "ready")
    monkeypatch.setenv("PYCNI_PLUGIN_DIR", str(ready))
    assert libcni.pycni_plugin_dir(tmp_path / "unused") == ready.resolve()
    assert not (tmp_path / "unused").exists()
    monkeypatch.delenv("PYCNI_PLUGIN_DIR")
    built = libcni.pycni_plugin_dir(tmp_path / "built")
    assert built == tmp_path / "built" and (built / "macvlan").read_text().startswith("#!")
