"""Fixtures for device-plugin tests: a Lab (veth stand-ins, fake sysfs, recording VF seam)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.devlab import Lab
from tests.nsutil import Topology


@pytest.fixture
def lab(topo: Topology, tmp_path: Path) -> Iterator[Lab]:
    yield Lab(topo, tmp_path)
