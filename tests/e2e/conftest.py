"""e2e fixtures: the libcni driver (built on demand), the pycni CNI_PATH directory (PYCNI_PLUGIN_DIR or
from source), and a per-test harness in its own host namespace. Root gating is in tests/conftest.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e import libcni
from tests.e2e.harness import E2E
from tests.nsutil import Topology, is_root
from tests.skips import ROOT


@pytest.fixture(scope="session")
def driver_binary() -> Path:
    if not is_root():
        pytest.skip(f"{ROOT}creates network namespaces and links")
    return libcni.ensure_driver()


@pytest.fixture(scope="session")
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return libcni.pycni_plugin_dir(tmp_path_factory.mktemp("cni-bin"))


@pytest.fixture
def e2e(topo: Topology, driver_binary: Path, plugin_dir: Path, tmp_path: Path) -> Iterator[E2E]:
    cache = tmp_path / "cache"
    driver = libcni.Driver(driver_binary, topo.host, cache)
    yield E2E(topo, driver, libcni.reference_side(), libcni.pycni_side(plugin_dir), tmp_path)
