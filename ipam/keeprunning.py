"""A thread of the agent that never ends on an exception (issue 45: its pod watch and IPAMClaim watch,
ipam.podwatch and ipam.claimwatch): its loop is run again after any exception that escapes it, with
backoff, told once by the caller's `down` and counted under the caller's store."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from cni import metrics


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
