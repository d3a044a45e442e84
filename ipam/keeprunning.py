"""A thread of the agent that never ends on an exception (issue 45: its pod watch and IPAMClaim watch,
ipam.podwatch and ipam.claimwatch): its loop is run again after any exception that escapes it, with
backoff, told once by the caller's `down` and counted under the caller's store. Also the two watches'
queueing while their sweeper is behind (put) and their closing (close_after)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from cni import log, metrics


def keep(
    stop: threading.Event, body: Callable[[], None], recover: Callable[[], None],
    down: Callable[[Exception], None], worked: Callable[[], bool], backoff: tuple[float, float],
    store_label: str,
) -> None:  # fmt: skip
    """Run `body` (a thread's loop) until it returns or `stop` is set; after any exception that escapes
    it: `down(e)` (the caller says it once, with the traceback), a wait (backoff doubling from the first
    to the longest, back to the first when `worked()` says the thread had worked again since),
    `recover()`, and `body` again. What the thread counts is labelled with `store_label` (cni.metrics
    STORE: a thread starts without the IPAM call's context)."""
    label = metrics.STORE.set(store_label)
    delay = backoff[0]
    try:
        while not stop.is_set():
            try:
                body()
                return
            except Exception as e:
                if stop.is_set():
                    return
                if worked():
                    delay = backoff[0]
                down(e)
                if stop.wait(delay):
                    return
                delay = min(delay * 2, backoff[1])
                recover()
    finally:
        metrics.STORE.reset(label)


PUT_WAIT = 1.0  # seconds a watcher waiting for room in the queue sleeps between looks at `stop`


def put[T](jobs: queue.Queue[T | None], job: T, stop: threading.Event) -> bool:
    """Queue `job`, waiting while the queue is full (the sweeper is behind); False when stopping."""
    while not stop.is_set():
        try:
            jobs.put(job, timeout=PUT_WAIT)
            return True
        except queue.Full:
            continue
    return False


def close_after(
    threads: list[threading.Thread], timeout: float, closers: list[Callable[[], None]], what: str
) -> bool:
    """Once each of `threads` (told to stop, its read interrupted) has ended, within `timeout` seconds
    in all, call each of `closers` (the connections and stores the threads used); whether they were.
    A thread still running keeps them open (a warning says so): a connection closed under a thread still
    in a TLS read frees its descriptor number, which the next connection opened in the process takes,
    and that read would then consume the new connection's bytes (its handshake fails, or worse)."""
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    running = [t.name for t in threads if t.is_alive()]
    if running:
        log.warning("%s: %s still running after %g s; its connections are left open (closed with the "
                    "process)", what, ", ".join(running), timeout)
        return False
    for close in closers:
        close()
    return True
