"""`make demo` as a smoke test: the demo (tests/demo.py) runs to the end with nothing but the standard
library (`python -S`: no site-packages, so neither pyroute2 nor anything else of the virtualenv), shows
what it promises and leaves nothing behind, also when a plugin call fails. In the frozen passes it runs
the bundle of PYCNI_PLUGIN_DIR (through the agent under PYCNI_TEST_AGENT=1, as every call does)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.nsutil import REPO, sh


def run_demo(tmp: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """The demo with its temp dir under `tmp`; argv default: the plugins this test pass runs."""
    bundle = os.environ.get("PYCNI_PLUGIN_DIR")
    argv = argv or (("--cni-bin", bundle) if bundle else ("--source",))
    return subprocess.run([sys.executable, "-S", "-m", "tests.demo", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "TMPDIR": str(tmp)})


def names_of(out: str) -> tuple[str, str]:
    """The demo's per-run prefix and temp dir, from its first lines."""
    m = re.search(r"host namespace (pd[0-9a-f]{4})-host .*; state in (\S+)", out)
    assert m, out
    return m.group(1), m.group(2)


def leftovers(prefix: str, state: str) -> list[str]:
    netns = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines()
             if line.startswith(prefix)]
    links = [line for line in sh("ip", "-o", "link").stdout.splitlines() if f": {prefix}" in line]
    return netns + links + ([state] if os.path.exists(state) else [])


def test_the_demo_shows_everything_and_leaves_nothing(tmp_path: Path) -> None:
    demo = run_demo(tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    prefix, state = names_of(out)
    for shown in ('"type": "macvlan"', "cnitool add macvlan-dualstack /run/netns/",
                  '"address": "198.18.100.1/24"', "inet 198.18.100.1/24",
                  "198.18.100.0-24    198.18.100.0/24    2/254", "demo/pod-2", "2 received, 0% packet loss",
                  "cnitool del macvlan-dualstack", "198.18.100.0/24    0/254", "teardown: namespaces"):
        assert shown in out, f"{shown!r} not in the demo's output:\n{out}"
    assert out.count("0% packet loss") == 2, "IPv4 and IPv6 ping"
    assert leftovers(prefix, state) == []


def test_a_failing_plugin_still_tears_everything_down(tmp_path: Path) -> None:
    broken = tmp_path / "cni-bin"
    broken.mkdir()
    error = '{"cniVersion":"1.0.0","code":7,"msg":"broken"}'
    (broken / "macvlan").write_text(f"#!/bin/sh\necho '{error}'\nexit 1\n")
    (broken / "macvlan").chmod(0o755)
    demo = run_demo(tmp_path, "--cni-bin", str(broken))
    assert demo.returncode == 1 and "demo failed: add failed (exit 1)" in demo.stderr, demo.stderr
    prefix, state = names_of(demo.stdout)
    assert "teardown: namespaces" in demo.stdout
    assert leftovers(prefix, state) == []
