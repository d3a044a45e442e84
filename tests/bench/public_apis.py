"""Frozen bundles compared on the plugin path (issue 27: private CPython modules -> public APIs; json
vs orjson). A script, not a test: it prints numbers and asserts nothing.

    python -m tests.bench.public_apis NAME=DIST [NAME=DIST ...] [-n RUNS] [--etcd] [--importtime]

Each DIST is a `make bundle` output directory (holding cni-bin/). Round-robin over the bundles (one run
of each per round, so a change in the shared machine's load hits all alike), a new process per call,
`PYCNI_AGENT=off` (the plugin path without the node agent), medians (p90 in brackets) of the wall time
and of the CPU time the call's processes used (steadier than wall time on a loaded machine):
- whereabouts ADD then DEL on the local store (the IPAM alone, as a runtime would exec it);
- macvlan ADD then DEL with whereabouts on the local store, in-process (root: namespaces);
- with --etcd: whereabouts ADD then DEL on an etcd store over TLS with a client certificate (a real
  etcd on 127.0.0.1; the TLS path: socket and ssl).
--importtime: the DISTs were built with PYCNI_IMPORTTIME=1; one whereabouts ADD of each (local store and,
with --etcd, etcd) is profiled instead, and the cumulative import time of the modules that differ
between the bundles is printed (medians over the runs)."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cni import jsonio
from tests import etcdutil
from tests.bench import importprof
from tests.nsutil import Topology

WATCH = ("json", "orjson", "_json", "ssl", "_ssl", "socket", "_socket", "selectors", "signal", "enum", "re",
         "dataclasses", "uuid", "datetime", "collections")


def env(command: str, i: int, path: str, netns: str = "/run/netns/none") -> dict[str, str]:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": f"bench{i:059x}", "CNI_NETNS": netns,
            "CNI_IFNAME": "net1", "CNI_PATH": path, "PYCNI_AGENT": "off", "PATH": os.environ["PATH"],
            "CNI_ARGS": f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i};K8S_POD_UID=uid-{i}"}


def local_ipam(state: Path) -> dict[str, Any]:
    state.mkdir(parents=True, exist_ok=True)
    (state / "whereabouts.conf").write_text("{}")
    return {"type": "whereabouts", "range": "198.18.0.0/16", "local_db": str(state / "w.db"),
            "configuration_path": str(state / "whereabouts.conf")}


def call(cmd: list[str], conf: dict[str, Any], e: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(cmd, input=jsonio.dumps(conf), env=e, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} {e['CNI_COMMAND']}: rc {proc.returncode}: {proc.stdout[:300]!r} "
                         f"{proc.stderr[-600:]!r}")
    return proc


def cycle(cmd: list[str], conf: dict[str, Any], path: str,
          netns: str = "/run/netns/none") -> Callable[[], None]:
    counter = iter(range(10**9))

    def one() -> None:
        i = next(counter)
        for command in ("ADD", "DEL"):
            call(cmd, conf, env(command, i, path, netns))

    return one


def timed(fns: dict[str, Callable[[], None]], runs: int) -> dict[str, tuple[list[float], list[float]]]:
    """Per candidate: wall times and CPU times (user + system of the processes it ran), in ms."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in fns}
    for fn in fns.values():
        fn()  # page cache warm
    for _ in range(runs):
        for name, fn in fns.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            fn()
            out[name][0].append((time.perf_counter() - t) * 1000)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            out[name][1].append(cpu * 1000)
    return out


def fmt(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{statistics.median(s):7.1f} ms [{s[int(len(s) * 0.9) - 1]:6.1f}]"


def report(title: str, fns: dict[str, Callable[[], None]], runs: int) -> None:
    print(f"\n{title} ({runs} rounds; median [p90] of wall time, then of CPU time):")
    for name, (wall, cpu) in timed(fns, runs).items():
        print(f"  {name:20s} wall {fmt(wall)}   cpu {fmt(cpu)}")


def profile(cmd: list[str], conf: dict[str, Any], path: str, runs: int) -> dict[str, float]:
    """Median cumulative import time (ms) of the WATCH modules and of everything, over `runs` ADDs."""
    seen: dict[str, list[float]] = {}
    for i in range(runs):
        proc = call(cmd, conf, env("ADD", 10**6 + i, path))
        call(cmd, conf, env("DEL", 10**6 + i, path))
        prof = importprof.Profile.parse(proc.stderr.decode(errors="replace"))
        top = {e.name: e.cumulative_us / 1000 for e in prof.entries}
        top["(all imports)"] = sum(e.self_us for e in prof.entries) / 1000
        for name in (*WATCH, "(all imports)"):
            seen.setdefault(name, []).append(top.get(name, 0.0))
    return {name: statistics.median(xs) for name, xs in seen.items()}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dists", nargs="+", help="NAME=DIST")
    ap.add_argument("-n", type=int, default=int(os.environ.get("BENCH_RUNS", "20")))
    ap.add_argument("--etcd", action="store_true")
    ap.add_argument("--importtime", action="store_true")
    args = ap.parse_args(argv)
    dists = {name: Path(d) / "cni-bin" for name, d in (item.split("=", 1) for item in args.dists)}
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as tmp:
        etcd = None
        if args.etcd:
            certs = etcdutil.make_certs(Path(tmp) / "certs")
            (Path(tmp) / "etcd").mkdir()
            etcd = etcdutil.Etcd(Path(tmp) / "etcd", certs=certs)
            etcd.start()
        try:
            return run(dists, Path(tmp), args, etcd)
        finally:
            if etcd is not None:
                etcd.stop()


def run(dists: dict[str, Path], tmp: Path, args: argparse.Namespace, etcd: etcdutil.Etcd | None) -> int:
    base = {"cniVersion": "1.0.0", "name": "bench", "type": "macvlan"}
    wb: dict[str, Callable[[], None]] = {}
    tls: dict[str, Callable[[], None]] = {}
    for name, d in dists.items():
        conf = {**base, "ipam": local_ipam(tmp / name)}
        wb[name] = cycle([str(d / "whereabouts")], conf, str(d))
        if etcd is not None:
            ipam = {**local_ipam(tmp / f"{name}-etcd"), "datastore": "etcd", **etcd.ipam()}
            del ipam["local_db"]
            ipam["etcd_key_prefix"] = f"/bench-{name}"
            tls[name] = cycle([str(d / "whereabouts")], {**base, "ipam": ipam}, str(d))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores shared)")
    if args.importtime:
        for label, fns in (("whereabouts ADD, local store", wb), ("whereabouts ADD, etcd over TLS", tls)):
            if not fns:
                continue
            print(f"\n{label}: cumulative import ms (median of {args.n})")
            profs = {}
            for name, d in dists.items():
                conf = {**base, "ipam": local_ipam(tmp / name)} if "local" in label else None
                if conf is None:
                    assert etcd is not None
                    ipam = {**local_ipam(tmp / f"{name}-etcd"), "datastore": "etcd", **etcd.ipam(),
                            "etcd_key_prefix": f"/bench-{name}"}
                    del ipam["local_db"]
                    conf = {**base, "ipam": ipam}
                profs[name] = profile([str(d / "whereabouts")], conf, str(d), args.n)
            print(f"  {'module':16s}" + "".join(f"{n:>14s}" for n in profs))
            for module in (*WATCH, "(all imports)"):
                values = [p[module] for p in profs.values()]
                if any(values):
                    print(f"  {module:16s}" + "".join(f"{v:14.1f}" for v in values))
        return 0
    report("whereabouts ADD+DEL, local store", wb, args.n)
    if tls:
        report("whereabouts ADD+DEL, etcd over TLS", tls, args.n)
    topo = Topology()
    try:
        mv: dict[str, Callable[[], None]] = {}
        for i, (name, d) in enumerate(dists.items()):
            master = topo.add_uplink(f"m{i}")
            pod = topo.pod(f"q{i}")
            conf = {**base, "master": master, "ipam": local_ipam(tmp / f"{name}-mv")}
            mv[name] = cycle(["ip", "netns", "exec", topo.host, str(d / "macvlan")], conf, str(d), pod)
        report("macvlan ADD+DEL, whereabouts local store in-process", mv, args.n)
    finally:
        topo.close()
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
