"""The session's log collector (tests/conftest.py `_no_secrets_in_logs` greps it for secrets): every line
pycni logs, at every level, in the test process and in every process it starts from source, appended to
the file PYCNI_TEST_LOG names. The product has no such switch: this module installs cni.log's `tee` seam
from inside each process, the test process itself (conftest) and the others through
tests/site/sitecustomize.py, which Python imports at start-up from PYTHONPATH (`PYTHONPATH` below: the
checkout and tests/site; the test process exports it, and the helpers that start pycni from source set it).
Frozen processes run no sitecustomize: what they log reaches their stderr and log files, which the tests
that run them read (tests/hardening/test_security.py runs every level into both)."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "tests" / "site"
PYTHONPATH = os.pathsep.join((str(REPO), str(SITE)))
ENV = "PYCNI_TEST_LOG"


def install(path: str) -> None:
    """Tee this process's log lines into `path` (appended, created 0600, never through a symlink)."""
    from cni import log

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    log.tee(os.open(path, flags, 0o600))


def install_from_env() -> None:
    """`install` on the file PYCNI_TEST_LOG names, when it is set (a process started by the tests)."""
    path = os.environ.get(ENV)
    if path:
        install(path)
