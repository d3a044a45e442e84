"""The running bundle's build id: the shim sends it with every request (the agent serves only its own
build), the agent and the reconciler export it."""

from __future__ import annotations

import os
import sys

BUILD_FILE = "pycni-build-id"


def build_id() -> str:
    """The bundle's build id (written into the frozen bundle by bundler.build), or 'source'."""
    home = getattr(sys, "_MEIPASS", None)
    if not home:
        return "source"
    try:
        with open(os.path.join(home, BUILD_FILE), encoding="utf-8") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return "unknown"
