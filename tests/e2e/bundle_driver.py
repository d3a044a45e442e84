"""Run CNI configs through the libcni driver (tests/e2e/driver, `make driver`) against pycni's entries:
the frozen cni-bin dir when PYCNI_PLUGIN_DIR is set, else a directory of shims running `python -m cni`."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.registry import PLUGINS
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO, Call, Topology

DRIVER = REPO / ".venv" / "bin" / "cnidriver"
REFERENCE = "/usr/lib/cni"


def require_driver() -> None:
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} missing: run `make driver` (make test does)")


def frozen_dir() -> Path | None:
    d = os.environ.get("PYCNI_PLUGIN_DIR")
    return Path(d) if d else None


def plugin_dir(tmp: Path) -> Path:
    """A CNI_PATH directory holding one executable per registry plugin."""
    frozen = frozen_dir()
    if frozen is not None:
        return frozen
    shims = tmp / "pycni-src-bin"
    shims.mkdir(exist_ok=True)
    for name in PLUGINS:
        shim = shims / name
        shim.write_text(f'#!/bin/sh\nPYTHONPATH="{PYTHONPATH}" exec "{sys.executable}" -m cni {name}\n')
        shim.chmod(0o755)
    return shims


def drive(topo: Topology, command: str, conf: Mapping[str, Any] | Path, tmp: Path, *,
          netns: str = "", ifname: str = "net1", container_id: str = "c1",
          env: Mapping[str, str] | None = None) -> Call:
    """`cnidriver command conf container_id netns ifname` inside the topology's host namespace."""
    require_driver()
    path = conf if isinstance(conf, Path) else tmp / f"{conf.get('name', 'net')}.conflist"
    if not isinstance(conf, Path):
        path.write_bytes(jsonio.dumps(dict(conf)))
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(CNI_PATH=f"{plugin_dir(tmp)}:{REFERENCE}", CNI_CACHE_DIR=str(tmp / "cni-cache"))
    full.update(env or {})
    cmd = ["ip", "netns", "exec", topo.host, str(DRIVER), command.lower(), str(path), container_id,
           netns, ifname]
    proc = subprocess.run(cmd, env=full, capture_output=True, check=False, timeout=120)
    out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
    return Call(proc.returncode, out, proc.stderr.decode(errors="replace"))
