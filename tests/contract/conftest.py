"""The contract suite runs every test once per store factory (tests/contract/factories.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam.store.base import Store
from tests.contract.factories import FACTORIES, Factory


@pytest.fixture(params=sorted(FACTORIES))
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Factory]:
    with FACTORIES[request.param](tmp_path) as f:
        yield f


@pytest.fixture
def store(factory: Factory) -> Iterator[Store]:
    s = factory.open()
    try:
        yield s
    finally:
        s.close()
