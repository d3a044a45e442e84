"""Benchmark of the IPAM per store. Not a test: prints figures.

  1. 200 concurrent ADDs, each its own process, on one pool: allocations/s over the wall time, and
     p50/p99 of the time inside the plugin (skel.run) and of the whole process (spawn to exit).
  2. One ADD into a pool that already holds 60,000 allocations (IPv4 /15).
  3. One ADD into a /64 that already holds 100,000 allocations.
Stores (--store, default all): local (SQLite), kubernetes (the CRDs through the in-process API
emulator of tests/kubeapi over loopback HTTP: the client, serialisation and compare-and-swap costs of
the store, not a real API server's etcd latency), etcd (a real etcd, tests/etcdutil.py).
Usage: python -m tests.bench.ipam [--procs 200] [--store local|kubernetes|etcd]"""

from __future__ import annotations

import argparse
import io
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cni import jsonio, skel
from ipam.model import Allocation, Pool, PoolUpdate
from ipam.store.base import Store
from ipam.store.local import LocalStore
from tests.nsutil import REPO


class LocalBench:
    """The local store: one SQLite file per run directory."""

    def ipam(self, state: Path) -> dict[str, Any]:
        return {"datastore": "local", "local_db": str(state / "ipam.db")}

    def open(self, state: Path) -> Store:
        return LocalStore(str(state / "ipam.db"))

    def prefill(self, state: Path, name: str, rng: str, put: dict[str, Allocation]) -> None:
        db = str(state / "ipam.db")
        store = LocalStore(db)
        store.commit_pool(Pool(name, rng), PoolUpdate(put=put))
        store.close()
        conn = sqlite3.connect(db)  # steady state: the prefill's write-ahead log folded into the database
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()

    def close(self) -> None:
        pass


class KubeBench:
    """The Kubernetes store through the API emulator (one per run directory), node token."""

    def __init__(self) -> None:
        from tests.kubeapi.emulator import Emulator

        self.emus: dict[Path, Any] = {}
        self.factory = Emulator

    def _kubeconfig(self, state: Path) -> Path:
        if state not in self.emus:
            self.emus[state] = self.factory()
            self.emus[state].kubeconfig(state / "node.kubeconfig", token="node-token")
        return state / "node.kubeconfig"

    def ipam(self, state: Path) -> dict[str, Any]:
        return {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(self._kubeconfig(state))}}

    def open(self, state: Path) -> Store:
        from tests.kubeapi.factory import open_kube

        return open_kube(self._kubeconfig(state), page=100)

    def prefill(self, state: Path, name: str, rng: str, put: dict[str, Allocation]) -> None:
        store = self.open(state)
        store.commit_pool(Pool(name, rng), PoolUpdate(put=put))
        store.close()

    def close(self) -> None:
        for emu in self.emus.values():
            emu.stop()
        self.emus.clear()


class EtcdBench:
    """A real etcd (data dir on disk, as deployed) per run directory; --max-request-bytes 64 MiB, as a
    pool is one object of ~170 bytes per allocation."""

    def __init__(self) -> None:
        self.running: dict[Path, tuple[Any, Any]] = {}

    def _etcd(self, state: Path) -> Any:
        if state not in self.running:
            from tests.etcdutil import running

            ctx = running(on_disk=True)
            self.running[state] = (ctx, ctx.__enter__())
        return self.running[state][1]

    def ipam(self, state: Path) -> dict[str, Any]:
        return {**self._etcd(state).ipam(), "local_db": str(state / "ipam.db")}

    def open(self, state: Path) -> Store:
        from ipam.config import store_config
        from ipam.store.etcd import open_store

        return open_store(store_config(self.ipam(state)))

    def prefill(self, state: Path, name: str, rng: str, put: dict[str, Allocation]) -> None:
        store = self.open(state)
        store.commit_pool(Pool(name, rng), PoolUpdate(put=put))
        store.close()

    def close(self) -> None:
        for ctx, _ in self.running.values():
            ctx.__exit__(None, None, None)
        self.running.clear()


BACKENDS: dict[str, Callable[[], Any]] = {"local": LocalBench, "kubernetes": KubeBench, "etcd": EtcdBench}
backend: Any = LocalBench()


def conf(state: Path, **ipam: Any) -> dict[str, Any]:
    flat = state / "whereabouts.conf"
    flat.write_text("{}")
    return {
        "cniVersion": "1.1.0",
        "name": "bench",
        "type": "macvlan",
        "ipam": {"type": "whereabouts", "configuration_path": str(flat), **backend.ipam(state), **ipam},
    }


def env(i: int) -> dict[str, str]:
    return {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": f"{i:064x}",
        "CNI_NETNS": "/run/netns/bench",
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/usr/lib/cni",
        "NODENAME": "bench-node",
        "CNI_ARGS": f"K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i};K8S_POD_UID=uid-{i}",
    }


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def concurrent_adds(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        c = conf(Path(d), range="198.18.0.0/16")
        data = jsonio.dumps(c)
        inside: list[float] = [0.0] * n
        whole: list[float] = [0.0] * n
        failures: list[str] = []

        def one(i: int) -> None:
            t = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "tests.bench.ipam_worker"],
                input=data,
                capture_output=True,
                env={**os.environ, **env(i), "PYTHONPATH": str(REPO)},
                cwd=REPO,
                check=False,
            )
            whole[i] = time.perf_counter() - t
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
        store = backend.open(Path(d))
        pool = store.get_pool("198.18.0.0-16")
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


def prefill(state: Path, name: str, rng: str, count: int) -> None:
    put = {
        str(o): Allocation(f"{o:064x}", f"bench/pre-{o}", "net1", f"uid-pre-{o}", "bench", "bench-node")
        for o in range(1, count + 1)
    }
    backend.prefill(state, name, rng, put)


def one_add(label: str, rng: str, name: str, count: int, runs: int = 5) -> None:
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        c = conf(Path(d), range=rng)
        t = time.perf_counter()
        prefill(Path(d), name, rng, count)
        fill = time.perf_counter() - t
        times = []
        for i in range(runs + 1):
            out = io.BytesIO()
            t = time.perf_counter()
            rc = skel.run("whereabouts", env(10**6 + i), io.BytesIO(jsonio.dumps(c)), out)
            times.append(time.perf_counter() - t)
            assert rc == 0, out.getvalue()
        first = times.pop(0)  # the first ADD also writes the search hint (one scan of the pool)
        got = jsonio.loads(out.getvalue())["ips"][0]["address"]
        proc_t = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "tests.bench.ipam_worker"],
            input=jsonio.dumps(c),
            capture_output=True,
            env={**os.environ, **env(2 * 10**6), "PYTHONPATH": str(REPO)},
            cwd=REPO,
            check=False,
        )
        proc_wall = time.perf_counter() - proc_t
        assert proc.returncode == 0, proc.stdout
        print(
            f"{label}: one ADD takes {1000 * statistics.median(times):.1f} ms in plugin "
            f"(median of {runs}; min {1000 * min(times):.1f}), {1000 * proc_wall:.0f} ms as a process; "
            f"first ADD {1000 * first:.1f} ms; last address {got}; prefill of {count} took {fill:.1f} s"
        )


def sequential(n: int) -> None:
    """The store and engine without interpreter start-up: n ADDs one after another in this process."""
    with tempfile.TemporaryDirectory(prefix="pycni-bench-") as d:
        data = jsonio.dumps(conf(Path(d), range="198.18.0.0/16"))
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


def main() -> int:
    global backend
    p = argparse.ArgumentParser()
    p.add_argument("--procs", type=int, default=200)
    p.add_argument("--store", choices=sorted(BACKENDS), action="append", help="default: every store")
    args = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for name in args.store or list(BACKENDS):
        print(f"== store: {name}")
        backend = BACKENDS[name]()
        try:
            concurrent_adds(args.procs)
            sequential(args.procs)
            one_add("pool with 60,000 allocations (198.18.0.0/15)", "198.18.0.0/15", "198.18.0.0-15", 60_000)
            one_add(
                "/64 with 100,000 allocations (2001:db8:64::/64)",
                "2001:db8:64::/64",
                "2001-db8-64---64",
                100_000,
            )
        finally:
            backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
