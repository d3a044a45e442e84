"""Fault points: the named steps of ADD (docs/testing.md, Fault points) where a test makes a call fail or die,
to check the rollback and the recovery after a crash.

`point(step)` calls `hook` when one is installed and does nothing otherwise. The product never
installs one, and nothing outside the code does (no environment variable, file or flag): only a test
process sets `hook` (tests/launch.py, or a test's own monkeypatch)."""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable

hook: Callable[[str], None] | None = None


def point(step: str) -> None:
    if hook is not None:
        hook(step)
