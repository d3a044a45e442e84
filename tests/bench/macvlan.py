"""`make bench`: ADD+DEL cycles through libcni for Debian's macvlan+host-local and pycni's macvlan+
host-local, alternating, with medians and the ratio; then the import profile of one pycni ADD and the
interpreter's bare start-up for context. A script, not a test: it prints numbers and asserts nothing.

    python -m tests.bench.macvlan [-n CYCLES]      (root; N also from BENCH_N; default 30)

The pycni side runs PYCNI_PLUGIN_DIR's `macvlan` when set (a frozen dist/cni-bin/), else the plugin
from source. The import profile always runs from source (-X importtime needs the interpreter)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cni import jsonio
from tests.bench import importprof
from tests.e2e import libcni
from tests.nsutil import Topology, is_root


def conflist(master: str, data_dir: str) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "bench", "plugins": [
        {"type": "macvlan", "master": master, "mode": "bridge",
         "ipam": {"type": "host-local", "dataDir": data_dir,
                  "ranges": [[{"subnet": "198.18.0.0/24", "gateway": "198.18.0.1"}]]}}]}


def one_cycle(driver: libcni.Driver, side: libcni.Side, path: Path, pod: str) -> dict[str, float]:
    """One ADD+DEL through `cnidriver cycle`: libcni's own timing of each call, plus the wall time of
    the driver process (ip netns exec + Go start-up + both calls)."""
    start = time.perf_counter()
    call = driver.run("cycle", path, side, netns=pod)
    wall = (time.perf_counter() - start) * 1000
    if not call.ok:
        raise SystemExit(f"{side.label}: cycle failed: {call.out!r} {call.stderr}")
    timing = jsonio.loads(bytes(call.out).splitlines()[-1])
    return {"add": timing["add_ms"], "del": timing["del_ms"], "cycle": timing["add_ms"] + timing["del_ms"],
            "wall": wall}


def wall_ms(cmd: Sequence[str], runs: int, env: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def bench_cycles(topo: Topology, scratch: Path, plugin_dir: Path, n: int) -> None:
    driver = libcni.Driver(libcni.ensure_driver(), topo.host, scratch / "cache")
    sides = (libcni.reference_side(), libcni.pycni_side(plugin_dir))
    pod = topo.pod()
    paths = {s.label: libcni.write_conflist(scratch, s.label, conflist(topo.uplink, str(scratch / s.label)))
             for s in sides}
    for side in sides:  # warm-up: page cache, .pyc files; not counted
        one_cycle(driver, side, paths[side.label], pod)
    samples: dict[str, list[dict[str, float]]] = {s.label: [] for s in sides}
    for i in range(n):
        for side in sides if i % 2 == 0 else sides[::-1]:
            samples[side.label].append(one_cycle(driver, side, paths[side.label], pod))
    med = {label: {k: statistics.median(x[k] for x in rows) for k in rows[0]}
           for label, rows in samples.items()}
    print(f"ADD+DEL cycles through libcni 1.1.2 (cnidriver cycle), N={n} per side, alternating order")
    print("  reference: Debian containernetworking-plugins 1.1.1 macvlan + host-local")
    print(f"  pycni:     {plugin_dir}/macvlan "
          f"({'PYCNI_PLUGIN_DIR' if os.environ.get('PYCNI_PLUGIN_DIR') else 'from source'}) + host-local")
    print(f"  {'median ms':<11}{'ADD':>9}{'DEL':>9}{'ADD+DEL':>9}{'wall':>9}   (wall: whole driver process)")
    for label, m in med.items():
        print(f"  {label:<11}{m['add']:>9.1f}{m['del']:>9.1f}{m['cycle']:>9.1f}{m['wall']:>9.1f}")
    ref, ours = med["reference"], med["pycni"]
    print(f"  ratio pycni/reference: ADD+DEL {ours['cycle'] / ref['cycle']:.1f}x  "
          f"(ADD {ours['add'] / ref['add']:.1f}x, DEL {ours['del'] / ref['del']:.1f}x, "
          f"wall {ours['wall'] / ref['wall']:.1f}x)")


def bench_context(plugin_dir: Path, runs: int = 20) -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"\nStart-up context (median of {runs} runs)")
    print(f"  {sys.executable} -I -c pass: {wall_ms([sys.executable, '-I', '-c', 'pass'], runs):.1f} ms"
          "  (the venv interpreter the source plugin runs on)")
    if base != sys.executable:
        bare = wall_ms([base, "-I", "-c", "pass"], runs)
        print(f"  {base} -I -c pass: {bare:.1f} ms  (no venv site-packages)")
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "")}
    print(f"  pycni macvlan VERSION: {wall_ms([str(plugin_dir / 'macvlan')], runs, env):.1f} ms")


def print_profile(label: str, prof: importprof.Profile, top: int) -> None:
    print(f"\nImport profile of one pycni {label}: python -I -X importtime, from source")
    print(f"  total import time: {prof.total_us / 1000:.1f} ms over {len(prof.entries)} modules")
    print("  top-level imports by cumulative time:")
    for e in prof.top_level()[:top]:
        print(f"    {e.cumulative_us / 1000:7.1f} ms  {e.name}")
    print(f"  top {top} modules by own time:")
    for e in prof.top_self(top):
        print(f"    {e.self_us / 1000:7.1f} ms  {e.name}  (imported by {prof.importer(e.name)})")
    mods = prof.matching("pyroute2")
    print(f"  pyroute2 modules loaded ({len(mods)}): {', '.join(mods) or 'none'}")
    executed = "pyroute2" in mods
    print(f"  pyroute2 package __init__ executed: {'YES (full package imported)' if executed else 'no'}")
    heavy = ", ".join(f"{h} (by {prof.importer(h)})" for h in prof.heavy_loaded())
    print(f"  notable stdlib packages loaded: {heavy or 'none'}")


def _median_run(profiles: list[importprof.Profile]) -> importprof.Profile:
    return sorted(profiles, key=lambda p: p.total_us)[len(profiles) // 2]


def bench_imports(topo: Topology, scratch: Path, top: int, rounds: int = 3) -> None:
    """`rounds` ADD+DEL pairs under -X importtime (plain CNI calls, no libcni); the median run is shown."""
    entry = libcni.source_plugin_dir(scratch / "src-bin") / "macvlan"
    pod = topo.pod("i")
    conf = {**conflist(topo.uplink, str(scratch / "profile"))["plugins"][0], "name": "bench",
            "cniVersion": "1.0.0"}
    env = {"CNI_CONTAINERID": "prof", "CNI_NETNS": pod, "CNI_IFNAME": "net1",
           "CNI_PATH": libcni.REFERENCE_DIR}
    runs: dict[str, list[importprof.Profile]] = {"ADD": [], "DEL": []}
    for _ in range(rounds):
        for command, profiles in runs.items():
            prof = importprof.profile_call(topo.host, entry, {**env, "CNI_COMMAND": command}, conf)
            if prof.rc:
                raise SystemExit(f"profiled {command} failed: {prof.stdout!r}")
            profiles.append(prof)
    add, delete = _median_run(runs["ADD"]), _median_run(runs["DEL"])
    print_profile(f"ADD (median of {rounds} runs by total)", add, top)
    print(f"\n  DEL (median of {rounds}): total import time {delete.total_us / 1000:.1f} ms over "
          f"{len(delete.entries)} modules, {len(delete.matching('pyroute2'))} pyroute2 modules, "
          f"pyroute2 __init__ executed: {'YES' if 'pyroute2' in delete.names() else 'no'}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--cycles", type=int, default=int(os.environ.get("BENCH_N", "30")))
    parser.add_argument("--top", type=int, default=15, help="import profile entries to show")
    args = parser.parse_args(argv)
    if not is_root():
        print("make bench needs root: it creates network namespaces and links", file=sys.stderr)
        return 1
    topo = Topology()
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-bench-") as tmp:
            scratch = Path(tmp)
            print("load average at start: {:.2f} {:.2f} {:.2f} (2 cores shared; high load inflates "
                  "both sides)".format(*os.getloadavg()))
            plugin_dir = libcni.pycni_plugin_dir(scratch / "cni-bin")
            bench_cycles(topo, scratch, plugin_dir, args.cycles)
            bench_context(plugin_dir)
            bench_imports(topo, scratch, args.top)
            print("\nload average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    finally:
        topo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
