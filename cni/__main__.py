"""Multicall entry: the plugin is the executable's name (frozen: /opt/cni/bin/macvlan -> macvlan),
or the first argument (`python -m cni macvlan`)."""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from cni.registry import PLUGINS
    from cni.skel import run

    argv = sys.argv if argv is None else argv
    name = os.path.basename(argv[0])
    if name not in PLUGINS:
        if len(argv) < 2:
            sys.stderr.write(f"usage: {name} PLUGIN  (one of: {', '.join(sorted(PLUGINS))})\n")
            return 2
        name = argv[1]
    try:
        return run(name, os.environ, sys.stdin.buffer, sys.stdout.buffer)
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
