"""The tests' one bounded wait: `until` a condition holds, or fail the test saying what never came."""

from __future__ import annotations

import time
from collections.abc import Callable


def until(cond: Callable[[], object], what: str | Callable[[], str], timeout: float = 30.0,
          every: float = 0.002) -> None:
    """Poll `cond()` until it is true; AssertionError naming `what` (a callable: text worth computing only
    on failure, a log say) once `timeout` seconds passed. For a state another thread or process reaches
    however slowly: the timeout only guards against a hang, so it is never what a test measures."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {said}")
        time.sleep(every)
