"""Explicit rollback: one step per resource created, run in reverse when the body fails."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from cni import log
from cni.errors import CniError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any, Literal


class Undo:
    """`with Undo() as undo: ...; undo.push("delete link", fn, idx); ...; undo.commit()`.

    On an exception every pushed step runs (newest first), each one even if an earlier one failed;
    failures are logged and appended to the error's details, and the original error propagates.
    `failed` lists the steps that failed so far, so a later step can depend on the earlier ones."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
        self.failed: list[str] = []

    def push(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        self._steps.append((what, fn, args))

    def commit(self) -> None:
        self._steps.clear()

    def __enter__(self) -> Undo:
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None or not self._steps:
            return False
        for what, fn, args in reversed(self._steps):
            try:
                fn(*args)
            except Exception as e:
                log.error("rollback: %s failed: %s", what, e)
                self.failed.append(f"{what}: {e}")
        self._steps.clear()
        if self.failed and isinstance(exc, CniError):
            note = "rollback incomplete: " + "; ".join(self.failed)
            exc.details = f"{exc.details}; {note}" if exc.details else note
        return False
