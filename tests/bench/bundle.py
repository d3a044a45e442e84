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
from collections.abc import Callable
from pathlib import Path

from cni import jsonio
from tests import nsutil
from tests.e2e import bundle_driver

REPO = nsutil.REPO
DIST = REPO / "dist"
GO_DIR = Path("/usr/lib/cni")
RUNS = int(os.environ.get("BENCH_RUNS", "30"))


def timed(fn: Callable[[], object], runs: int = RUNS) -> list[float]:
    fn()  # page cache warm, like a node that ran the plugin before
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return sorted(out)


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
    return {
        "Go macvlan (Debian)": timed(lambda: run([str(GO_DIR / "macvlan")], env)),
        "pycni frozen macvlan": timed(lambda: run([str(DIST / "cni-bin" / "macvlan")], env)),
        "pycni from source": timed(lambda: run([sys.executable, "-m", "cni", "macvlan"], src_env)),
        "empty frozen program": timed(lambda: run([str(DIST / "empty-bundle" / "empty" / "empty")])),
        "python3.12 -I -c pass": timed(lambda: run([python, "-I", "-c", "pass"])),
    }


def cycle_times(plugin_dir: Path, tmp: Path) -> list[float]:
    tmp.mkdir(parents=True)
    topo = nsutil.Topology()
    try:
        conf = {"cniVersion": "1.0.0", "name": "bench", "plugins": [
            {"type": "macvlan", "master": topo.uplink,
             "ipam": {"type": "host-local", "dataDir": str(tmp / "ipam"),
                      "ranges": [[{"subnet": "198.51.100.0/24"}]]}}]}
        path = tmp / "bench.conflist"
        path.write_bytes(jsonio.dumps(conf))
        pod = topo.pod()
        env = {"CNI_PATH": f"{plugin_dir}:{GO_DIR}", "CNI_CACHE_DIR": str(tmp / "cache"),
               "PATH": os.environ["PATH"]}

        def one() -> None:
            for command in ("add", "del"):
                run(["ip", "netns", "exec", topo.host, str(bundle_driver.DRIVER), command, str(path), "c1",
                     pod, "net1"], env)

        return timed(one, max(10, RUNS // 2))
    finally:
        topo.close()


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
        tmp = Path(d)
        go_cycle = cycle_times(tmp / "none", tmp / "go")  # no pycni dir on CNI_PATH: Debian's macvlan
        py_cycle = cycle_times(DIST / "cni-bin", tmp / "py")
    print("\nADD+DEL cycle through libcni (macvlan + host-local), median [p95]:")
    print(f"  Go macvlan (Debian)      {fmt(go_cycle)}")
    print(f"  pycni frozen macvlan     {fmt(py_cycle)}")
    print(f"  ratio frozen/Go: {statistics.median(py_cycle) / statistics.median(go_cycle):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
