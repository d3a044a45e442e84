"""The skips a test session may have, in one place: a session with any other skip fails (tests/conftest.py
loads this module as a plugin). A prerequisite missing in CI is a red CI, not a pass: CI runs `make test`
as root, on a machine where `make deps` installed the Debian packages and ../shared is beside the clone,
so none of those is an allowed reason there (a missing package, etcd, kubectl, podman, `make`, binutils;
../shared present but incomplete). Each entry says when it is allowed and why that is acceptable.

A skip site uses the reason below (the constant, or the text it starts with) or its own words, which no
session accepts; ALLOWED is what `make test`'s summary counts (`pytest_terminal_summary`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests import kubeup

ROOT = "needs root: "  # the start of every reason of a test that needs root, then what for
FROZEN_ONLY = "frozen pass only (make test runs it with PYCNI_PLUGIN_DIR=dist/cni-bin)"
SOURCE_ONLY = "needs test seams (tests/launch.py), which only the source pass has"
OUTSIDE_CLUSTER_ENV = "PYCNI_TEST_KUBECONFIG"
NO_OUTSIDE_CLUSTER = (f"{OUTSIDE_CLUSTER_ENV} is not set: the variant on an outside cluster needs one (the "
                      "same tests ran on the session's kube-apiserver)")
NO_EXCLUSIVE = "this store offers no exclusive() (optional)"
NO_VIEW_POOL = "this store offers no view_pool() (optional)"
OWN_FLAT_FILE = "this machine has a flat file"  # the start: then which, and what it stops
SHARED_ABSENT = kubeup.ABSENT_REASON


def own_flat_files() -> list[str]:
    """The default IPAM flat files (ipam.config.FLAT_FILES) this machine has."""
    from ipam.config import FLAT_FILES

    return [p for p in FLAT_FILES if os.path.lexists(p)]


@dataclass(frozen=True)
class Allowed:
    reason: str
    when: Callable[[], bool]  # whether it is allowed in this session
    why: str
    prefix: bool = False  # `reason` is the start of the reasons it allows

    def allows(self, reason: str) -> bool:
        matches = reason.startswith(self.reason) if self.prefix else reason == self.reason
        return matches and self.when()


OPTIONAL = "an optional fast path of the store API (ipam/store/base.py): tested where a store offers it"
ALLOWED = (
    Allowed(ROOT, lambda: os.geteuid() != 0, prefix=True,
            why="only when not root (a developer's `make unit`): CI runs as root"),
    Allowed(SHARED_ABSENT, lambda: not kubeup.UPSTREAM.exists(),
            why="only when ../shared/upstream really is absent (a clone without it); CI has it"),
    Allowed(FROZEN_ONLY, lambda: not os.environ.get("PYCNI_PLUGIN_DIR"),
            why="in the source pass: make test's frozen pass runs the test"),
    Allowed(SOURCE_ONLY, lambda: bool(os.environ.get("PYCNI_PLUGIN_DIR")),
            why="in the frozen passes: the source pass runs the test, on the same code"),
    Allowed(NO_OUTSIDE_CLUSTER, lambda: not os.environ.get(OUTSIDE_CLUSTER_ENV),
            why="an optional outside cluster: the contract suite runs on the session's real kube-apiserver"),
    Allowed(NO_EXCLUSIVE, lambda: True, why=OPTIONAL),
    Allowed(NO_VIEW_POOL, lambda: True, why=OPTIONAL),
    Allowed(OWN_FLAT_FILE, lambda: bool(own_flat_files()), prefix=True,
            why="only when the machine is a node with an IPAM flat file of its own, which tests never touch; "
                "CI's machine has none"),
)


def allowing(reason: str) -> Allowed | None:
    return next((a for a in ALLOWED if a.allows(reason)), None)


_SEEN: dict[str, list[str]] = {}  # skip reason -> the tests (or collectors) skipped for it


def reason_of(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def _seen(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SEEN.setdefault(reason_of(report), []).append(report.nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seen(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _seen(report)


def refused() -> dict[str, list[str]]:
    return {reason: ids for reason, ids in _SEEN.items() if allowing(reason) is None}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if refused() and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    allowed = {reason: ids for reason, ids in _SEEN.items() if reason not in refused()}
    if allowed:
        terminalreporter.write_line(f"skips allowed (tests/skips.py): {sum(map(len, allowed.values()))}")
        for reason, ids in sorted(allowed.items()):
            terminalreporter.write_line(f"  {len(ids)} x {reason}")
    for reason, ids in sorted(refused().items()):
        terminalreporter.write_line(f"SKIP NOT ALLOWED (tests/skips.py; the session fails): {reason}: "
                                    f"{len(ids)} x, e.g. {ids[0]}", red=True)
