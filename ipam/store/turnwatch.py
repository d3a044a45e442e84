"""The agent's watches of shared pools' turns (ipam.turn, ipam.store.kubeturn): one long-lived watch per
turn in the process, shared by every batch of the agent that waits on that pool, instead of a watch (a
connection, a TLS handshake, a GET of the turn) per batch. A plugin process never uses this: it waits at
most once, with a watch of its own.

A `TurnWatch` keeps the turn's latest state and the states after it began (the last HISTORY), so a waiter
asks for the states after the version it read (`changes`) as it would of a watch of its own; a version
older than what it holds is Gone (the waiter looks at the turn again). While its watch is broken (the API
server away, a 410) it is not `healthy` and waiters use their own watch. Unused for IDLE_SECONDS, it
stops. Enabled once by the agent (ipam.store.kubeturn.share_watches); its thread enters the agent's home
first (the `enter` given)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from cni import log
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.store.base import StoreUnavailable
from ipam.turn import Gone, State

HISTORY = 256  # states kept after the watch began (a waiter further behind looks at the turn again)
IDLE_SECONDS = 60.0  # a watch nobody asked anything of for this long stops
WATCH_SECONDS = 60  # one watch request's length on the server (then resumed from its last version)
BACKOFF = (0.2, 5.0)


class TurnWatch:
    """One turn's watch (module docstring). `watch(since, seconds)`: the turn's states after `since` as
    a watch request gives them ("": from now, the current state first; Gone: too old); `client`: closed
    when the watch stops."""

    def __init__(
        self, watch: Callable[[str, float], Iterator[State]], client: Client,
        enter: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        self.watch, self.client, self.enter = watch, client, enter
        self.cv = threading.Condition()
        self.states: deque[State] = deque(maxlen=HISTORY)
        self.complete_from = -1  # the history holds every state after this version
        self.healthy = False
        self.used = time.monotonic()
        self.stopped = False
        threading.Thread(target=self._loop, name="turn-watch", daemon=True).start()

    def latest(self) -> State | None:
        """The turn as last seen (None: the watch is not healthy)."""
        with self.cv:
            self.used = time.monotonic()
            return self.states[-1] if self.healthy and self.states else None

    def changes(self, since: str, seconds: float) -> Iterator[State] | None:
        """The turn's states after `since`, waiting up to `seconds` for one (none: an empty iteration);
        None: not healthy (the caller watches on its own); Gone: `since` is older than the history."""
        deadline = time.monotonic() + seconds
        with self.cv:
            self.used = time.monotonic()
            while True:
                if not self.healthy:
                    return None
                if not since:  # from now: the turn as it is first
                    return iter([self.states[-1]])
                after = _number(since)
                if after < self.complete_from:
                    raise Gone()
                newer = [s for s in self.states if _number(s.version) > after]
                left = deadline - time.monotonic()
                if newer or left <= 0:
                    return iter(newer)
                self.cv.wait(left)

    def _loop(self) -> None:
        if self.enter is not None:
            self.enter()
        pause = BACKOFF[0]
        try:
            while time.monotonic() - self.used < IDLE_SECONDS:
                try:
                    since = self.states[-1].version if self.healthy else ""  # "": from now, current first
                    for state in self.watch(since, WATCH_SECONDS):
                        with self.cv:
                            if not self.healthy:  # (re)started: the history begins here
                                self.states.clear()
                                self.complete_from = _number(state.version)
                                self.healthy = True
                            self.states.append(state)
                            if len(self.states) == HISTORY:
                                self.complete_from = _number(self.states[0].version)
                            self.cv.notify_all()
                    pause = BACKOFF[0]
                except (Gone, StoreUnavailable, Unreachable, ApiError) as e:
                    self._broken(f"{e}" or type(e).__name__)
                    time.sleep(pause)
                    pause = min(pause * 2, BACKOFF[1])
        except BaseException as e:  # never silent: said once, with what the waiters do meanwhile
            log.error("turn watch ended: %r (waiters watch on their own)\n%s", e, log.traceback_text())
        finally:
            self._broken("")
            self.stopped = True
            self.client.close()
            with _Shared.lock:  # dropped from the registry (a pool no longer written: nothing kept of it)
                for k in [k for k, w in _Shared.watches.items() if w is self]:
                    del _Shared.watches[k]

    def _broken(self, why: str) -> None:
        with self.cv:
            if self.healthy and why:
                log.debug("turn watch broken (%s): waiters watch on their own meanwhile", why)
            self.healthy = False
            self.cv.notify_all()


def _number(version: str) -> int:
    """A resourceVersion as a number (the server's are; anything else compares as oldest)."""
    return int(version) if version.isdigit() else -1


class _Shared:
    enter: Callable[[], None] | None = None
    lock = threading.Lock()
    watches: dict[tuple[str, str, str], TurnWatch] = {}


def shared(
    key: tuple[str, str, str], make: Callable[[Callable[[], None] | None], TurnWatch]
) -> TurnWatch:
    """The process' watch of the turn `key` (server, namespace, name), made with `make` on first use."""
    with _Shared.lock:
        found = _Shared.watches.get(key)
        if found is None or found.stopped:
            found = _Shared.watches[key] = make(_Shared.enter)
        return found


def configure(enter: Callable[[], None] | None) -> None:
    """What the watches' threads do first (the agent: enter its home); the watches there are dropped."""
    _Shared.enter = enter
    with _Shared.lock:
        _Shared.watches.clear()
