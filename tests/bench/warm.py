"""`make bench-warm`: what the node-local agent buys. Five sides through the libcni driver, each with its
own uplink and pod namespace, in alternating order:

- Go:          Debian's macvlan + host-local (/usr/lib/cni)
- pycni:       the frozen bundle's macvlan + Debian's host-local, no agent (PYCNI_AGENT=off)
- pycni+agent: the same entries with the frozen `pycni-agent` serving them
- the same two with pycni's whereabouts (SQLite local store, in-process) instead of host-local (/wb)

Two workloads: an ADD+DEL cycle (libcni's own timing of each call, `cnidriver cycle`), and a pod with
16 attachments: 16 sequential `cnidriver add` processes into one pod (wall time, driver start-up
included for every side), then 16 DELs (not timed). Targets (issue 6): agent <= 3x Go per cycle,
standalone <= 8x. A script, not a test: it prints medians and ratios from one run.

    python -m tests.bench.warm [-n CYCLES] [--pods N]     (root; needs `make bundle driver`)"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests import agentutil
from tests.bench.macvlan import one_cycle
from tests.e2e import libcni
from tests.nsutil import REPO, Topology, is_root

BUNDLE = REPO / "dist" / "cni-bin"
ATTACHMENTS = 16
TARGETS = {"pycni": 8.0, "pycni+agent": 3.0}  # by label prefix (before "/")


@contextmanager
def environ(**changes: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for k, v in changes.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Side:
    def __init__(self, label: str, cni_path: str, env: dict[str, str | None], conf: dict[str, Any],
                 scratch: Path) -> None:
        self.label, self.env, self.scratch = label, env, scratch
        self.side = libcni.Side(label, cni_path)
        self.conflist = libcni.write_conflist(scratch, label.replace("+", "-").replace("/", "-"), conf)


def conflist(master: str, ipam: dict[str, Any]) -> dict[str, Any]:
    return {"cniVersion": "1.0.0", "name": "warm", "plugins": [
        {"type": "macvlan", "master": master, "mode": "bridge", "ipam": ipam}]}


def sides(topo: Topology, scratch: Path, agent_fifo: Path) -> list[Side]:
    """Go, then pycni standalone and through the agent with the same IPAM (Debian's host-local, a Go
    process exec'd per call), then the same two with our whereabouts (SQLite store, in-process)."""
    (scratch / "flat.conf").write_text("{}")

    def host_local(name: str) -> dict[str, Any]:
        return {"type": "host-local", "dataDir": str(scratch / name),
                "ranges": [[{"subnet": "198.18.0.0/24", "gateway": "198.18.0.1"}]]}

    def whereabouts(name: str) -> dict[str, Any]:
        return {"type": "whereabouts", "range": "198.18.1.0/24", "datastore": "local",
                "local_db": str(scratch / f"{name}.db"), "configuration_path": str(scratch / "flat.conf")}

    ours = f"{BUNDLE}:{libcni.REFERENCE_DIR}"
    off, on = {"PYCNI_AGENT": "off"}, {"PYCNI_AGENT_FIFO": str(agent_fifo)}
    return [
        Side("Go", libcni.REFERENCE_DIR, {}, conflist(topo.add_uplink("g"), host_local("go")), scratch),
        Side("pycni", ours, off, conflist(topo.add_uplink("s"), host_local("st")), scratch),
        Side("pycni+agent", ours, on, conflist(topo.add_uplink("a"), host_local("ag")), scratch),
        Side("pycni/wb", ours, off, conflist(topo.add_uplink("sw"), whereabouts("st")), scratch),
        Side("pycni+agent/wb", ours, on, conflist(topo.add_uplink("aw"), whereabouts("ag")), scratch),
    ]


def alternate(items: list[Side], rounds: int, fn: Callable[[Side], Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {s.label: [] for s in items}
    for s in items:  # warm-up: page cache, the agent's first requests; not counted
        with environ(**s.env):
            fn(s)
    for i in range(rounds):
        for s in items if i % 2 == 0 else items[::-1]:
            with environ(**s.env):
                out[s.label].append(fn(s))
    return out


def pod16(driver: libcni.Driver, topo: Topology) -> Callable[[Side], float]:
    count = itertools.count()

    def run(s: Side) -> float:
        pod = topo.pod(f"q{next(count)}")
        start = time.perf_counter()
        for i in range(ATTACHMENTS):
            call = driver.run("add", s.conflist, s.side, netns=pod, ifname=f"net{i}", container_id="pod16")
            if not call.ok:
                raise SystemExit(f"{s.label}: ADD net{i} failed: {call.out!r} {call.stderr}")
        wall = (time.perf_counter() - start) * 1000
        for i in range(ATTACHMENTS):
            call = driver.run("del", s.conflist, s.side, netns=pod, ifname=f"net{i}", container_id="pod16")
            if not call.ok:
                raise SystemExit(f"{s.label}: DEL net{i} failed: {call.out!r} {call.stderr}")
        return wall

    return run


def process_floor(agent_fifo: Path) -> None:
    """One process per call, nothing else: where the per-call floor is (tests.bench.bundle's timer)."""
    from tests.bench.bundle import DIST, fmt, run, timed

    python = os.path.realpath(sys.executable)
    version = {"CNI_COMMAND": "VERSION", "PATH": os.environ["PATH"]}
    cmds: dict[str, Callable[[], object]] = {
        "Go macvlan VERSION": lambda: run([f"{libcni.REFERENCE_DIR}/macvlan"], version),
        "pycni VERSION, in-process": lambda: run([str(BUNDLE / "macvlan")],
                                                 {**version, "PYCNI_AGENT": "off"}),
        "pycni VERSION, via agent": lambda: run([str(BUNDLE / "macvlan")],
                                                {**version, "PYCNI_AGENT_FIFO": str(agent_fifo)}),
        "python3.12 -I -c pass": lambda: run([python, "-I", "-c", "pass"]),
    }
    empty = DIST / "empty-bundle" / "empty" / "empty"
    if empty.exists():
        cmds["empty frozen program"] = lambda: run([str(empty)])
    print("\nOne process per call, median [p95] (new process each time):")
    for name, xs in timed(cmds).items():
        print(f"  {name:28s} {fmt(xs)}")


def report(title: str, med: dict[str, float], unit_note: str) -> None:
    print(f"\n{title}")
    go = med["Go"]
    for label, value in med.items():
        ratio = value / go
        target = TARGETS.get(label.split("/")[0])
        met = "met" if target is not None and ratio <= target else "MISSED"
        verdict = "" if target is None else f"  (target <= {target:.0f}x: {met})"
        print(f"  {label:<12} {value:8.1f} ms  {ratio:5.1f}x Go{verdict}")
    print(f"  {unit_note}")


def cannot_run(target: str) -> int:
    """The exit code when `target` cannot run here (not root: 1; no frozen macvlan and agent: 2), said on
    stderr; 0 when it can."""
    if not is_root():
        print(f"{target} needs root: it creates network namespaces and links", file=sys.stderr)
        return 1
    for need in (BUNDLE / "macvlan", BUNDLE / "pycni-agent"):
        if not need.exists():
            print(f"missing {need}: run `make bundle`", file=sys.stderr)
            return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--cycles", type=int, default=int(os.environ.get("BENCH_N", "20")))
    ap.add_argument("--pods", type=int, default=5, help="16-attachment pods per side")
    args = ap.parse_args(argv)
    unready = cannot_run("make bench-warm")
    if unready:
        return unready
    topo = Topology()
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-warm-") as tmp, \
                environ(PYCNI_PLUGIN_DIR=str(BUNDLE)):
            scratch = Path(tmp)
            agent = agentutil.Agent(scratch / "run" / "agent.fifo", scratch / "agent.log").start()
            try:
                print("load average at start: {:.2f} {:.2f} {:.2f} (2 cores shared)".format(
                    *os.getloadavg()))
                driver = libcni.Driver(libcni.ensure_driver(), topo.host, scratch / "cache")
                all_sides = sides(topo, scratch, agent.fifo)
                pod = topo.pod("cy")
                cycles = alternate(all_sides, args.cycles,
                                   lambda s: one_cycle(driver, s.side, s.conflist, pod))
                med = {k: statistics.median(x["cycle"] for x in rows) for k, rows in cycles.items()}
                report(f"ADD+DEL cycle through libcni, median of {args.cycles} "
                       "(libcni's timing of both calls)",
                       med, "macvlan + host-local (Debian's, a Go process per call) on every side; /wb: "
                       "pycni's whereabouts (SQLite, in-process) instead; pycni = the frozen bundle")
                walls = {k: statistics.median(x["wall"] for x in rows) for k, rows in cycles.items()}
                print("  whole driver process (ip netns exec + Go start-up + both calls): "
                      + ", ".join(f"{k} {v:.1f} ms" for k, v in walls.items()))
                pods = alternate(all_sides, args.pods, pod16(driver, topo))
                report(f"Pod with {ATTACHMENTS} attachments: {ATTACHMENTS} sequential ADDs, "
                       f"median of {args.pods} pods",
                       {k: statistics.median(v) for k, v in pods.items()},
                       "wall time of 16 `cnidriver add` processes (driver start-up included on every side)")
                process_floor(agent.fifo)
                served = agent.served("macvlan")
                expected = 2 * (2 * (args.cycles + 1) + 2 * ATTACHMENTS * (args.pods + 1)) + 31  # + VERSIONs
                print(f"\nagent served {len(served)} macvlan calls "
                      f"(expected {expected} if none fell back in-process)")
                for command in ("ADD", "DEL"):
                    lines = agent.served(f"macvlan {command} rc=0")
                    ms = [float(x.rsplit(" in ", 1)[1].split()[0]) for x in lines]
                    med_ms = statistics.median(ms)
                    print(f"  inside the agent, {command}: median {med_ms:.1f} ms (n={len(ms)})")
                print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
            finally:
                agent.stop()
    finally:
        topo.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
