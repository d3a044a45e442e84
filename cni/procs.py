"""What /proc says of another process, for the waiters that must not wait for a stopped one: the agent's
shim (cni.agent.client) and the node lock's waiters (ipam.nodelock). The standard library's os only."""

from __future__ import annotations


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a tracer: state T or t in /proc/<pid>/stat): it makes
    no progress until it is resumed. False when it cannot be told (gone, not visible)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    end = stat.rfind(b")")  # the state is the field after "(comm)", which may hold anything
    return stat[end + 2 : end + 3] in (b"T", b"t")
