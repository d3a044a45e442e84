"""`make bench-rail`: what the `rail` option (docs/multi-rail.md) costs an ADD. ADD+DEL cycles through
the libcni driver (`cnidriver cycle`: libcni's own timing of each call), sides in alternating order,
each with its own uplink, one pod namespace:

- Go:             Debian's macvlan + host-local
- Go+tuning+sbr:  the same with Debian's tuning (arp_ignore, arp_announce, rp_filter) and sbr chained,
                  the reference way to make an interface a rail
- pycni, pycni+rail:              the frozen bundle's macvlan + host-local, no agent, without and with
                                  `"rail": true`
- pycni+agent, pycni+agent+rail:  the same through the frozen `pycni-agent`

Every side uses Debian's host-local (a Go process per call) with a gateway. A figure is the median over
the cycles of one run; the script makes `--runs` runs (default 3) and prints each run's medians and
their median. Then the rail step alone, in this process (`cni.plugins.rail.apply` on a veth in a
namespace, dual stack with a gateway; and the DEL's `remove`): what the option adds to the plugin's own
work, without process start-up. A script, not a test.

    python -m tests.bench.rail [-n CYCLES] [--runs 3]     (root; needs `make bundle driver`)"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests import agentutil
from tests.bench.macvlan import one_cycle
from tests.bench.warm import BUNDLE, Side, alternate, cannot_run, environ
from tests.e2e import libcni
from tests.nsutil import Topology, sh


def conflist(master: str, data_dir: Path, *, rail: bool = False, chain: bool = False) -> dict[str, Any]:
    main: dict[str, Any] = {"type": "macvlan", "master": master, "mode": "bridge",
                            "ipam": {"type": "host-local", "dataDir": str(data_dir),
                                     "ranges": [[{"subnet": "198.18.0.0/24", "gateway": "198.18.0.1"}]]}}
    if rail:
        main["rail"] = True
    plugins = [main]
    if chain:
        plugins += [{"type": "tuning", "sysctl": {"net.ipv4.conf.net1.arp_ignore": "1",
                                                  "net.ipv4.conf.net1.arp_announce": "2",
                                                  "net.ipv4.conf.net1.rp_filter": "2"}},
                    {"type": "sbr"}]
    return {"cniVersion": "1.0.0", "name": "rail", "plugins": plugins}


def sides(topo: Topology, scratch: Path, fifo: Path) -> list[Side]:
    ours = f"{BUNDLE}:{libcni.REFERENCE_DIR}"
    off, on = {"PYCNI_AGENT": "off"}, {"PYCNI_AGENT_FIFO": str(fifo)}
    go = libcni.REFERENCE_DIR
    specs: list[tuple[str, str, dict[str, str | None], dict[str, bool]]] = [
        ("Go", go, {}, {}),
        ("Go+tuning+sbr", go, {}, {"chain": True}),
        ("pycni", ours, off, {}),
        ("pycni+rail", ours, off, {"rail": True}),
        ("pycni+agent", ours, on, {}),
        ("pycni+agent+rail", ours, on, {"rail": True}),
    ]
    out = []
    for n, (label, path, env, kw) in enumerate(specs):
        conf = conflist(topo.add_uplink(f"u{n}"), scratch / f"hl{n}", **kw)
        out.append(Side(label, path, env, conf, scratch))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--cycles", type=int, default=int(os.environ.get("BENCH_N", "20")))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    unready = cannot_run("make bench-rail")
    if unready:
        return unready
    topo = Topology()
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-rail-") as tmp, environ(PYCNI_PLUGIN_DIR=str(BUNDLE)):
            scratch = Path(tmp)
            agent = agentutil.Agent(scratch / "run" / "agent.fifo", scratch / "agent.log").start()
            try:
                print("load average at start: {:.2f} {:.2f} {:.2f} (2 cores shared)".format(*os.getloadavg()))
                driver = libcni.Driver(libcni.ensure_driver(), topo.host, scratch / "cache")
                all_sides = sides(topo, scratch, agent.fifo)
                pod = topo.pod("cy")
                runs: list[dict[str, dict[str, float]]] = []
                for run in range(args.runs):
                    cycles = alternate(all_sides, args.cycles,
                                       lambda s: one_cycle(driver, s.side, s.conflist, pod))
                    med = {label: {k: statistics.median(x[k] for x in rows) for k in ("add", "del")}
                           for label, rows in cycles.items()}
                    runs.append(med)
                    print(f"run {run + 1}: ADD median ms: "
                          + ", ".join(f"{k} {v['add']:.1f}" for k, v in med.items()))
                report(runs, args.cycles)
                step_cost(topo, args.runs)
                print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
            finally:
                agent.stop()
    finally:
        topo.close()
    return 0


def report(runs: list[dict[str, dict[str, float]]], cycles: int) -> None:
    final = {label: {k: statistics.median(r[label][k] for r in runs) for k in ("add", "del")}
             for label in runs[0]}
    go = final["Go"]["add"]
    print(f"\nADD and DEL through libcni (libcni's timing), median of {len(runs)} runs of {cycles} cycles")
    print(f"  {'side':<18}{'ADD ms':>8}{'DEL ms':>8}{'ADD/Go':>8}")
    for label, m in final.items():
        print(f"  {label:<18}{m['add']:>8.1f}{m['del']:>8.1f}{m['add'] / go:>8.2f}")
    for base in ("pycni", "pycni+agent"):
        extra = final[f"{base}+rail"]["add"] - final[base]["add"]
        print(f"  rail adds {extra:+.1f} ms to a {base} ADD")
    chain = final["Go+tuning+sbr"]["add"] - final["Go"]["add"]
    print(f"  tuning+sbr add {chain:+.1f} ms to a Go ADD; pycni+rail / Go+tuning+sbr: "
          f"{final['pycni+rail']['add'] / final['Go+tuning+sbr']['add']:.2f}x, "
          f"pycni+agent+rail / Go+tuning+sbr: "
          f"{final['pycni+agent+rail']['add'] / final['Go+tuning+sbr']['add']:.2f}x")


def step_cost(topo: Topology, runs: int, n: int = 50) -> None:
    """The rail step alone, in process: apply (sysctls, 6 routes, 2 rules) then remove, `n` times."""
    from cni import ifconfig, netns
    from cni.netlink import links
    from cni.netlink.socket import opened
    from cni.plugins import rail
    from cni.types.result import Interface, IPConfig, Result
    from cni.undo import Undo

    pod = topo.pod("st")
    ns = os.path.basename(pod)
    sh("ip", "-n", ns, "link", "add", "net1", "type", "veth", "peer", "name", "net1p")
    sh("ip", "-n", ns, "link", "set", "net1p", "up")
    fd = netns.open_netns(pod)
    try:
        with opened(fd) as nl:
            link = links.get(nl, "net1")
        assert link is not None
        result = Result(interfaces=(Interface("net1", link.mac, pod),), ips=(
            IPConfig(ipaddress.ip_interface("198.18.0.5/24"), ipaddress.ip_address("198.18.0.1"), 0),
            IPConfig(ipaddress.ip_interface("2001:db8:1::5/64"), ipaddress.ip_address("2001:db8:1::1"), 0)))
        ifconfig.configure(fd, link.index, result, dad="off", notify=False)
        conf = rail.RailConf(rail=True)
        medians: dict[str, list[float]] = {"apply": [], "remove": []}
        for _ in range(runs):
            took: dict[str, list[float]] = {"apply": [], "remove": []}
            for _ in range(n):
                start = time.perf_counter()
                with Undo() as undo:
                    rail.apply(fd, link.index, result, conf, "1.1.0", undo)
                    undo.commit()
                took["apply"].append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                rail.remove(pod, "net1", result)
                took["remove"].append((time.perf_counter() - start) * 1000)
            for k, v in took.items():
                medians[k].append(statistics.median(v))
        print(f"\nThe rail step alone, in process (median of {runs} runs of {n}): "
              f"apply {statistics.median(medians['apply']):.2f} ms (runs: "
              + ", ".join(f"{x:.2f}" for x in medians["apply"])
              + f"), remove {statistics.median(medians['remove']):.2f} ms (runs: "
              + ", ".join(f"{x:.2f}" for x in medians["remove"]) + ")")
    finally:
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
