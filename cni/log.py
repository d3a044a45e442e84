"""A small logger: stderr and/or a log file, never stdout. No `logging` import on the hot path.

Secrets never reach it: callers log field names and outcomes, not configs, and `redact` masks
credential-looking keys when a structure must be shown."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from contextvars import ContextVar

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

LEVELS = {"debug": 10, "verbose": 15, "info": 20, "warning": 30, "error": 40, "panic": 50}
SECRET_WORDS = ("password", "token", "secret", "key_file", "keyfile", "credential")


class _Settings:
    """Immutable; changed by making a new one (no dataclasses import on the hot path)."""

    __slots__ = ("fds", "file", "level", "tag")

    def __init__(self, level: int = LEVELS["warning"], fds: tuple[int, ...] = (2,), tag: str = "pycni",
                 file: tuple[str, int] | None = None) -> None:
        self.level = level
        self.fds = fds  # stderr, plus the log file's fd when one is open
        self.tag = tag
        self.file = file  # the log file's path and fd (one at a time)


def replace(st: _Settings, **changes: Any) -> _Settings:
    fields = {k: getattr(st, k) for k in _Settings.__slots__}
    return _Settings(**{**fields, **changes})


# Per context, not per process: the agent runs each request in its own thread (a fresh context), so a
# request's logLevel/logFile and its caller's stderr never leak into another request.
_STATE: ContextVar[_Settings] = ContextVar("pycni_log", default=_Settings())  # noqa: B039 (never mutated)


class _Tee:
    fds: tuple[int, ...] = ()  # process-wide: every line at every level also goes here (`tee`)


def tee(fd: int) -> None:
    """Also write every line of this process, at every level and from every context, to `fd`. A seam
    set only from inside a process, as cni.faults.hook: the product never calls it (the test suite's
    log collector does: tests/logtee.py)."""
    _Tee.fds = (*_Tee.fds, fd)


def configure(level: str | None = None, file: str | None = None, tag: str | None = None) -> None:
    """Apply a plugin's logLevel/logFile. Unknown levels keep the current one (logged once)."""
    if tag:
        _STATE.set(replace(_STATE.get(), tag=tag))
    if level:
        if level.lower() in LEVELS:
            _STATE.set(replace(_STATE.get(), level=LEVELS[level.lower()]))
        else:
            warning("unknown log level %r ignored (known: %s)", level, ", ".join(LEVELS))
    current = _STATE.get().file
    if file and (current is None or current[0] != file):
        _open_file(file)


def own_settings[T](fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` with log settings of its own, as a process it would exec would have: the defaults,
    writing to this context's stderr. What it configures (an in-process IPAM: its config's log_level,
    log_file) ends with it, its log file closed; the caller's settings do not apply to it."""
    token = _STATE.set(_Settings(fds=(stderr_fd(),)))
    try:
        return fn(*args)
    finally:
        close_file()
        _STATE.reset(token)


def use_stderr(fd: int) -> None:
    """Send this context's log lines (and `raw` output) to `fd` instead of fd 2 (the agent: the
    caller's stderr, opened through /proc/<pid>/fd/2)."""
    _STATE.set(replace(_STATE.get(), fds=(fd,), file=None))


def close_file() -> None:
    """Close this context's log file, if one was opened (the agent, at the end of a request)."""
    st = _STATE.get()
    if st.file is not None:
        _STATE.set(replace(st, fds=tuple(x for x in st.fds if x != st.file[1]), file=None))
        with contextlib.suppress(OSError):
            os.close(st.file[1])


def _open_file(path: str) -> None:
    """Log to `path` (appended, created 0600, never through a symlink) besides stderr."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        warning("cannot open log file %s: %s", path, e.strerror)
        return
    st = _STATE.get()
    old = st.file[1] if st.file else None
    _STATE.set(replace(st, fds=(*(x for x in st.fds if x != old), fd), file=(path, fd)))
    if old is not None:
        os.close(old)


def stderr_fd() -> int:
    """Where this context's stderr is (fd 2 in a plugin process; the caller's stderr in the agent)."""
    return _STATE.get().fds[0]


def raw(data: bytes) -> None:
    """Copy a delegate's stderr to this context's stderr."""
    view = memoryview(data)
    with contextlib.suppress(OSError):
        while view:
            view = view[os.write(stderr_fd(), view) :]


def _emit(level: int, name: str, msg: str, args: tuple[Any, ...]) -> None:
    st = _STATE.get()
    tees = _Tee.fds
    if level < st.level and not tees:
        return
    try:
        text = msg % args if args else msg
    except (TypeError, ValueError):  # a logging mistake must not turn into a failed CNI call
        text = f"{msg} {args!r}"
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    line = f"{stamp}Z {st.tag}[{os.getpid()}] {name}: {text}\n".encode(errors="replace")
    for fd in st.fds if level >= st.level else ():
        with contextlib.suppress(OSError):
            os.write(fd, line)
    for fd in tees:
        with contextlib.suppress(OSError):
            os.write(fd, line)


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
