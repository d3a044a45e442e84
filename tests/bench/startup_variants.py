"""Where PyInstaller's start-up time goes (`python -m tests.bench.startup_variants`; slow: it freezes
the empty program and the bundle once per variant into a temp dir). Each variant adds one of the
choices of bundler/freeze.py to the stock configuration; medians of cold runs, new process each time."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
RUNS = int(os.environ.get("BENCH_RUNS", "40"))
VARIANTS = {  # cumulative, in the order bundler/freeze.py applies them
    "stock (hooks, PYZ, no strip)": {"PYCNI_KEEP_HOOKS": "1", "PYCNI_NOARCHIVE": "0", "PYCNI_STRIP": "0",
                                     "PYCNI_KEEP_CTYPES": "1"},
    "+ runtime hooks dropped": {"PYCNI_NOARCHIVE": "0", "PYCNI_STRIP": "0", "PYCNI_KEEP_CTYPES": "1"},
    "+ strip": {"PYCNI_NOARCHIVE": "0", "PYCNI_KEEP_CTYPES": "1"},
    "+ noarchive": {"PYCNI_KEEP_CTYPES": "1"},
    "+ ctypes excluded (= make bundle)": {},
    "  (optimize 2, not used)": {"PYCNI_OPTIMIZE": "2"},
}


def median_ms(cmd: list[str], env: dict[str, str] | None = None) -> float:
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
    xs = []
    for _ in range(RUNS):
        t = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
        xs.append((time.perf_counter() - t) * 1000)
    return statistics.median(xs)


def build(dist: Path, knobs: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCNI_")} | knobs
    for extra in ([], ["--empty"]):
        subprocess.run([sys.executable, "-m", "bundler.build", "--dist", str(dist), *extra], env=env,
                       cwd=REPO, check=True, capture_output=True)


def main() -> int:
    python = os.path.realpath(sys.executable)
    print(f"python3.12 -I -c pass: {median_ms([python, '-I', '-c', 'pass']):6.1f} ms")
    print(f"{'variant':36s} {'empty':>8s} {'VERSION':>8s} {'size':>8s}")
    for name, knobs in VARIANTS.items():
        with tempfile.TemporaryDirectory() as d:
            dist = Path(d)
            build(dist, knobs)
            empty = median_ms([str(dist / "empty-bundle" / "empty" / "empty")])
            version = median_ms([str(dist / "cni-bin" / "macvlan")], {"CNI_COMMAND": "VERSION"})
            size = sum(p.stat().st_size for p in (dist / "cni-bin").rglob("*") if p.is_file())
            print(f"{name:36s} {empty:6.1f}ms {version:6.1f}ms {size / 2**20:6.1f}MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
