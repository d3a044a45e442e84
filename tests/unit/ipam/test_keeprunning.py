"""ipam.keeprunning.close_after: the watches' connections are closed only once their threads ended."""

from __future__ import annotations

import threading

import pytest

from ipam import keeprunning


def test_the_connections_are_closed_once_every_thread_ended() -> None:
    closed: list[str] = []
    threads = [threading.Thread(target=lambda: None) for _ in range(2)]
    for t in threads:
        t.start()
    assert keeprunning.close_after(threads, 30, [lambda: closed.append("client"),
                                                 lambda: closed.append("store")], "test watch")  # fmt: skip
    assert closed == ["client", "store"]


def test_a_thread_still_running_keeps_its_connections_open(capfd: pytest.CaptureFixture[str]) -> None:
    """A thread still in its read: its connection is not closed under it (its descriptor number would go
    to the next connection opened, whose bytes that read would take)."""
    held, closed = threading.Event(), []
    t = threading.Thread(target=held.wait, name="pod-watch", daemon=True)
    t.start()
    try:
        assert not keeprunning.close_after([t], 0.05, [lambda: closed.append("client")], "test watch")
        assert closed == []
        assert "test watch: pod-watch still running after 0.05 s" in capfd.readouterr().err
    finally:
        held.set()
        t.join()
