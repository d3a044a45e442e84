"""The bundle build without PyInstaller: registry-driven entries and hidden imports, the collected-module
check, the manifest and build id, and the multicall dispatch (prefixed names, tools, VERSION)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bundler import build, freeze, manifest
from cni import jsonio
from cni.registry import IN_PROCESS_IPAM, LAZY_MODULES, PLUGINS, TOOLS, entries, resolve
from tests.bundle_layouts import fake_bundle
from tests.nsutil import REPO


def test_lazy_modules_cover_every_dispatched_module() -> None:
    for module in (*PLUGINS.values(), *IN_PROCESS_IPAM.values(), *TOOLS.values()):
        assert module in LAZY_MODULES
        importlib.import_module(module)
    assert set(entries()) == set(PLUGINS) | set(TOOLS)


def test_hidden_imports_are_the_registry_list_plus_every_first_party_module() -> None:
    hidden = freeze.hidden_imports(str(REPO / "bundler" / "entry.py"))
    assert hidden[: len(LAZY_MODULES)] == list(LAZY_MODULES)
    assert {"cni.skel", "cni.netlink.vfinfo", "bundler.install", "ipam.rbac"} <= set(hidden)
    assert freeze.hidden_imports(str(REPO / "bundler" / "empty_entry.py")) == []


def test_build_fails_when_a_declared_module_was_not_collected() -> None:
    datas = [("cni/skel.pyc", "", "DATA"), ("cni/__init__.pyc", "", "DATA")]
    freeze.check_collected([], datas, ["cni", "cni.skel"])
    with pytest.raises(SystemExit, match=r"cni\.plugins\.nope"):
        freeze.check_collected([("cni", "", "PYMODULE")], datas, ["cni", "cni.plugins.nope"])


@pytest.mark.parametrize(("name", "want"), [
    ("macvlan", "macvlan"), ("pycni-macvlan", "macvlan"), ("nv_macvlan", "macvlan"),
    ("pycni-install", "pycni-install"), ("macvlan2", None), ("vlan", None), ("", None),
])
def test_resolve_entry_names(name: str, want: str | None) -> None:
    assert resolve(name) == want


def test_layout_writes_entries_and_a_verifiable_manifest(tmp_path: Path) -> None:
    fake_bundle(tmp_path)
    m = build.layout(tmp_path, "9.9.9")
    for name in entries():
        assert os.readlink(tmp_path / name) == "pycni/pycni"
    doc = jsonio.loads((tmp_path / manifest.FILENAME).read_bytes())
    assert doc["version"] == "9.9.9" and doc["build"] == m.build and doc["build"].startswith("9.9.9-")
    assert set(doc["entries"]) == set(entries())
    assert (tmp_path / "pycni" / "_internal" / build.BUILD_ID_FILE).read_text().strip() == m.build
    assert manifest.problems(tmp_path, manifest.load(tmp_path / manifest.FILENAME)) == []
    (tmp_path / "pycni" / "_internal" / "a.pyc").write_bytes(b"b")
    assert manifest.problems(tmp_path, m) == ["pycni/_internal/a.pyc: sha256 differs"]


def test_build_id_follows_content_not_the_id_file(tmp_path: Path) -> None:
    fake_bundle(tmp_path)
    first = build.layout(tmp_path, "1.0.0").build
    assert build.layout(tmp_path, "1.0.0").build == first, "re-layout is stable"
    (tmp_path / "pycni" / "_internal" / "a.pyc").write_bytes(b"changed")
    assert build.layout(tmp_path, "1.0.0").build != first


def run_cni(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    full = {"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"], **(env or {})}
    return subprocess.run([sys.executable, "-m", "cni", *args], env=full, capture_output=True, check=False)


def test_dispatch_prefixed_plugin_and_tools() -> None:
    v = run_cni("pycni-macvlan", env={"CNI_COMMAND": "VERSION"})
    assert v.returncode == 0 and "supportedVersions" in jsonio.loads(v.stdout)
    tool = run_cni("pycni-install", env={"CNI_COMMAND": "VERSION"})
    assert tool.returncode == 0 and "supportedVersions" in jsonio.loads(tool.stdout)
    helped = run_cni("pycni-install", "--help")
    assert helped.returncode == 0 and b"--cni-bin-dir" in helped.stdout
    about = run_cni("macvlan")
    assert about.returncode == 0 and b"pycni macvlan source" in about.stderr
    unknown = run_cni("nope")
    assert unknown.returncode == 2 and b"one of:" in unknown.stderr and b"macvlan" in unknown.stderr


def test_runtime_hooks_are_dropped_or_reviewed() -> None:
    """Every runtime hook runs at every start of every entry: the measured ones are dropped (setuptools'
    the costliest) and an unreviewed one stops the build instead of slowing every CNI call."""
    scripts = [("pyiboot01_bootstrap", "x", "PYSOURCE"), ("pyi_rth_setuptools", "x", "PYSOURCE"),
               ("pyi_rth_inspect", "x", "PYSOURCE"), ("entry", "x", "PYSOURCE")]
    kept = freeze.drop_runtime_hooks(scripts)
    assert [s[0] for s in kept] == ["pyiboot01_bootstrap", "entry"]
    with pytest.raises(SystemExit, match="pyi_rth_newdep"):
        freeze.drop_runtime_hooks([*scripts, ("pyi_rth_newdep", "x", "PYSOURCE")])
