"""Fixtures of the IPAM unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cni import faults
from ipam import batch, combiner
from tests.unit.helpers import Counted


@pytest.fixture
def agent() -> Iterator[None]:
    """The agent's execution mode (ipam.batch.install): engines built with ipam.plugin.EXECUTE, as the
    plugin builds them, run their ops through the pools' combiners; afterwards every batch is awaited and
    the combiners dropped."""
    batch.install()
    yield
    assert combiner.settle_all(30)
    batch.uninstall()


@pytest.fixture(autouse=True)
def _fault_hook() -> Iterator[None]:
    """Whatever hook a test installs on cni.faults is gone after it."""
    before = faults.hook
    yield
    faults.hook = before


def count_queued() -> Counted:
    """From now on in this test, the calls queued on any pool's combiner counted (`["combiner-queued"]`),
    on top of the fault hook already installed."""
    counted = Counted(faults.hook)
    faults.hook = counted
    return counted
