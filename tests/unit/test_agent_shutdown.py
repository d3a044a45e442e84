"""The agent's stop has one budget (--grace) from SIGTERM for the requests in flight and then the pool
batches they started (cni.agent.main.remaining), so both fit the pod's termination grace period."""

from __future__ import annotations

from cni.agent.main import remaining


def test_the_writes_get_what_the_requests_left_of_the_grace() -> None:
    assert remaining(8.0, stopped_at=100.0, now=105.0) == 3.0
    assert remaining(8.0, stopped_at=100.0, now=100.0) == 8.0
    assert remaining(8.0, stopped_at=100.0, now=120.0) == 0.0
