"""A small logger: stderr and/or a log file, never stdout. No `logging` import on the hot path.

Secrets never reach it: callers log field names and outcomes, not configs, and `redact` masks
credential-looking keys when a structure must be shown."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

LEVELS = {"debug": 10, "verbose": 15, "info": 20, "warning": 30, "error": 40, "panic": 50}
SECRET_WORDS = ("password", "token", "secret", "key_file", "keyfile", "credential")


class _State:
    level = LEVELS["warning"]
    fds: tuple[int, ...] = (2,)
    tag = "pycni"
    file: tuple[str, int] | None = None  # the log file's path and fd (one at a time)
    tee: int | None = -1  # PYCNI_TEST_LOG's fd; -1: not looked up yet


TEST_LOG = "PYCNI_TEST_LOG"  # tests only: every line, at every level, also appended to this file


def _tee() -> int | None:
    """The test suite's collector of every log line (so it can grep them all for secrets); unset
    outside tests, then this costs one environment lookup per process."""
    if _State.tee == -1:
        path = os.environ.get(TEST_LOG)
        _State.tee = None
        if path:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            with contextlib.suppress(OSError):
                _State.tee = os.open(path, flags, 0o600)
    return _State.tee


def configure(level: str | None = None, file: str | None = None, tag: str | None = None) -> None:
    """Apply a plugin's logLevel/logFile. Unknown levels keep the current one (logged once)."""
    if tag:
        _State.tag = tag
    if level:
        if level.lower() in LEVELS:
            _State.level = LEVELS[level.lower()]
        else:
            warning("unknown log level %r ignored (known: %s)", level, ", ".join(LEVELS))
    if file and (_State.file is None or _State.file[0] != file):
        _open_file(file)


def _open_file(path: str) -> None:
    """Log to `path` (appended, created 0600, never through a symlink) besides stderr."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        warning("cannot open log file %s: %s", path, e.strerror)
        return
    old = _State.file[1] if _State.file else None
    _State.fds = (*(x for x in _State.fds if x != old), fd)
    _State.file = (path, fd)
    if old is not None:
        os.close(old)


def _emit(level: int, name: str, msg: str, args: tuple[Any, ...]) -> None:
    tee = _tee()
    if level < _State.level and tee is None:
        return
    try:
        text = msg % args if args else msg
    except (TypeError, ValueError):  # a logging mistake must not turn into a failed CNI call
        text = f"{msg} {args!r}"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    line = f"{stamp}Z {_State.tag}[{os.getpid()}] {name}: {text}\n".encode(errors="replace")
    for fd in _State.fds if level >= _State.level else ():
        with contextlib.suppress(OSError):
            os.write(fd, line)
    if tee is not None:
        with contextlib.suppress(OSError):
            os.write(tee, line)


def debug(msg: str, *args: Any) -> None:
    _emit(10, "debug", msg, args)


def info(msg: str, *args: Any) -> None:
    _emit(20, "info", msg, args)


def warning(msg: str, *args: Any) -> None:
    _emit(30, "warning", msg, args)


def error(msg: str, *args: Any) -> None:
    _emit(40, "error", msg, args)


def redact(obj: Any) -> Any:
    """A copy of `obj` with credential-looking values replaced by '***'."""
    if isinstance(obj, dict):
        return {
            k: "***" if any(w in str(k).lower() for w in SECRET_WORDS) else redact(v) for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    return obj


def traceback_text() -> str:
    import traceback

    return "".join(traceback.format_exception(*sys.exc_info()))
