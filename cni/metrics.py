"""Metrics hooks: where the agent and the reconciler learn what to export (cni.exporter turns them into
Prometheus metrics). Standard library only, and nothing is installed in a plugin process: there every
hook is one call of an empty method, and prometheus_client is never imported (tests/unit/test_metrics.py
checks an in-process ADD with `-X importtime`).

Labels stay bounded: plugin and command names outside the known sets become "other", error codes
outside cni.errors.Code "other"; pools are named, containers and pods never."""

from __future__ import annotations

import time
from contextvars import ContextVar

from cni.errors import CniError, Code

# The store of the IPAM call this context is running (set by `ipam_call`, or once by the reconciler), so
# that the retry loop and the batch combiner can label what they count without being told.
STORE: ContextVar[str] = ContextVar("pycni_metrics_store", default="")


class Sink:
    """Receives every observation; this one drops them. cni.exporter.Exporter records them."""

    def attach(self, plugin: str, command: str, seconds: float, code: int) -> None:
        """A CNI call served by the agent (code 0: success)."""

    def refused(self, reason: str) -> None:
        """A call the agent did not take (it ran in-process): busy, build, stopping, uid, protocol,
        context."""

    def inflight(self, n: int) -> None:
        """Calls the agent is executing now."""

    def ipam(self, store: str, command: str, seconds: float, code: int) -> None:
        """One IPAM call (code 0: success)."""

    def retry(self, store: str, reason: str) -> None:
        """A store operation attempted again: conflict, busy, unavailable."""

    def conflict(self, store: str, kind: str, n: int = 1) -> None:
        """Writes lost to another writer: `pool` (compare-and-swap) or `reservation` (a racer's)."""

    def pool(self, store: str, name: str, used: int, size: int) -> None:
        """A pool as the reconciler saw it."""

    def pools_seen(self, store: str, names: set[str]) -> None:
        """A reconcile run listed these pools and no others (the others are gone)."""

    def reconciled(self, seconds: float, ok: bool, freed: dict[str, int]) -> None:
        """One reconcile run; freed: kind (allocation, reservation) -> count."""

    def watch_event(self, kind: str) -> None:
        """An event of the agent's pod watch (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR; GONE: a 410)."""

    def watch_request(self, verb: str) -> None:
        """A request the pod watch made: list, watch (of pods), and its sweeps' get, patch, delete."""

    def watch_swept(self, seconds: float, ok: bool, freed: int) -> None:
        """One sweep of the pod watch: entries and reservations of deleted pods freed."""

    def watch_up(self, up: bool | None) -> None:
        """The pod watch is up (True), down (False: wanted, not working), or off by configuration (None)."""


_NULL = Sink()


class _Installed:
    sink: Sink = _NULL


def install(sink: Sink | None) -> None:
    """Process-wide (the agent or the reconciler at start-up); None: back to dropping everything."""
    _Installed.sink = sink or _NULL


def sink() -> Sink:
    return _Installed.sink


def retry(reason: str) -> None:
    _Installed.sink.retry(STORE.get(), reason)


def conflict(kind: str, n: int = 1) -> None:
    if n:
        _Installed.sink.conflict(STORE.get(), kind, n)


def parse_address(text: str) -> tuple[str, int] | None:
    """A metrics endpoint: 'IP:PORT', '[IPV6]:PORT', ':PORT' (every address), or 'off' (None). Port 0
    binds any free one. ValueError naming what is wrong."""
    import ipaddress

    text = text.strip()
    if text.lower() in ("off", "none", "false", "no", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{text!r}: expected HOST:PORT (a port up to 65535) or off")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address goes in brackets ([::1]:PORT)")
    if host:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IP address") from None
    return host or "0.0.0.0", int(port)


class ipam_call:  # a context manager, named like the function it stands for
    """`with ipam_call(store, command):` times one IPAM call, labels what happens inside it with its
    store, and records the CNI code of the exception that leaves it (999 for anything else)."""

    __slots__ = ("command", "started", "store", "token")

    def __init__(self, store: str, command: str) -> None:
        self.store, self.command = store, command

    def __enter__(self) -> None:
        self.token = STORE.set(self.store)
        self.started = time.monotonic()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        seconds = time.monotonic() - self.started
        STORE.reset(self.token)
        code = 0 if exc is None else int(exc.code) if isinstance(exc, CniError) else int(Code.INTERNAL)
        _Installed.sink.ipam(self.store, self.command, seconds, code)
