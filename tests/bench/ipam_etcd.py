"""Benchmark of the IPAM on the etcd store (a real etcd, data dir on disk, as deployed). Not a test:
prints the same figures as tests/bench/ipam_local.py:

  1. 200 concurrent ADDs, each its own process, on one pool: allocations/s over the wall time, and
     p50/p99 of the time inside the plugin (skel.run) and of the whole process (spawn to exit).
  2. One ADD into a pool that already holds 60,000 allocations (IPv4 /15).
  3. One ADD into a /64 that already holds 100,000 allocations.
etcd runs with --max-request-bytes 64 MiB: a pool is one object, ~170 bytes per allocation.
Usage: python -m tests.bench.ipam_etcd [--procs 200] [--tmpfs]"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from cni import jsonio, skel
from ipam.config import store_config
from ipam.store.base import Allocation, Pool, PoolUpdate
from ipam.store.etcd import open_store
from tests.bench.ipam_local import env, pct
from tests.etcdutil import Etcd, running
from tests.nsutil import REPO


def conf(etcd: Etcd, state: Path, **ipam: Any) -> dict[str, Any]:
    flat = state / "whereabouts.conf"
    flat.write_text("{}")
    return {
        "cniVersion": "1.1.0",
        "name": "bench",
        "type": "macvlan",
        "ipam": {
            "type": "whereabouts",
            **etcd.ipam(),
            "local_db": str(state / "ipam.db"),
            "configuration_path": str(flat),
            **ipam,
        },
    }


def worker(c: dict[str, Any], i: int) -> tuple[subprocess.CompletedProcess[bytes], float]:
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tests.bench.ipam_worker"],
        input=jsonio.dumps(c),
        capture_output=True,
        env={**os.environ, **env(i), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        check=False,
    )
    return proc, time.perf_counter() - t


def concurrent_adds(etcd: Etcd, n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        c = conf(etcd, Path(d), range="198.18.0.0/16", network_name=f"conc{n}")
        inside, whole = [0.0] * n, [0.0] * n
        failures: list[str] = []

        def one(i: int) -> None:
            proc, whole[i] = worker(c, i)
            if proc.returncode != 0:
                failures.append(proc.stdout.decode()[:200])
            inside[i] = float(proc.stderr.decode().rsplit("ELAPSED ", 1)[1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        store = open_store(store_config(c["ipam"]))
        pool = store.get_pool(f"conc{n}-198.18.0.0-16")
        store.close()
        held = len(pool.allocations) if pool else 0
        print(
            f"{n} concurrent ADDs (one process each): {wall:.2f} s wall, {n / wall:.1f} allocations/s, "
            f"{held} allocated, {len(failures)} failed"
        )
        print(
            f"  in plugin (skel.run): p50 {1000 * pct(inside, 50):.1f} ms, "
            f"p99 {1000 * pct(inside, 99):.1f} ms, max {1000 * max(inside):.1f} ms"
        )
        print(
            f"  whole process:        p50 {1000 * pct(whole, 50):.1f} ms, p99 {1000 * pct(whole, 99):.1f} ms"
        )
        for f in failures[:3]:
            print("  failure:", f)


def sequential(etcd: Etcd, n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        data = jsonio.dumps(conf(etcd, Path(d), range="198.18.0.0/16", network_name="seq"))
        times = []
        for i in range(n):
            t = time.perf_counter()
            rc = skel.run("whereabouts", env(i), io.BytesIO(data), io.BytesIO())
            times.append(time.perf_counter() - t)
            assert rc == 0
        print(
            f"{n} sequential ADDs in one process: {n / sum(times):.0f} allocations/s, "
            f"p50 {1000 * pct(times, 50):.1f} ms, p99 {1000 * pct(times, 99):.1f} ms"
        )


def one_add(etcd: Etcd, label: str, rng: str, name: str, count: int, runs: int = 5) -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        c = conf(etcd, Path(d), range=rng)
        store = open_store(store_config(c["ipam"]))
        put = {
            str(o): Allocation(f"{o:064x}", f"bench/pre-{o}", "net1", f"uid-pre-{o}", "bench", "bench-node")
            for o in range(1, count + 1)
        }
        t = time.perf_counter()
        store.commit_pool(Pool(name, rng), PoolUpdate(put=put))
        fill = time.perf_counter() - t
        store.close()
        times = []
        for i in range(runs):
            out = io.BytesIO()
            t = time.perf_counter()
            rc = skel.run("whereabouts", env(10**6 + i), io.BytesIO(jsonio.dumps(c)), out)
            times.append(time.perf_counter() - t)
            assert rc == 0, out.getvalue()
        got = jsonio.loads(out.getvalue())["ips"][0]["address"]
        proc, proc_wall = worker(c, 2 * 10**6)
        assert proc.returncode == 0, proc.stdout
        size = len(next(iter(etcd.keys(f"/pycni/whereabouts/ippools/{name}".encode()).values())))
        print(
            f"{label}: one ADD takes {1000 * statistics.median(times):.1f} ms in plugin "
            f"(median of {runs}; min {1000 * min(times):.1f}), {1000 * proc_wall:.0f} ms as a process; "
            f"last address {got}; object {size / 2**20:.1f} MiB; prefill of {count} took {fill:.1f} s"
        )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=200)
    p.add_argument("--tmpfs", action="store_true", help="etcd's data dir on tmpfs instead of disk")
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    with running(on_disk=not args.tmpfs) as etcd:
        print(f"etcd {etcd.url}, data dir {etcd.data_dir}")
        concurrent_adds(etcd, args.procs)
        sequential(etcd, args.procs)
        one_add(
            etcd, "pool with 60,000 allocations (198.18.0.0/15)", "198.18.0.0/15", "198.18.0.0-15", 60_000
        )
        one_add(
            etcd,
            "/64 with 100,000 allocations (2001:db8:64::/64)",
            "2001:db8:64::/64",
            "2001-db8-64---64",
            100_000,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
