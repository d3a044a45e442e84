"""Shared fixtures: root gating, per-test topologies, a session-end leak check."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests import nsutil

ROOT_REASON = "needs root: creates network namespaces and links"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason=ROOT_REASON)
    for item in items:
        parts = item.path.parts
        if "integration" in parts:
            item.add_marker(pytest.mark.root)
        if "e2e" in parts:
            item.add_marker(pytest.mark.root)
            item.add_marker(pytest.mark.e2e)
        if not nsutil.is_root() and "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def topo() -> Iterator[nsutil.Topology]:
    t = nsutil.Topology()
    try:
        yield t
    finally:
        t.close()


SECRET_MARK = "PYCNI-SECRET-"  # every secret a test uses (token, etcd password) contains this


@pytest.fixture(scope="session", autouse=True)
def _no_secrets_in_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every line pycni logs during the session, in this process and in every plugin process it
    starts (they inherit PYCNI_TEST_LOG, see cni/log.py), at every level, is grepped for secrets."""
    collected = tmp_path_factory.mktemp("logs") / "all.log"
    os.environ["PYCNI_TEST_LOG"] = str(collected)
    yield
    lines = collected.read_bytes().decode(errors="replace").splitlines() if collected.exists() else []
    leaked = [line for line in lines if SECRET_MARK in line]
    print(f"\nsecret grep: {len(lines)} log lines, {len(leaked)} with {SECRET_MARK}")
    assert not leaked, f"secrets in the logs: {leaked[:5]}"


@pytest.fixture(scope="session", autouse=True)
def _no_leftovers() -> Iterator[None]:
    yield
    if nsutil.is_root() and os.environ.get("PYCNI_KEEP_NETNS") != "1":
        left = nsutil.leftovers()
        nsutil.cleanup_run()
        assert not left, f"tests left behind namespaces/links: {left}"
