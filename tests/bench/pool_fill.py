"""`make bench-pool-fill`: what one uncontended ADD (and DEL) costs as one shared pool fills, pycni's frozen
whereabouts (dist/cni-bin, PYCNI_AGENT=off; --source: from source) against upstream whereabouts v0.9.4
(../shared/upstream) in the same run, on one real kube-apiserver (tests/kubeup.py). Not a timed test: it
prints a markdown table and writes a JSON result file.

Every write of an IPPool re-encodes the whole object on the server, so the cost of one call grows with
the pool; this measures how (issue 44). For each fill level F (--fill, default 0,1000,2000,4000,8000
entries) and each implementation, in a namespace of its own (kubeup.Tenant; upstream with its own flat
file and ServiceAccount: tests/bench/ipam_scale.py's `Upstream`, pycni's with the node's: its `Pycni`):

1. the pool is written directly as admin with F entries (Tenant.write_pool: a 64-hex container id, a pod
   reference `namespace/fill-<k>-x2x4k`, `net1`; offsets 1..F; no field tracking), as the nodes of a
   cluster would have left it, without their reservations: neither implementation lists reservations on
   ADD or DEL, it reads and writes the one of its address;
2. an ADD from node-1, then one from node-0 (neither counted: a pool other nodes write too, and the
   implementation's first call on it), then --runs ADDs one after another, each a process on node-0 for
   a new pod; then the DELs of the same attachments (the two first not counted either);
3. per call: wall ms (median), API-server CPU ms (the server's CPU over the counted calls, /proc, divided
   by their number: the server's own background work is in it, a few ms a second), API requests (deltas
   of apiserver_request_total, the same way); the pool object's size in bytes as a GET answers it, after
   the ADDs (F + runs + 2 entries; pycni's annotations in it: the turn's name, its last direct writer).

A shared pool for both: pycni writes it through the pool's turn (ipam/turn.py: node-1 wrote it last), a
Lease round and a read of the pool per write; upstream takes its cluster-wide Lease for every call.

    python -m tests.bench.pool_fill [--fill 0,1000,2000,4000,8000] [--runs 10] [--impl upstream|pycni]
        [--source] [--json PATH]    (`make bundle` first unless --source)"""

from __future__ import annotations

import argparse
import ipaddress
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ipam.store.names import pool_name
from tests import kubeup
from tests.bench.ipam_scale import BUNDLE, Impl, Pod, Pycni, Upstream, Workload, one_call
from tests.nsutil import REPO

BASE = "198.18.0.0"


@dataclass
class Row:
    impl: str
    fill: int
    pool_bytes: int = 0
    entries: int = 0
    ms: dict[str, float] = field(default_factory=dict)  # "ADD"/"DEL": median wall ms per call
    cpu_ms: dict[str, float] = field(default_factory=dict)  # API-server CPU ms per call
    requests: dict[str, float] = field(default_factory=dict)  # API requests per call
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def fill_range(most: int) -> str:
    """The smallest network at BASE with room for `most` entries."""
    prefix = 30
    while 2 ** (32 - prefix) - 2 < most:
        prefix -= 1
    return str(ipaddress.ip_network(f"{BASE}/{prefix}"))


def entries(n: int, namespace: str) -> dict[str, dict[str, str]]:
    return {str(k): {"id": f"{k:064x}", "podref": f"{namespace}/fill-{k}-x2x4k", "ifname": "net1"}
            for k in range(1, n + 1)}  # fmt: skip


def requests(server: kubeup.KubeServer) -> float:
    return sum(server.request_counts().values())


def level(impl: Impl, tenant: kubeup.Tenant, rng: str, fill: int, runs: int, prefix: str) -> Row:
    """One implementation at one fill level (module docstring): the pool written with `fill` entries, then
    2 + `runs` ADDs and their DELs, a process each."""
    server, row = tenant.server, Row(impl.label, fill)
    name = pool_name(rng)
    tenant.write_pool(name, rng, entries(fill, tenant.namespace))
    wl = Workload(pods=2 * runs + 4, networks=1, nodes=2, concurrency=1, budget=600.0)  # node-<index % 2>
    conf = {1: json.dumps({"cniVersion": "1.0.0", "name": "bench-fill", "type": "macvlan",
                           "ipam": impl.ipam(rng)}).encode()}  # fmt: skip
    warm = [Pod(1, tenant.namespace, prefix), Pod(2, tenant.namespace, prefix)]  # node-1, node-0
    pods = [Pod(2 * i + 4, tenant.namespace, prefix) for i in range(runs)]  # node-0
    deadline = time.monotonic() + wl.budget
    for command in ("ADD", "DEL"):
        first = [one_call(impl, wl, command, pod, 1, conf, deadline) for pod in warm]  # not counted
        cpu, sent = server.cpu_seconds(), requests(server)
        calls = [one_call(impl, wl, command, pod, 1, conf, deadline) for pod in pods]
        cpu, sent = server.cpu_seconds() - cpu, requests(server) - sent
        failed = [c.error for c in (*first, *calls) if not c.ok]
        row.failed += len(failed)
        row.errors += sorted(set(failed) - set(row.errors))[:3]
        row.ms[command] = 1000 * statistics.median(c.seconds for c in calls)
        row.cpu_ms[command] = 1000 * cpu / len(calls)
        row.requests[command] = sent / len(calls)
        if command == "ADD":
            text: str = server.request("GET", tenant.path("ippools", name), raw=True)
            row.pool_bytes = len(text.encode())
            row.entries = len(json.loads(text)["spec"].get("allocations") or {})
    return row


def table(rows: list[Row]) -> str:
    out = ["| entries | impl | pool bytes | ADD ms | ADD API CPU ms | ADD requests | DEL ms | DEL API CPU ms "
           "| DEL requests | failed |",
           "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        cells = [f"{r.ms[c]:.0f} | {r.cpu_ms[c]:.1f} | {r.requests[c]:.1f}" for c in ("ADD", "DEL")]
        out.append(f"| {r.fill} | {r.impl} | {r.pool_bytes:,} | {cells[0]} | {cells[1]} | {r.failed} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fill", default="0,1000,2000,4000,8000", help="entries in the pool, per level")
    ap.add_argument("--runs", type=int, default=10, help="counted ADDs (and DELs) per level and impl")
    ap.add_argument("--impl", action="append", choices=("upstream", "pycni"), help="default: both")
    ap.add_argument("--source", action="store_true", help="pycni from source, not dist/cni-bin")
    ap.add_argument("--json", type=Path, default=REPO / "dist" / "bench" / "pool-fill.json")
    args = ap.parse_args(argv)
    fills = [int(f) for f in args.fill.split(",")]
    impls = args.impl or ["upstream", "pycni"]
    if args.runs < 1 or min(fills) < 0:
        print("--runs must be at least 1 and --fill levels not negative", file=sys.stderr)
        return 2
    reason = kubeup.absent() or (kubeup.shared_missing("bin/whereabouts.xz") if "upstream" in impls else "")
    if reason:
        print(reason, file=sys.stderr)
        return 2
    bundle = None if args.source else BUNDLE
    if bundle is not None and not (bundle / "whereabouts").exists():
        print(f"missing {bundle}/whereabouts: run `make bundle` (or pass --source)", file=sys.stderr)
        return 2
    rng = fill_range(max(fills) + args.runs + 2)
    print(f"pool {pool_name(rng)} ({rng}); fill levels {fills}; {args.runs} counted calls each; pycni "
          f"{'from source' if bundle is None else bundle}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="pycni-pool-fill-") as tmp:
        scratch = Path(tmp)
        server = kubeup.KubeServer.start(scratch)
        try:
            for n, label in enumerate(impls):
                impl: Impl = Upstream() if label == "upstream" else Pycni(bundle)
                where = scratch / label
                tenant = kubeup.Tenant(server, where / "kube", prefix="fill")
                impl.setup(tenant, where)
                try:
                    for i, fill in enumerate(fills):
                        row = level(impl, tenant, rng, fill, args.runs, f"{n:x}{i:x}")
                        rows.append(row)
                        print(f"  {label} at {fill}: ADD {row.ms['ADD']:.0f} ms, DEL {row.ms['DEL']:.0f} ms, "
                              f"{row.pool_bytes:,} bytes, {row.failed} failed", flush=True)
                finally:
                    impl.close()
        finally:
            server.stop()
    rows.sort(key=lambda r: (r.fill, impls.index(r.impl)))
    print(f"\n## One uncontended call as one shared pool fills (median of {args.runs}, a process each)\n")
    print(table(rows))
    for r in rows:
        for e in r.errors:
            print(f"- {r.impl} at {r.fill}: {e}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"range": rng, "runs": args.runs,
                                     "pycni": "source" if bundle is None else str(bundle),
                                     "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    print(f"\nresult: {args.json}")
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
