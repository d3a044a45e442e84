"""The session-end check of tests/conftest.py (no test may write to the product's default paths) finds
each kind of default path in a tree that holds one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import default_paths

PLANTED = ["var/lib/cni/pycni/whereabouts.db", "var/lib/cni/pycni/whereabouts.db-wal",
           "var/lib/cni/pycni/pool-locks/", "var/lib/cni/pycni/etcd-token-0123abcd",
           "var/lib/cni/pycni/devices/locks/", "var/lib/cni/pycni/devices/attachments/",
           "run/pycni/", "etc/cni/net.d/whereabouts.d/", "var/lib/cni/pycni/macvlan-dualstack.db"]


@pytest.mark.parametrize("planted", PLANTED)
def test_each_default_path_is_found(tmp_path: Path, planted: str) -> None:
    assert default_paths(str(tmp_path)) == set()
    path = tmp_path / planted
    if planted.endswith("/"):
        path.mkdir(parents=True)
    else:
        path.parent.mkdir(parents=True)
        path.write_text("")
    assert "/" + planted.rstrip("/") in default_paths(str(tmp_path))
