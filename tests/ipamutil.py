"""Helpers for running our IPAM from source the way a runtime finds it: an executable named
`whereabouts` on CNI_PATH that runs `python -m cni whereabouts` from this checkout."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from tests.logtee import PYTHONPATH


def write_wrappers(directory: Path, plugins: dict[str, str] | None = None) -> Path:
    """Executables in `directory`: name -> plugin (default: whereabouts). Returns the directory.

    Written atomically (a complete file renamed over the old one): tests call this from many threads
    while plugins exec the same wrapper, and `sh` reading a wrapper that another thread has just
    truncated runs an empty script: exit 0, no output (an IPAM "result" of nothing)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, plugin in (plugins or {"whereabouts": "whereabouts"}).items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        with os.fdopen(fd, "w") as fh:
            fh.write(f'#!/bin/sh\nPYTHONPATH="{PYTHONPATH}" exec "{sys.executable}" -m cni {plugin}\n')
        os.chmod(tmp, 0o755)
        os.replace(tmp, directory / name)
    return directory
