"""The operator CLI: `python -m ipam [--config FILE | --local-db PATH] COMMAND`.

  pools                          pool, range, used/total and a usage bar
  show POOL                      the allocations with their owners
  release POOL IP [--yes]        free one address by hand (asks first)
  reconcile --pods SPEC [--dry-run] [--interval SECONDS] [--metrics ADDR]
                                 free what belongs to pods that are gone (SPEC: file:PATH, kubernetes);
                                 with --interval, Prometheus metrics on ADDR (default 127.0.0.1:9737)

The store is the one the flat file names (as the plugin finds it), or the one in --config (a conflist,
a conf, or a bare ipam object), or the local database given by --local-db. As for the plugin, the local
store is used only when chosen (--local-db, or "datastore": "local"): naming no store is an error. A
local database must exist: the tool never creates one (a mistyped path is an error, not an empty table)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from cni import jsonio, metrics
from cni.errors import CniError, ConfigError
from cni.stopsignal import StopSignal
from ipam import config, removal
from ipam.model import Allocation, Attachment, Pool, by_attachment, joined
from ipam.podsource import ClaimSource, PodSource
from ipam.retry import Retry
from ipam.store.base import Store
from ipam.store.names import pool_name, reservation_name

BAR = 20
METRICS_ENV = "PYCNI_METRICS"
DEFAULT_METRICS = "127.0.0.1:9737"  # == cni.exporter.DEFAULT_PORTS[RECONCILER]
PROG = "pycni-ipam"  # the bundle's entry; `python -m ipam` passes its own


def parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="pycni IPAM operator tool")
    p.add_argument("--config", help="conflist, conf, or ipam object naming the store")
    p.add_argument("--local-db", help="use this local (SQLite) database")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("pools", help="list pools with usage")
    show = sub.add_parser("show", help="list a pool's allocations")
    show.add_argument("pool")
    rel = sub.add_parser("release", help="free one address by hand")
    rel.add_argument("pool")
    rel.add_argument("ip")
    rel.add_argument("--yes", action="store_true", help="do not ask")
    rec = sub.add_parser("reconcile", help="free addresses of pods that are gone")
    rec.add_argument("--pods", required=True, help="pod source: file:PATH or kubernetes")
    rec.add_argument("--dry-run", action="store_true", help="only list what would be freed")
    rec.add_argument("--interval", type=float, default=0, help="keep running, every SECONDS")
    rec.add_argument("--metrics", default=os.environ.get(METRICS_ENV) or DEFAULT_METRICS, metavar="ADDR",
                     type=metrics_address,
                     help="with --interval: serve Prometheus metrics on HOST:PORT, or `off` "
                          f"(default {DEFAULT_METRICS}, or ${METRICS_ENV})")
    return p


def metrics_address(text: str) -> tuple[str, int] | None:
    try:
        return metrics.parse_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def serve_metrics(where: tuple[str, int] | None) -> None:
    """The reconciler's exporter (cni.exporter); an endpoint that cannot be bound is reported, not
    fatal: freeing addresses is what the reconciler is for."""
    if where is None:
        return
    from cni.buildid import build_id
    from cni.exporter import RECONCILER, install, url

    exporter = install(RECONCILER, build_id())
    try:
        sys.stderr.write(f"metrics on {url(*exporter.serve(*where))}\n")
    except OSError as e:
        sys.stderr.write(f"metrics not served on {where[0]}:{where[1]}: {e.strerror or e}\n")
    sys.stderr.flush()


def store_config(args: argparse.Namespace) -> config.StoreConfig:
    if args.local_db:
        return config.StoreConfig("local", args.local_db)
    section: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as fh:
            raw = jsonio.loads(fh.read(), args.config)
        if isinstance(raw, dict) and isinstance(raw.get("plugins"), list) and raw["plugins"]:
            raw = raw["plugins"][0]
        section = raw.get("ipam", raw) if isinstance(raw, dict) else {}
    try:
        return config.load_store(section)
    except config.NoStoreError as e:
        e.details = f"{e.details}; here: --local-db PATH" if e.details else "here: --local-db PATH"
        raise


def require_existing(conf: config.StoreConfig, args: argparse.Namespace) -> None:
    """The tool reads an existing store: opening a local database that is not there would create an
    empty one (and its directory), so a mistyped path would print an empty table and exit 0."""
    if conf.datastore != "local" or os.path.lexists(conf.local_db):
        return
    where = "--local-db" if args.local_db else f"local_db (from {args.config or 'the flat file'})"
    raise ConfigError(f"{where}: no database at {conf.local_db} (the plugin creates it on its first ADD)")


def total(rng: str) -> int:
    net = ipaddress.ip_network(rng, strict=False)
    return max(net.num_addresses - (2 if net.version == 4 else 1), 0)


def bar(used: int, of: int) -> str:
    filled = 0 if not used else max(1, round(BAR * used / of)) if of else BAR
    return "[" + "#" * min(filled, BAR) + "." * (BAR - min(filled, BAR)) + "]"


def number(n: int) -> str:
    return str(n) if n < 10**7 else f"{n:.2e}"


def cmd_pools(store: Store, out: TextIO) -> int:
    rows = [("POOL", "RANGE", "USED/TOTAL", "USAGE")]
    for pool in store.iter_pools():
        used, of = len(pool.allocations), total(pool.range)
        pct = f"{100 * used / of:.1f}%" if of else "-"
        rows.append((pool.name, pool.range, f"{used}/{number(of)}", f"{bar(used, of)} {pct}"))
    table(rows, out)
    return 0


def address_of(pool: Pool, key: str) -> str:
    net = ipaddress.ip_network(pool.range, strict=False)
    return str(net.network_address + int(key)) if key.isdigit() else f"?{key}"


def cmd_show(store: Store, name: str, out: TextIO) -> int:
    pool = store.get_pool(name)
    if pool is None:
        raise ConfigError(f"pool {name}: not found")
    rows: list[tuple[str, ...]] = [("IP", "POD", "IFNAME", "CONTAINER", "POD UID", "NETWORK", "NODE")]
    keys = sorted(pool.allocations, key=lambda k: (len(k), k))
    extras: dict[Attachment, Allocation] = {}
    if any(not a.has_extras() for a in pool.allocations.values()):  # a lean pool's: on the reservations
        extras = by_attachment(r.owner for r in store.iter_reservations())
    for key in keys:
        a = joined(pool.allocations[key], extras)
        cells = (a.podref, a.ifname, a.container_id[:16], a.pod_uid, a.network, a.node)
        rows.append((address_of(pool, key), *(c or "-" for c in cells)))
    out.write(f"pool {pool.name}  range {pool.range}  {len(keys)} allocated  version {pool.version}\n")
    table(rows, out)
    return 0


def _ask(question: str) -> str:
    """The answer from the terminal; no terminal (or EOF) means no."""
    if not sys.stdin.isatty():
        sys.stderr.write(question + " (no terminal to ask: use --yes)\n")
        return ""
    try:
        return input(question)
    except EOFError:
        return ""


def cmd_release(
    store: Store, name: str, ip: str, yes: bool, out: TextIO, ask: Callable[[str], str] = _ask
) -> int:
    pool = store.get_pool(name)
    if pool is None:
        raise ConfigError(f"pool {name}: not found")
    net = ipaddress.ip_network(pool.range, strict=False)
    try:
        key = str(int(ipaddress.ip_address(ip)) - int(net.network_address))
    except ValueError:
        raise ConfigError(f"{ip}: not an IP address") from None
    owner = pool.allocations.get(key)
    if owner is None:
        out.write(f"{ip} is not allocated in {name}\n")
        return 1
    question = (
        f"release {ip} held by {owner.podref or '-'} ({owner.ifname}, container {owner.container_id[:16]})?"
    )
    if not yes and ask(question + " [y/N] ").strip().lower() not in ("y", "yes"):
        out.write("nothing released\n")
        return 1
    # through the decision core, compare-and-swap, retried: an entry taken over since is not released
    freed = removal.remove(store, name, lambda _: [(key, owner)], Retry(), f"releasing {ip}", first=pool)
    if not freed:
        out.write(f"{ip} changed in {name} since it was read: nothing released\n")
        return 1
    network_name = name[: -len(pool_name(pool.range)) - 1] if name != pool_name(pool.range) else ""
    res = store.get_reservation(reservation_name(ip, network_name))
    if res is not None and res.owner.same_attachment(owner):
        store.delete_reservation(res)
    out.write(f"released {ip}\n")
    return 0


def open_pod_source(spec: str, store: config.StoreConfig) -> PodSource:
    """`--pods`: `file:PATH` or `kubernetes` (uses the store's kubeconfig)."""
    if spec.startswith("file:"):
        from ipam.podsource import FilePodSource

        return FilePodSource(spec[5:])
    if spec == "kubernetes":
        from ipam import kubepods

        return kubepods.open_pod_source(store)
    raise ConfigError(f'--pods: unknown pod source "{spec}" (expected file:PATH or kubernetes)')


def cmd_reconcile(store: Store, args: argparse.Namespace, conf: config.StoreConfig, out: TextIO) -> int:
    from ipam.reconciler import Finding, Reconciler, Report, run_forever

    pods = open_pod_source(args.pods, conf)
    verb = "would free" if args.dry_run else "freeing"

    def show(f: Finding) -> None:
        what = f"{f.ip} in pool {f.where}" if f.kind == "allocation" else f"reservation {f.where}"
        out.write(f"{verb} {what} ({f.owner.podref} {f.owner.ifname}): {f.reason}\n")
        out.flush()

    def summary(r: Report) -> None:
        done = f"would free {r.found}" if args.dry_run else f"freed {r.freed} of {r.found}"
        out.write(f"{done}; kept {r.kept}; left alone {r.skipped}\n")
        for e in r.errors:
            out.write(f"error: {e}\n")
        out.flush()

    claims = pods if isinstance(pods, ClaimSource) else None  # `kubernetes`: IPAMClaims too

    def make() -> Reconciler:
        return Reconciler(store, pods, args.dry_run, show, claims=claims)

    label = metrics.STORE.set(conf.datastore)  # labels what the runs count (on this thread)
    try:
        if args.interval <= 0:
            report = make().run()
            summary(report)
            return 1 if report.errors else 0
        serve_metrics(args.metrics)
        stop = StopSignal().install()  # not a threading.Event set by the handler: see cni.stopsignal
        run_forever(make, args.interval, stop, summary)
        return 0
    finally:
        metrics.STORE.reset(label)
        pods.close()


def table(rows: Sequence[tuple[str, ...]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, prog: str = PROG) -> int:
    from ipam import rbac

    args = parser(prog).parse_args(argv)
    previous = rbac.acting()
    rbac.act_as(rbac.RECONCILER)  # the operator tool and the reconciler share one service account
    try:
        conf = store_config(args)
        require_existing(conf, args)
        from ipam.store.select import open_store

        store = open_store(conf)
        try:
            if args.command == "pools":
                return cmd_pools(store, out)
            if args.command == "show":
                return cmd_show(store, args.pool, out)
            if args.command == "release":
                return cmd_release(store, args.pool, args.ip, args.yes, out)
            return cmd_reconcile(store, args, conf, out)
        finally:
            store.close()
    except (CniError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    finally:
        rbac.act_as(previous)
