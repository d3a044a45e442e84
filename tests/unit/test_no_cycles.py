"""No import cycle among the IPAM's modules (issue 37): the executors and the attempt reach the engine
through protocols (ipam.attempt.Access), the pod sources do not import the CLI's choice of them. Every
import counts, also one made for annotations only. grimp is import-linter's own graph (make lint)."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]


def cycles(package: str) -> list[tuple[str, str]]:
    """Pairs of modules of `package` that import each other, directly or through others."""
    graph = grimp.build_graph(package, include_external_packages=False)
    found = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith(package) and graph.chain_exists(imported, module):
                found.add(tuple(sorted((module, imported))))
    return sorted(found)  # type: ignore[arg-type]


def test_the_ipam_has_no_import_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))
    assert cycles("ipam") == []


def test_a_cycle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: two modules of a package that import each other (one for annotations only)."""
    pkg = tmp_path / "cyclic_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyclic_probe import b\n")
    (pkg / "b.py").write_text("TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from cyclic_probe import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cycles("cyclic_probe") == [("cyclic_probe.a", "cyclic_probe.b")]
