"""What noting a claim in the pool's node lock costs an ADD (ipam.reservations): one note and the release
that takes it off, against a release with nothing noted, on a lock file in a temp dir; the median of
20,000 of each, three runs. `python -m tests.bench.leftover_notes` (docs/benchmarks.md)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time

from ipam import nodelock, reservations
from ipam.model import Allocation

UID = "0b6c2d5e-1111-2222-3333-444455556666"
OWNER = Allocation("c" * 64, "ns/pod-name-0", "net1", UID, "blue", "node-1")


def one(fd: int, path: str, noted: bool) -> int:
    lock = nodelock.Held(fd, path, 1)
    start = time.perf_counter_ns()
    if noted:
        reservations.note_claim(lock, "198.51.100.17", 17, OWNER)
    lock.release()
    return time.perf_counter_ns() - start


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pool.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        os.pwrite(fd, bytes(8), 0)
        try:
            for run in range(3):
                got = {k: statistics.median(one(fd, path, k) for _ in range(20_000)) / 1000
                       for k in (False, True)}  # fmt: skip
                print(f"run {run + 1}: release alone {got[False]:.2f} us, note + release {got[True]:.2f} us")
        finally:
            os.close(fd)


if __name__ == "__main__":
    main()
