"""Memory of one in-process plugin ADD, as it counts against a memory cgroup's limit (Multus thick runs
delegates inside multus-daemon's container: 50Mi in upstream's manifest). Not a test: prints figures.

Each ADD (macvlan + whereabouts IPAM on the Kubernetes store of a real kube-apiserver, ../shared/upstream
kube-up; a fresh pod netns, then its DEL outside the measurement) runs in a memory cgroup (v1) of its own;
measured: the cgroup's peak charge (memory.max_usage_in_bytes: every process of the call at once, e.g.
the PyInstaller bootloader and the interpreter it starts, or the plugin and the IPAM it execs, plus the
page cache the call is first to read) and the largest single process's peak RSS (ru_maxrss), and the
call's wall time. A first, unmeasured call of each side brings the binaries into the page cache (so the
figures are the steady state of a node where the files are cached, charged to whoever read them first).
Median of RUNS (3) per side, all sides in one run, interleaved.

Sides:
- pycni-agent: the frozen macvlan entry handing its call to a frozen pycni-agent (started by the bench,
  outside the cgroup): what a call costs the caller's cgroup with the agent up (the
  shim waits for the agent's answer);
- pycni-inproc: pycni's frozen macvlan (dist/cni-bin, `make bundle`), IPAM in-process (CNI_PATH is the
  bundle), no agent (PYCNI_AGENT_FIFO names a FIFO that does not exist: the agent down);
- pycni-exec: the same, whereabouts exec'd (CNI_PATH holds a `whereabouts` that execs the bundle's entry:
  not the bundle itself, so the plugin execs it as it would another vendor's IPAM);
- upstream: Debian's Go macvlan (/usr/lib/cni) + upstream whereabouts v0.9.4 (../shared/upstream).

    python -m tests.bench.call_memory [--runs 3] [--env KEY=VALUE ...]   (root)
`--env` is added to pycni's sides (e.g. MALLOC_ARENA_MAX=1) to try a setting."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests import kubeup
from tests.nsutil import REPO, RUN, delete_netns, is_root, sh

CGROUP = Path("/sys/fs/cgroup/memory")
SIDES = ("pycni-agent", "pycni-inproc", "pycni-exec", "upstream")
RANGE = "198.18.200.0/24"


def charge(cmd: list[str], env: dict[str, str], stdin: bytes, name: str) -> dict[str, Any]:
    """Run cmd in a fresh memory cgroup: its peak charge, its largest process's peak RSS, its CPU time
    (user + system, the call's processes; /usr/bin/time's resolution is 10 ms), the wall time."""
    group = CGROUP / name
    group.mkdir()
    try:
        # /usr/bin/time (outside the cgroup) starts a shell that joins the cgroup and execs the call (no
        # process left of it): the cgroup holds the call from its first byte, and time's %M is the peak RSS
        # of the call's largest process (file pages included: the libraries it maps, charged or not)
        fd, rss_path = tempfile.mkstemp(prefix=f"{name}-", suffix=".rss")
        os.close(fd)
        rss_file = Path(rss_path)
        enter = ["/usr/bin/time", "-f", "%M %U %S", "-o", str(rss_file),
                 "sh", "-c", 'echo $$ > "$0" && exec "$@"', str(group / "cgroup.procs")]
        t0 = time.perf_counter()
        proc = subprocess.run([*enter, *cmd], input=stdin, env=env, capture_output=True, check=False)
        wall = time.perf_counter() - t0
        rss, user, system = rss_file.read_text().split()[-3:]
        rss_file.unlink()
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd}: rc {proc.returncode}: {proc.stdout[-500:]!r} {proc.stderr[-1500:]!r}")
        return {"peak_mib": peak / 2**20, "maxrss_mib": int(rss) / 1024,
                "cpu_ms": (float(user) + float(system)) * 1000,
                "cache_mib": int(stat["cache"]) / 2**20, "wall_ms": wall * 1000}
    finally:
        group.rmdir()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="call_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for pycni's sides")
    ap.add_argument("--sides", default=",".join(SIDES))
    args = ap.parse_args(argv)
    if not is_root():
        print("call_memory: needs root", file=sys.stderr)
        return 2
    if reason := kubeup.absent():
        print(f"call_memory: {reason}", file=sys.stderr)
        return 2
    bundle = REPO / "dist" / "cni-bin"
    if not (bundle / "macvlan").exists():
        print("call_memory: no dist/cni-bin (make bundle)", file=sys.stderr)
        return 2
    sides = [s for s in SIDES if s in args.sides.split(",")]
    extra = dict(kv.split("=", 1) for kv in args.env)
    work = Path(tempfile.mkdtemp(prefix=f"{RUN}-mem-"))
    server = kubeup.KubeServer.start(work)
    master, pods = f"{RUN}mm", []  # the macvlan parent in the host's namespace (the apiserver is on its lo)
    try:
        sh("ip", "link", "add", master, "type", "veth", "peer", "name", master + "p")
        for link in (master, master + "p"):
            sh("ip", "link", "set", link, "up")
        tenant = kubeup.Tenant(server, work / "tenant")
        # the flat file both IPAMs read (upstream's requires one; admin: upstream's plugin takes a Lease,
        # which pycni's RBAC does not grant); pycni's node state (pool locks) under `local_db`, in the
        # run's directory
        flat = work / "whereabouts.conf"
        flat.write_text(json.dumps({"datastore": "kubernetes",
                                    "kubernetes": {"kubeconfig": str(tenant.admin_kubeconfig)}}))
        (work / "state").mkdir()
        up = kubeup.unpack("whereabouts")
        (work / "up").mkdir()
        shutil.copy2(up / "whereabouts", work / "up" / "whereabouts")
        (work / "exec").mkdir()
        wrapper = work / "exec" / "whereabouts"
        wrapper.write_text(f'#!/bin/sh\nexec {bundle / "whereabouts"} "$@"\n')
        wrapper.chmod(0o755)
        fifo = work / "agent" / "agent.fifo"
        fifo.parent.mkdir(mode=0o700)
        agent = subprocess.Popen([str(bundle / "pycni-agent"), "--fifo", str(fifo), "--metrics", "off"],
                                 stdout=subprocess.DEVNULL,
                                 stderr=open(work / "agent.log", "wb"))  # noqa: SIM115 (closed with work)
        deadline = time.monotonic() + 60
        while not fifo.exists():
            if time.monotonic() > deadline or agent.poll() is not None:
                raise RuntimeError(f"pycni-agent did not start: {(work / 'agent.log').read_text()[-800:]}")
            time.sleep(0.1)
        plugin = {side: str(bundle / "macvlan") for side in SIDES} | {"upstream": "/usr/lib/cni/macvlan"}
        path = {side: str(bundle) for side in SIDES} | {"pycni-exec": f"{work / 'exec'}:{bundle}",
                                                        "upstream": str(work / "up")}
        base = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_"))}
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        for run in range(args.runs + 1):  # run 0: the warm-up, not counted
            for side in sides:
                conf = {"cniVersion": "0.3.1", "name": f"mem-{side}", "type": "macvlan",
                        "master": master, "mode": "bridge",
                        "ipam": {"type": "whereabouts", "range": RANGE, "configuration_path": str(flat),
                                 "local_db": str(work / "state" / "whereabouts.db")}}
                pods.append(f"{RUN}m{sides.index(side)}{run}")
                sh("ip", "netns", "add", pods[-1])
                netns = f"/run/netns/{pods[-1]}"
                env = {**base, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"{RUN}{side}{run}",
                       "CNI_NETNS": netns, "CNI_IFNAME": "net1", "CNI_PATH": path[side],
                       "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE={tenant.namespace};"
                                   f"K8S_POD_NAME=p-{side}-{run}",
                       "PYCNI_AGENT_FIFO": str(fifo if side == "pycni-agent" else work / "no-agent.fifo")}
                if side.startswith("pycni"):
                    env |= extra
                cmd = [plugin[side]]
                got = charge(cmd, env, json.dumps(conf).encode(), f"{RUN}-mem-{side}-{run}")
                if run:
                    results[side].append(got)
                proc = subprocess.run(cmd, input=json.dumps(conf).encode(), env={**env, "CNI_COMMAND": "DEL"},
                                      capture_output=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"DEL {side}: {proc.stdout!r} {proc.stderr[-800:]!r}")
        print(f"| side | peak charge MiB | largest process RSS MiB | page cache MiB | CPU ms | ADD ms |  "
              f"(median of {args.runs}; {' '.join(args.env) or 'no extra env'})")
        print("|---|---|---|---|---|---|")
        for side in sides:
            med = {k: statistics.median(r[k] for r in results[side]) for k in results[side][0]}
            print(f"| {side} | {med['peak_mib']:.1f} | {med['maxrss_mib']:.1f} | {med['cache_mib']:.1f} | "
                  f"{med['cpu_ms']:.0f} | {med['wall_ms']:.0f} |")
        print(json.dumps(results), file=sys.stderr)
        agent.terminate()
        agent.wait(60)
    finally:
        for name in pods:
            delete_netns(name)
        sh("ip", "link", "del", master, check=False)
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
