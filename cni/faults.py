"""Fault injection for tests: with PYCNI_TEST_FAULTS=step[,step...] in the environment, `point(step)`
raises at that step, so a test can fail an ADD at every step and check the rollback; `step!` kills
the process there instead (SIGKILL: no rollback runs), to test recovery after a crash. Unset (always,
outside tests) it does nothing. An IPAM the plugin execs does not inherit the variable. The steps are
listed in README.md (Hardening)."""

from __future__ import annotations

import os
import signal

from cni.errors import CniError

ENV = "PYCNI_TEST_FAULTS"


def point(step: str) -> None:
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    items = wanted.split(",")
    if f"{step}!" in items:
        os.kill(os.getpid(), signal.SIGKILL)
    if step in items:
        raise CniError(f"injected fault at step {step} ({ENV})")
