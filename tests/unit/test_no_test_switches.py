"""Test seams are out of the product: no shipped module reads a test switch from the environment or
carries a test double; the seams (cni.faults.hook, cni.sriov.vf.factory) are set only inside a test
process (tests/launch.py). tests/integration/test_no_test_switches.py runs the plugins with the former
variables set, from source and frozen."""

from __future__ import annotations

import pytest

from bundler.freeze import FIRST_PARTY, first_party_modules
from cni import faults
from cni.sriov import vf
from tests.nsutil import REPO

FORMER = ("PYCNI_TEST_FAULTS", "PYCNI_SRIOV_FAKE_PF", "FakeVf", "from tests", "import tests")


def test_no_shipped_source_names_a_test_switch() -> None:
    found = [f"{path.relative_to(REPO)}: {word}" for pkg in FIRST_PARTY for path in (REPO / pkg).rglob("*.py")
             for word in FORMER if word in path.read_text()]
    assert found == []
    assert not any("fake" in m or m.startswith("tests") for m in first_party_modules())


def test_the_seams_are_inert_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCNI_TEST_FAULTS", "result!,result,link!,link")
    monkeypatch.setenv("PYCNI_SRIOV_FAKE_PF", "/nonexistent.json")
    assert faults.hook is None and vf.factory is None
    for step in ("result", "link"):
        faults.point(step)  # neither raises nor kills
    assert isinstance(vf.control(), vf.NetlinkVf)
