"""The `whereabouts` IPAM plugin: add/delete/check/status/gc over ipam.engine. Never imports pyroute2
or a store client at module level; the store named by the config is opened per call and closed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from cni import log, metrics, spec
from cni.errors import CheckError, ConfigError, ExhaustedError, NotAvailableError, TryAgainError
from cni.types.netconf import Request
from cni.types.result import IPConfig, Result
from ipam import config, exec_plain, requested
from ipam.config import IpamConfig
from ipam.engine import Engine, Execute
from ipam.model import Allocation
from ipam.ranges import IPRange

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from ipam import claims


# How the engines this module builds run their ops: a plugin process' own (ipam.exec_plain); the agent sets
# its executor here once, at its start (ipam.batch.install), and every engine it builds gets it.
EXECUTE: Execute = exec_plain.run


def load(req: Request) -> IpamConfig:
    section = req.conf.get("ipam")
    if not isinstance(section, dict):
        raise ConfigError("ipam: required (an object)")
    conf = config.load(section)
    log.configure(conf.log_level or None, conf.log_file or None, "whereabouts")
    return conf


def node_name(req: Request, section: dict[str, object]) -> str:
    """NODENAME, else the `nodename` file next to the flat file (upstream's installer writes one),
    else the kernel's host name."""
    if req.env.get("NODENAME"):
        return str(req.env["NODENAME"])
    where = section.get("configuration_path")
    for directory in ([where] if isinstance(where, str) and where else []) + ["/etc/cni/net.d/whereabouts.d"]:
        path = directory if os.path.isdir(directory) else os.path.dirname(directory)
        with contextlib.suppress(OSError), open(os.path.join(path, "nodename")) as fh:
            name = fh.read().strip()
            if name:
                return name
    return os.uname().nodename


def owner(req: Request) -> Allocation:
    a = req.args
    return Allocation(
        req.container_id,
        a.pod_ref,
        req.ifname,
        a.pod_uid,
        req.name,
        node_name(req, req.conf.get("ipam") or {}),
    )


@contextlib.contextmanager
def engine(
    conf: IpamConfig, req: Request | None = None, assign: bool = False, command: str = ""
) -> Iterator[Engine]:
    """The engine over the store `conf` names, timed and labelled for the metrics (counted only in the
    agent: cni.metrics); with node slices (and `req`), over this node's slice (ipam.nodeslice;
    `assign`: give the node a slice if it has none)."""
    from ipam.store.handles import store_for

    command = command or (req.command if req is not None else "")
    with metrics.ipam_call(conf.store.datastore, command), store_for(conf.store) as store:
        if conf.node_slice_size and req is not None:
            from ipam import nodeslice

            node = node_name(req, req.conf.get("ipam") or {})
            conf = nodeslice.resolve(conf, store, req.name, node, assign)
        yield Engine(store, conf, execute=EXECUTE)


def result(conf: IpamConfig, got: list[tuple[IPRange, int]]) -> Result:
    ips = []
    for rng, offset in got:
        address = rng.interface(offset)
        gw = conf.gateway if conf.gateway is not None and conf.gateway.version == address.version else None
        ips.append(IPConfig(address, gw))
    ips.extend(IPConfig(s.address, s.gateway) for s in conf.addresses)
    return Result(ips=tuple(ips), routes=conf.routes, dns=conf.dns)


def check_version_fits(conf: IpamConfig, version: str) -> None:
    """cniVersion 0.1.0/0.2.0 results carry one address per family: refuse before allocating."""
    if spec.family(version) != "0.2":
        return
    versions = [r.version for r in conf.ranges] + [s.address.version for s in conf.addresses]
    for family in (4, 6):
        if versions.count(family) > 1:
            raise ConfigError(
                f"ipam: cniVersion {version} results hold one IPv{family} address, this config "
                f"yields {versions.count(family)} (use cniVersion 0.3.0 or newer)"
            )


def add(req: Request) -> Result:
    conf = load(req)
    check_version_fits(conf, req.version)
    want = requested.wanted(req)
    placed = requested.place(conf.ranges, conf.gateway, want) if want else {}
    who = owner(req)
    with engine(conf, req, assign=True) as e:
        if persistent(req):  # an IPAMClaim may hold the addresses (ipam.claims)
            from ipam import claims

            claimed = claims.resolve(req, conf, e.store, want)
            if claimed is not None:
                got = add_claimed(e, req, conf, claimed)
                return result(conf, got)
        if want and conf.node_slice_size:
            placed = in_slice(conf, e, req, who, want)
        try:
            got = e.add(who, placed)
        except ExhaustedError as err:
            if not conf.node_slice_size:
                raise
            from ipam import slices

            raise slices.slice_full(err, who.node, e.conf.ranges[0]) from None
    log.info(
        "ADD %s %s (%s): %s",
        req.container_id,
        req.ifname,
        who.podref or "no pod",
        ", ".join(str(r.address(o)) for r, o in got),
    )
    return result(conf, got)


def persistent(req: Request) -> bool:
    """The config's top-level `allowPersistentIPs` (ipam.claims; a dict lookup for every other call)."""
    if "allowPersistentIPs" not in req.conf:
        return False
    from ipam import claims

    return claims.persistent(req)


def add_claimed(
    e: Engine, req: Request, conf: IpamConfig, claimed: claims.Claimed
) -> list[tuple[IPRange, int]]:
    """The ADD of an attachment whose addresses are its IPAMClaim's (ipam.claims): the claim's owner and
    addresses through the engine, then the claim's status. A claim that got other addresses meanwhile
    (someone else wrote its status): what this ADD allocated for it is freed again, code 11."""
    from ipam import claims

    got = e.add(claimed.owner, claimed.want, claimed.held)
    try:
        claims.settle(claimed, got, req, e.store, conf)
    except claims.Diverged:
        if not claimed.held:
            e.delete(claimed.owner)
        raise
    log.info("ADD %s %s (%s): %s of IPAMClaim %s", req.container_id, req.ifname, req.args.pod_ref or "no pod",
             ", ".join(str(r.address(o)) for r, o in got), claimed.claim.ref)  # fmt: skip
    return got


def in_slice(
    conf: IpamConfig, e: Engine, req: Request, who: Allocation, want: tuple[requested.Wanted, ...]
) -> dict[int, int]:
    """Node slices: the requested addresses placed in this node's slice (ipam.nodeslice), each one
    first checked to lie in it (else code 7 naming whose slice it is in)."""
    from ipam import nodeslice

    for w in want:
        if w.address.version == e.conf.ranges[0].version:
            nodeslice.requested_in_slice(conf, e.conf, e.store, req.name, who.node, w.address, w.path)
    return requested.place(e.conf.ranges, conf.gateway, want)


def load_to_release(req: Request) -> IpamConfig | None:
    """DEL and GC of a config that names no store (config.NoStoreError) succeed without one: ADD
    refuses such a config before any store is opened, so nothing can be held under it. An allocation
    made while a store was configured (a flat file removed since) stays in that store for the
    reconciler: failing would only keep the runtime retrying a call that cannot reach it."""
    try:
        return load(req)
    except config.NoStoreError as e:
        log.warning("%s %s %s: nothing to release: %s", req.command, req.container_id, req.ifname, e)
        return None


def delete(req: Request) -> None:
    conf = load_to_release(req)
    if conf is None:
        return
    with engine(conf, req) as e:
        if persistent(req):
            from ipam import claims

            held = claims.holds(req, conf, e.store)
            if held:  # the claim keeps its addresses until it is deleted (ipam.claimwatch, the reconciler)
                log.info("DEL %s %s: the addresses are IPAMClaim %s's: kept", req.container_id, req.ifname,
                         held)  # fmt: skip
                return
        e.delete(owner(req))
    log.info("DEL %s %s released", req.container_id, req.ifname)


def check(req: Request) -> None:
    conf = load(req)
    want = requested.wanted(req)
    with engine(conf, req) as e:
        if conf.node_slice_size and not e.conf.ranges:
            raise CheckError(f"node {node_name(req, req.conf.get('ipam') or {})} has no node slice")
        if persistent(req):
            from ipam import claims

            claimed = claims.resolve(req, conf, e.store, want)
            if claimed is not None:
                e.check(claimed.owner, claimed.want or None)
                return
        e.check(owner(req), requested.place(e.conf.ranges, conf.gateway, want) if want else None)


def status(req: Request) -> None:
    try:
        conf = load(req)
    except config.NoStoreError as err:  # no ADD can succeed until the store is configured
        raise NotAvailableError(err.msg, err.details) from None
    try:
        with engine(conf, command=req.command) as e:
            e.store.ping()
    except TryAgainError as err:
        raise NotAvailableError(err.msg, err.details) from None


def gc(req: Request) -> None:
    valid = req.valid_attachments()
    if valid is None:
        log.warning("GC without cni.dev/valid-attachments: nothing released")
        return
    conf = load_to_release(req)
    if conf is None:
        return
    with engine(conf, req) as e:
        e.gc(req.name, node_name(req, req.conf.get("ipam") or {}), valid)
