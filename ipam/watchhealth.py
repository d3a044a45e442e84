"""Whether the agent's pod watch (ipam/podwatch.py) does its job, told where an operator looks: the
gauge `pycni_podwatch_up` (cni.metrics `watch_up`: 1 up, 0 down, absent while the watch is off by
configuration) and one log line per change: a warning naming why when a part goes down, a line when
the watch is up (again); never one per retry.

The parts: `open` (the agent found the node's flat file and opened the watch on its store: cni/agent/
main.py), `watch` (the node's pods listed, and the watch connected), `sweep` (the sweeper thread
running). The watch is up when none is down. A part that is starting is down without a word: the
first reason it is given is said."""

from __future__ import annotations

import threading
from collections.abc import Callable

from cni import metrics


class Health:
    """One pod watch's health (the agent has one, across the watches it opens again)."""

    def __init__(self, say: Callable[[str], None], starting: tuple[str, ...] = ("open",)) -> None:
        self.say = say
        self._lock = threading.Lock()
        self._down = dict.fromkeys(starting, "")  # part -> why ("": starting, nothing said yet)
        self._off = False
        metrics.sink().watch_up(False)

    def starting(self, *parts: str) -> None:
        """`parts` begin again (a watch opened anew): down until they report up, nothing said."""
        with self._lock:
            for part in parts:
                self._down.setdefault(part, "")
            self._off = False
            metrics.sink().watch_up(False)

    def down(self, part: str, why: str) -> bool:
        """`part` does not work, because `why`. Said (a warning) and the gauge set to 0 when it was up
        or starting; True then. While it stays down, nothing more is said."""
        with self._lock:  # held while telling: lines and gauge in the order of the changes, each line
            # written before the gauge moves (what sees the gauge move finds the line)
            if self._off or self._down.get(part):
                return False
            self._down[part] = why
            self.say(f"pod watch down: {why}")
            metrics.sink().watch_up(False)
            return True

    def up(self, part: str, what: str = "pod watch up") -> None:
        """`part` works (again). When it was the last part down: the gauge set to 1 and `what` said."""
        with self._lock:
            if self._off or self._down.pop(part, None) is None or self._down:
                return
            self.say(what)
            metrics.sink().watch_up(True)

    def is_up(self, part: str = "") -> bool:
        with self._lock:
            return not self._off and (part not in self._down if part else not self._down)

    def off(self, why: str) -> None:
        """Off by configuration (a store other than Kubernetes): the gauge is not exported; said once."""
        with self._lock:
            if self._off:
                return
            self._off = True
            self._down.clear()
            self.say(f"pod watch off: {why}")
            metrics.sink().watch_up(None)
