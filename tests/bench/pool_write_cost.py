"""What one request on a whereabouts IPPool costs a real kube-apiserver, by pool size (not a timed test):
the reason a shared pool is bounded by the API server and not by the client.

For each size: a pool of N entries (as upstream writes them, and with pycni's per-entry owners
annotations), then R sequential requests of each kind, one at a time (no concurrency): GET, GET+PUT
(upstream's older write), a guarded JSON Patch adding one entry (pycni's write; upstream v0.9.4 also
PATCHes) and a merge patch. Reports wall ms and API-server CPU ms per request (/proc of the server).
The GET is also measured with `resourceVersion` set (what pycni's hot ADD sends: the server answers from
its watch cache, ipam.store.kube.recent_pool).

Concurrent writers to one object cost more than this: the server applies a write to the object as its
cache has it, and redoes the whole write (patch, validation, encoding) when another write landed
meanwhile. `--writers W` measures that instead: W threads (each its own connection, the node's token)
write one pool of the first size at once, each adding its own entry and removing it again with pycni's
guarded JSON Patch, --requests times: etcd updates per write (etcd_requests_total: 1.0 when no write is
redone) and API-server CPU ms per write.

    python -m tests.bench.pool_write_cost [--sizes 0,256,512,1024] [--requests 30] [--writers 8]"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ipam import kubeapi
from ipam.model import Allocation, Pool
from ipam.store import crd
from ipam.store.kube import JSON_PATCH, UNTRACKED  # what the store sends with every pool patch
from tests import kubeup

ENTRY = {"id": "f" * 64, "podref": "bench/pod", "ifname": "net1"}


def measure(server: kubeup.KubeServer, n: int, request: Callable[[int], object]) -> tuple[float, float]:
    """(wall ms, server CPU ms) per request over n sequential requests."""
    cpu, wall = server.cpu_seconds(), time.monotonic()
    for i in range(n):
        request(i)
    return (time.monotonic() - wall) * 1000 / n, (server.cpu_seconds() - cpu) * 1000 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,256,512,1024")
    ap.add_argument("--requests", type=int, default=30)
    ap.add_argument("--writers", type=int, default=0,
                    help="concurrent writers of one pool (0: one request at a time)")
    args = ap.parse_args()
    server = kubeup.KubeServer.start()
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-pool-cost-") as tmp:
            if args.writers:
                size = int(args.sizes.split(",")[0])
                print("| writers | entries | wall s | etcd updates per write | API CPU ms per write |")
                print("|---|---|---|---|---|")
                tenant = kubeup.Tenant(server, Path(tmp), prefix="cost")
                row = concurrent(server, tenant, size, args.writers, args.requests)
                print(f"| {args.writers} | {size} | {row} |", flush=True)
                return
            tenant = kubeup.Tenant(server, Path(tmp), prefix="cost")
            client = kubeapi.Client(kubeapi.load_kubeconfig(str(tenant.admin_kubeconfig)))
            base = tenant.path("ippools")
            print("| entries | owners notes | GET | GET at its version (watch cache) | GET+PUT "
                  "| JSON Patch (+1 entry) | merge patch (+1) |")
            print("|---|---|---|---|---|---|---|")
            for size in (int(s) for s in args.sizes.split(",")):
                for notes in (False, True):
                    name = f"cost-{size}-{int(notes)}"
                    held = {str(k): Allocation(f"{k:064x}", f"bench/pod-{k}", "net1", "u" * 36, "net", "n1")
                            for k in range(1, size + 1)}  # fmt: skip
                    obj = crd.pool_to_object(Pool(name, "198.18.0.0/16", held), tenant.namespace)
                    if not notes:
                        obj["metadata"].pop("annotations", None)
                    version = client.request("POST", base, obj)["metadata"]["resourceVersion"]
                    path, r = f"{base}/{name}", args.requests

                    def put(i: int, path: str = path) -> None:
                        cur = client.request("GET", path)
                        cur["spec"]["allocations"][str(40000 + i)] = ENTRY
                        client.request("PUT", path, cur)

                    def jpatch(i: int, path: str = path) -> None:
                        key = f"/spec/allocations/{50000 + i}"
                        client.request("PATCH", path, [{"op": "test", "path": key, "value": None},
                                                       {"op": "add", "path": key, "value": ENTRY}],
                                       None, JSON_PATCH)  # fmt: skip

                    def mpatch(i: int, path: str = path) -> None:
                        body = {"spec": {"allocations": {str(60000 + i): ENTRY}}}
                        client.request("PATCH", path, body, None, "application/merge-patch+json")

                    def cached(i: int, path: str = path, v: str = version) -> None:
                        client.request("GET", path, None, {"resourceVersion": v})

                    cells = [measure(server, r, lambda i, path=path: client.request("GET", path)),
                             measure(server, r, cached),
                             measure(server, r, put), measure(server, r, jpatch), measure(server, r, mpatch)]
                    text = " | ".join(f"{w:.0f} ms ({c:.0f} ms CPU)" for w, c in cells)
                    print(f"| {size} | {'yes' if notes else 'no'} | {text} |", flush=True)
            client.close()
    finally:
        server.stop()


def concurrent(server: kubeup.KubeServer, tenant: kubeup.Tenant, size: int, writers: int, n: int) -> str:
    """`writers` threads writing one pool of `size` entries at once (see the module docstring): the
    row's wall s, etcd updates per write and API CPU ms per write."""
    admin = kubeapi.Client(kubeapi.load_kubeconfig(str(tenant.admin_kubeconfig)))
    held = {str(k): Allocation(f"{k:064x}", f"bench/pod-{k}", "net1", "u" * 36, "net", "n1")
            for k in range(1, size + 1)}  # fmt: skip
    base = tenant.path("ippools")
    admin.request("POST", base, crd.pool_to_object(Pool("shared", "198.18.0.0/16", held), tenant.namespace))
    admin.close()
    path = f"{base}/shared"
    clients = [kubeapi.Client(kubeapi.load_kubeconfig(str(tenant.node))) for _ in range(writers)]
    for c in clients:
        c.request("GET", path)  # connected before the clock starts
    errors: list[BaseException] = []

    def write(j: int) -> None:
        try:
            for i in range(n):
                key = f"/spec/allocations/{100000 + j * 1000 + i}"
                clients[j].request("PATCH", path, [{"op": "test", "path": key, "value": None},
                                                   {"op": "add", "path": key, "value": ENTRY}, UNTRACKED],
                                   None, JSON_PATCH)  # fmt: skip
                clients[j].request("PATCH", path, [{"op": "remove", "path": key}, UNTRACKED],
                                   None, JSON_PATCH)  # fmt: skip
        except BaseException as e:
            errors.append(e)

    etcd, cpu, wall = server.storage_counts(), server.cpu_seconds(), time.monotonic()
    threads = [threading.Thread(target=write, args=(j,)) for j in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.monotonic() - wall, server.cpu_seconds() - cpu
    updates = server.storage_counts().get(("update", "ippools"), 0.0) - etcd.get(("update", "ippools"), 0.0)
    for c in clients:
        c.close()
    if errors:
        raise errors[0]
    writes = 2 * n * writers
    return f"{wall:.1f} | {updates / writes:.2f} | {cpu * 1000 / writes:.0f}"


if __name__ == "__main__":
    main()
