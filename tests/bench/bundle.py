"""Benchmark of the frozen bundle (`make bench-bundle`; a script, not a timed test):

- bundle size on disk (dist/cni-bin) against Debian's Go macvlan;
- cold VERSION: a new process per call, frozen macvlan vs Debian's Go macvlan vs `python -m cni`;
- an ADD+DEL cycle through the libcni driver (macvlan + Debian's host-local) for both;
- the start-up floor: the empty program frozen with the bundle's options vs `python3.12 -I -c pass`.

Ratios are from one run on this machine; numbers are medians (p95 in brackets)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from cni import jsonio
from tests import nsutil
from tests.e2e import bundle_driver

REPO = nsutil.REPO
DIST = REPO / "dist"
GO_DIR = Path("/usr/lib/cni")
RUNS = int(os.environ.get("BENCH_RUNS", "30"))


def timed(fns: Mapping[str, Callable[[], object]], runs: int = RUNS) -> dict[str, list[float]]:
    """Round-robin over the candidates (one run of each per round), so a change in machine load hits
    all of them alike and the ratios stay meaningful on a shared machine."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # page cache warm, like a node that ran the plugin before
    for _ in range(runs):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t) * 1000)
    return {name: sorted(xs) for name, xs in out.items()}


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.1f} ms [{xs[int(len(xs) * 0.95) - 1]:6.1f}]"


def run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def disk_usage(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    return sum(p.stat().st_size for p in files), len(files)


def version_times(python: str) -> dict[str, list[float]]:
    env = {"CNI_COMMAND": "VERSION"}
    src_env = {**env, "PYTHONPATH": str(REPO)}
    return timed({
        "Go macvlan (Debian)": lambda: run([str(GO_DIR / "macvlan")], env),
        "pycni frozen macvlan": lambda: run([str(DIST / "cni-bin" / "macvlan")], env),
        "pycni from source": lambda: run([sys.executable, "-m", "cni", "macvlan"], src_env),
        "empty frozen program": lambda: run([str(DIST / "empty-bundle" / "empty" / "empty")]),
        "python3.12 -I -c pass": lambda: run([python, "-I", "-c", "pass"]),
    })


def cycle_times(tmp: Path) -> dict[str, list[float]]:
    """ADD then DEL through libcni, Debian's macvlan and pycni's frozen one alternately (both with
    Debian's host-local), each on its own uplink and pod namespace."""
    topo = nsutil.Topology()
    try:
        fns: dict[str, Callable[[], object]] = {
            "Go macvlan (Debian)": _cycle(topo, tmp / "none", tmp / "go"),
            "pycni frozen macvlan": _cycle(topo, DIST / "cni-bin", tmp / "py"),
        }
        return timed(fns, max(10, RUNS // 2))
    finally:
        topo.close()


def _cycle(topo: nsutil.Topology, plugin_dir: Path, tmp: Path) -> Callable[[], None]:
    tmp.mkdir(parents=True)
    master = topo.add_uplink(tmp.name[:2])
    ipam = {"type": "host-local", "dataDir": str(tmp / "ipam"), "ranges": [[{"subnet": "198.51.100.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "bench", "plugins": [{"type": "macvlan", "master": master,
                                                                  "ipam": ipam}]}
    path = tmp / "bench.conflist"
    path.write_bytes(jsonio.dumps(conf))
    pod = topo.pod(tmp.name[:2])
    env = {"CNI_PATH": f"{plugin_dir}:{GO_DIR}", "CNI_CACHE_DIR": str(tmp / "cache"),
           "PATH": os.environ["PATH"]}

    def one() -> None:
        for command in ("add", "del"):
            run(["ip", "netns", "exec", topo.host, str(bundle_driver.DRIVER), command, str(path), "c1", pod,
                 "net1"], env)

    return one


def main() -> int:
    python = str(Path(os.path.realpath(sys.executable)))
    empty = DIST / "empty-bundle" / "empty" / "empty"
    for need in (DIST / "cni-bin" / "macvlan", empty, bundle_driver.DRIVER):
        if not need.exists():
            print(f"missing {need}: run `make bench-bundle`", file=sys.stderr)
            return 2
    size, count = disk_usage(DIST / "cni-bin")
    go_size = (GO_DIR / "macvlan").stat().st_size
    print(f"bundle dist/cni-bin: {size / 2**20:.1f} MiB in {count} files "
          f"(Debian macvlan alone: {go_size / 2**20:.1f} MiB; all of /usr/lib/cni: "
          f"{disk_usage(GO_DIR)[0] / 2**20:.1f} MiB)")
    v = version_times(python)
    print(f"\ncold VERSION, new process per call ({RUNS} runs, median [p95]):")
    for name, xs in v.items():
        print(f"  {name:24s} {fmt(xs)}")
    go = statistics.median(v["Go macvlan (Debian)"])
    frozen = statistics.median(v["pycni frozen macvlan"])
    floor = statistics.median(v["empty frozen program"])
    py = statistics.median(v["python3.12 -I -c pass"])
    print(f"  ratio frozen/Go: {frozen / go:.1f}x")
    print(f"  empty-bundle floor / python -I -c pass: {floor / py:.2f}x")
    with tempfile.TemporaryDirectory() as d:
        cycles = cycle_times(Path(d))  # no pycni dir on the Go run's CNI_PATH: Debian's macvlan
    print("\nADD+DEL cycle through libcni (macvlan + host-local), median [p95]:")
    for name, xs in cycles.items():
        print(f"  {name:24s} {fmt(xs)}")
    go_cycle, py_cycle = (statistics.median(xs) for xs in cycles.values())
    print(f"  ratio frozen/Go: {py_cycle / go_cycle:.1f}x")
    print(f"\nload average during the run: {os.getloadavg()[0]:.1f} (2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
