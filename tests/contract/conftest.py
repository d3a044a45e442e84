"""The contract suite runs every test once per store factory (tests/contract/factories.py); the
"kubernetes" one on the session's real kube-apiserver, in the test's own namespace (`tenant`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam.store.base import Store
from tests.contract.factories import FACTORIES, TENANT_FACTORIES, Factory


@pytest.fixture(params=sorted([*FACTORIES, *TENANT_FACTORIES]))
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    name = request.param
    if name in TENANT_FACTORIES:
        with TENANT_FACTORIES[name](request.getfixturevalue("tenant"), tmp_path) as f:
            yield f
        return
    with FACTORIES[name](tmp_path) as f:
        yield f


@pytest.fixture
def store(factory: Factory) -> Iterator[Store]:
    s = factory.open()
    try:
        yield s
    finally:
        s.close()
