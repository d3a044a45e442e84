"""Fixtures of the Kubernetes tests. Most run on the session's real kube-apiserver (tests/conftest.py
`kube` and `tenant`); these serve the tests that stay on the in-process API emulator (injected faults,
client certificates): the emulator (one per test), a test PKI made with openssl (once per session;
also a CA that did not sign the real server), a node kubeconfig onto the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam import rbac
from tests.kubeapi.emulator import Emulator, make_pki


@pytest.fixture
def emu() -> Iterator[Emulator]:
    e = Emulator()
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), clients=("pycni-node", "stranger"))


@pytest.fixture
def tls_emu(pki: Path) -> Iterator[Emulator]:
    e = Emulator(tls=pki)
    try:
        yield e
    finally:
        e.stop()


@pytest.fixture
def node_kubeconfig(emu: Emulator, tmp_path: Path) -> Path:
    return emu.kubeconfig(tmp_path / "node.kubeconfig", token="node-token")


@pytest.fixture(autouse=True)
def _node_role() -> Iterator[None]:
    """Every test starts acting as the node (the CLI switches to the reconciler and back)."""
    assert rbac.acting() == rbac.NODE
    yield
    assert rbac.acting() == rbac.NODE
