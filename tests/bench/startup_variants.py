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


def build(dist: Path, knobs: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYCNI_")} | knobs
    for extra in ([], ["--empty"]):
        subprocess.run([sys.executable, "-m", "bundler.build", "--dist", str(dist), *extra], env=env,
                       cwd=REPO, check=True, capture_output=True)


def measure(cmds: dict[str, tuple[list[str], dict[str, str] | None]]) -> dict[str, float]:
    """Medians, round-robin over all commands so load changes hit every variant alike."""
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for cmd, env in cmds.values():
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
    for _ in range(RUNS):
        for name, (cmd, env) in cmds.items():
            t = time.perf_counter()
            subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter() - t) * 1000)
    return {name: statistics.median(xs) for name, xs in times.items()}


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        cmds: dict[str, tuple[list[str], dict[str, str] | None]] = {
            "python": ([os.path.realpath(sys.executable), "-I", "-c", "pass"], None)}
        sizes = {}
        for i, (name, knobs) in enumerate(VARIANTS.items()):
            dist = Path(d) / str(i)
            build(dist, knobs)
            cmds[f"{name}/empty"] = ([str(dist / "empty-bundle" / "empty" / "empty")], None)
            cmds[f"{name}/version"] = ([str(dist / "cni-bin" / "macvlan")], {"CNI_COMMAND": "VERSION"})
            sizes[name] = sum(p.stat().st_size for p in (dist / "cni-bin").rglob("*") if p.is_file())
        t = measure(cmds)
    print(f"python3.12 -I -c pass: {t['python']:6.1f} ms   (load average {os.getloadavg()[0]:.1f})")
    print(f"{'variant':36s} {'empty':>8s} {'VERSION':>8s} {'size':>8s}")
    for name in VARIANTS:
        print(f"{name:36s} {t[name + '/empty']:6.1f}ms {t[name + '/version']:6.1f}ms "
              f"{sizes[name] / 2**20:6.1f}MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
