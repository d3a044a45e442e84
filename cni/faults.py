"""Fault injection for tests: with PYCNI_TEST_FAULTS=step[,step...] in the environment, `point(step)`
raises at that step, so a test can fail an ADD at every step and check the rollback; `step!` kills
the process there instead (SIGKILL: no rollback runs; with the agent serving, the agent: a crash
mid-request), to test recovery after a crash. Unset (always, outside tests) it does nothing. An IPAM
the plugin execs does not inherit the variable. The steps are listed in README.md (Hardening)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextvars import ContextVar

from cni.errors import CniError

ENV = "PYCNI_TEST_FAULTS"
# The request's environment (skel.run sets it): in the agent, os.environ is the agent's, not the caller's.
_REQUEST_ENV: ContextVar[Mapping[str, str] | None] = ContextVar("pycni_faults_env", default=None)


def use(env: Mapping[str, str]) -> None:
    _REQUEST_ENV.set(env)


def point(step: str) -> None:
    env = _REQUEST_ENV.get()
    wanted = (os.environ if env is None else env).get(ENV)
    if not wanted:
        return
    items = wanted.split(",")
    if f"{step}!" in items:
        import signal  # here: importing signal builds its enums, ~1 ms of every call

        os.kill(os.getpid(), signal.SIGKILL)
    if step in items:
        raise CniError(f"injected fault at step {step} ({ENV})")
