"""A test namespace created while "/" is shared (a cluster up) and deleted after "/" became private again
(the cluster went down meanwhile) left its file in /run/netns, busy: ip's `netns del` unmounts our mount
but not the copy propagated to "/". tests.nsutil.delete_netns removes both. Reproduced inside a mount
namespace of this test's own (every mount private first), so the host's propagation is never touched."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.nsutil import NETNS_DIR, REPO, RUN, sh

CHILD = """
import os, subprocess, sys
from pathlib import Path
from tests.nsutil import NETNS_DIR, delete_netns, sh

name = sys.argv[1]
path = os.path.join(NETNS_DIR, name)
sh("mount", "--make-shared", "/")  # this mount namespace's "/" only: a cluster's host
sh("umount", "-l", NETNS_DIR)  # ip binds /run/netns again, now a peer of the shared "/"
sh("ip", "netns", "add", name)
sh("mount", "--make-private", "/")  # the cluster goes down
sh("ip", "netns", "del", name, check=False)
print("left by ip:", os.path.exists(path))
delete_netns(name)
print("left after delete_netns:", os.path.exists(path),
      any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines()))
"""


def test_a_namespace_outliving_a_shared_root_is_removed() -> None:
    name = f"{RUN}ush"
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", CHILD, name],
            capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "left by ip: True" in proc.stdout  # the case is reproduced: ip alone leaves it
        assert "left after delete_netns: False False" in proc.stdout
        assert not os.path.exists(os.path.join(NETNS_DIR, name))
    finally:
        sh("ip", "netns", "del", name, check=False)  # a file the child left in the shared directory
