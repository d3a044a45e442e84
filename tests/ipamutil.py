"""Helpers for running our IPAM from source the way a runtime finds it: an executable named
`whereabouts` on CNI_PATH that runs `python -m cni whereabouts` from this checkout."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.nsutil import REPO


def write_wrappers(directory: Path, plugins: dict[str, str] | None = None) -> Path:
    """Executables in `directory`: name -> plugin (default: whereabouts). Returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, plugin in (plugins or {"whereabouts": "whereabouts"}).items():
        script = directory / name
        script.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" -m cni {plugin}\n')
        script.chmod(0o755)
    return directory
