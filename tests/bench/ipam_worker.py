"""One plugin call in its own process, timed from inside: `python -m tests.bench.ipam_worker` with the
CNI_* environment and the config on stdin. Prints the plugin's stdout, then `ELAPSED <seconds>` on
stderr (the time of skel.run: config, store, allocation, commit; not interpreter start-up)."""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    from cni import skel

    t = time.perf_counter()
    rc = skel.run("whereabouts", os.environ, sys.stdin.buffer, sys.stdout.buffer)
    elapsed = time.perf_counter() - t
    sys.stdout.flush()
    sys.stderr.write(f"ELAPSED {elapsed:.6f}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
