"""Upgrade under load with the fake bundle (a real ELF): 1,000 executions while the installer upgrades
20 times. The frozen bundle runs the same storm in tests/e2e/test_frozen_bundle.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import upgrade_storm
from tests.bundle_layouts import FAKE_EXE, fake_layout, variant


@pytest.mark.skipif(not FAKE_EXE.exists(), reason=f"{FAKE_EXE} (containernetworking-plugins)")
def test_upgrade_storm_has_no_exec_or_json_errors(tmp_path: Path) -> None:
    a = fake_layout(tmp_path / "a", "0.0.1")
    b = variant(a, tmp_path / "b", "0.0.2")
    storm = upgrade_storm.run((a, b), tmp_path / "bin", tmp_path / "conf", "macvlan", grace=0.5)
    assert storm.upgrades == 20, storm.unfinished(20)
    assert storm.calls >= 1000
    assert not storm.failures, storm.failures
    assert storm.switches == 20, "every upgrade made a fresh copy and switched to it"
    assert storm.expired > 0, "old copies were removed while the loop ran"
