"""Every macvlan integration test runs once per supported cniVersion (the `version` fixture), in its
own host and pod namespaces, and ends with no foreign link left in its host namespace."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.macvlan.harness import VERSIONS, Env
from tests.nsutil import Topology


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def env(topo: Topology, version: str, tmp_path: Path) -> Iterator[Env]:
    e = Env(topo, version, tmp_path / "ipam")
    yield e
    assert e.foreign_host_links() == [], "links left behind in the host namespace"
