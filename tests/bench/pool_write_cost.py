"""What one request on a whereabouts IPPool costs a real kube-apiserver, by pool size (not a timed test):
the reason a shared pool is bounded by the API server and not by the client.

For each size: a pool of N entries (as upstream writes them, and with pycni's per-entry owners
annotations), then R sequential requests of each kind, one at a time (no concurrency): GET, GET+PUT
(upstream's older write), a guarded JSON Patch adding one entry (pycni's write; upstream v0.9.4 also
PATCHes) and a merge patch. Reports wall ms and API-server CPU ms per request (/proc of the server).
Concurrent writers to one object cost more than this: the server applies a write to the object as it
is, and redoes the whole write (patch, validation, managedFields) when another write landed meanwhile.

    python -m tests.bench.pool_write_cost [--sizes 0,256,512,1024] [--requests 30]"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ipam import kubeapi
from ipam.model import Allocation, Pool
from ipam.store import crd
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
    args = ap.parse_args()
    server = kubeup.KubeServer.start()
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-pool-cost-") as tmp:
            tenant = kubeup.Tenant(server, Path(tmp), prefix="cost")
            client = kubeapi.Client(kubeapi.load_kubeconfig(str(tenant.admin_kubeconfig)))
            base = tenant.path("ippools")
            print("| entries | owners notes | GET | GET+PUT | JSON Patch (+1 entry) | merge patch (+1) |")
            print("|---|---|---|---|---|---|")
            for size in (int(s) for s in args.sizes.split(",")):
                for notes in (False, True):
                    name = f"cost-{size}-{int(notes)}"
                    held = {str(k): Allocation(f"{k:064x}", f"bench/pod-{k}", "net1", "u" * 36, "net", "n1")
                            for k in range(1, size + 1)}  # fmt: skip
                    obj = crd.pool_to_object(Pool(name, "198.18.0.0/16", held), tenant.namespace)
                    if not notes:
                        obj["metadata"].pop("annotations", None)
                    client.request("POST", base, obj)
                    path, r = f"{base}/{name}", args.requests

                    def put(i: int, path: str = path) -> None:
                        cur = client.request("GET", path)
                        cur["spec"]["allocations"][str(40000 + i)] = ENTRY
                        client.request("PUT", path, cur)

                    def jpatch(i: int, path: str = path) -> None:
                        key = f"/spec/allocations/{50000 + i}"
                        client.request("PATCH", path, [{"op": "test", "path": key, "value": None},
                                                       {"op": "add", "path": key, "value": ENTRY}],
                                       None, "application/json-patch+json")  # fmt: skip

                    def mpatch(i: int, path: str = path) -> None:
                        body = {"spec": {"allocations": {str(60000 + i): ENTRY}}}
                        client.request("PATCH", path, body, None, "application/merge-patch+json")

                    cells = [measure(server, r, lambda i, path=path: client.request("GET", path)),
                             measure(server, r, put), measure(server, r, jpatch), measure(server, r, mpatch)]
                    text = " | ".join(f"{w:.0f} ms ({c:.0f} ms CPU)" for w, c in cells)
                    print(f"| {size} | {'yes' if notes else 'no'} | {text} |", flush=True)
            client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
