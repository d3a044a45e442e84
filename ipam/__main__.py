"""`python -m ipam`: the operator CLI (see ipam.cli)."""

from __future__ import annotations

import sys

from ipam.cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m ipam"))
