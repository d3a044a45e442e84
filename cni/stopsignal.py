"""SIGTERM and SIGINT as a stop a long-running main loop waits for: the installer's serve loop
(bundler.install) and the reconciler's (ipam.cli). The standard library's os, select and signal only.

Why not a threading.Event set by the signal handler: Python runs the handler in the main thread between
two bytecodes, and Event.set() takes the Event's lock; a main thread that waits on that same Event
holds it for a few bytecodes on each wait, so a signal landing there deadlocks the process for good
(the installer hung on SIGTERM until the kubelet's SIGKILL). The handler here only sets a flag; the
wait is a select() on the signal wake-up descriptor, which the interpreter's C-level handler writes
whichever thread the kernel delivered the signal to (a thread of the metrics server, say), so the
main thread wakes at once even then."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignal:
    """Set by STOP_SIGNALS once installed (main thread only), or by set(). is_set() and wait() as a
    threading.Event's, for the main thread."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def install(self, signals: Iterable[signal.Signals] = STOP_SIGNALS) -> StopSignal:
        """Handle `signals` (main thread only: signal.signal raises ValueError elsewhere)."""
        for sig in signals:
            signal.signal(sig, self._handle)
        signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._set = True  # no lock, no allocation worth the name: safe between any two bytecodes

    def set(self) -> None:
        self._set = True
        with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
            os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        """Until set or `timeout` seconds have passed; whether it is set. A wake-up for another signal
        (one with a Python handler of its own) is read off and the wait goes on."""
        deadline = time.monotonic() + timeout
        while not self._set:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if select.select([self._read], [], [], left)[0]:
                self._drain()
        return True

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read, 512):
                pass
