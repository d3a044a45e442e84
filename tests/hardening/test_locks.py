"""Device locks leave no file behind, and removing the file on release never lets two holders in."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cni.device.statedir import StateDir


def test_lock_file_removed_on_release(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path))
    with sd.lock("pci-0000:af:06.0", "VF"):
        assert os.listdir(tmp_path / "locks") == ["pci-0000:af:06.0"]
        assert (os.stat(tmp_path / "locks" / "pci-0000:af:06.0").st_mode & 0o777) == 0o600
    assert os.listdir(tmp_path / "locks") == []


def test_never_two_holders(tmp_path: Path) -> None:
    """Many threads (each its own open file description, like processes) take one lock in a loop."""
    holders, most, rounds = [0], [0], 40
    guard = threading.Lock()

    def work() -> None:
        sd = StateDir(str(tmp_path))
        for _ in range(rounds):
            with sd.lock("pci-x", "x", timeout=60):
                with guard:
                    holders[0] += 1
                    most[0] = max(most[0], holders[0])
                time.sleep(0.0005)
                with guard:
                    holders[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert os.listdir(tmp_path / "locks") == []
