"""Hardening suite: hypothesis profiles (`ci`: bounded, the default; `fuzz`: the long run of
`make fuzz`), selected with PYCNI_FUZZ_PROFILE, and a shared tally of what was fuzzed, injected and
stormed that is printed at the end of the session."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tests.hardening.fuzzlab import FuzzLab

_COMMON = {
    "deadline": None,  # a loaded 2-core machine: no per-example wall-clock limit
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                              HealthCheck.function_scoped_fixture],
    "print_blob": True,
}
# ci: the same cases on every run (a CI failure is always reproducible); fuzz: new random cases each run,
# failures kept in .hypothesis/ and replayed first next time.
settings.register_profile("ci", max_examples=int(os.environ.get("PYCNI_FUZZ_EXAMPLES", "150")),
                          derandomize=True, database=None, **_COMMON)
settings.register_profile("fuzz", max_examples=int(os.environ.get("PYCNI_FUZZ_EXAMPLES", "5000")), **_COMMON)
settings.load_profile(os.environ.get("PYCNI_FUZZ_PROFILE", "ci"))

TALLY: Counter[str] = Counter()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TALLY:
        text = ", ".join(f"{k}={v}" for k, v in sorted(TALLY.items()))
        terminalreporter.write_line(f"hardening tally: {text}")


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzLab]:
    """One lab (host and pod namespaces, stand-in devices, local store) per test module, removed after."""
    from tests.hardening.fuzzlab import FuzzLab

    made = FuzzLab(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]))
    try:
        yield made
    finally:
        made.close()
