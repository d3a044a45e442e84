"""Fixtures of the IPAM unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ipam import batch


@pytest.fixture
def agent() -> Iterator[None]:
    batch.share(True)
    yield
    assert batch.settle_all(30)
    batch.share(False)
