"""Pieces every interface plugin shares: logging settings, IPAM wrappers, CHECK of addresses and
routes against prevResult."""

from __future__ import annotations

from cni import delegate, log
from cni.errors import CheckError
from cni.netlink import addrs, routes
from cni.netlink.socket import Netlink
from cni.types import fields as f
from cni.types.netconf import Request
from cni.types.result import Interface, Result

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any


def setup_logging(conf: dict[str, Any], tag: str) -> None:
    level = conf.get("logLevel")
    file = conf.get("logFile")
    log.configure(level if isinstance(level, str) else None, file if isinstance(file, str) else None, tag)


def ipam_add(req: Request) -> Result:
    kind = str(req.ipam()["type"])  # type: ignore[index]
    return delegate.require_ips(delegate.add(req), kind)


def our_interface(prev: Result, req: Request) -> tuple[int, Interface]:
    """The prevResult interface this attachment created: name CNI_IFNAME in sandbox CNI_NETNS."""
    for i, iface in enumerate(prev.interfaces):
        if iface.name == req.ifname and iface.sandbox == req.netns:
            return i, iface
    raise CheckError(f'prevResult: no interface "{req.ifname}" with sandbox {req.netns}')


def check_ips_and_routes(nl: Netlink, index: int, name: str, prev: Result, iface_idx: int) -> None:
    """Every prevResult IP of our interface is on the link; every prevResult route exists."""
    present = {a.address for a in addrs.dump(nl, index)}
    for ip in prev.ips:
        if ip.interface is not None and ip.interface != iface_idx:
            continue
        if ip.address not in present:
            raise CheckError(f"{name}: address {ip.address} from prevResult is missing")
    have = routes.dump(nl)
    gateways = {}
    for ip in reversed(prev.ips):  # a route without gw was added via its family's first gateway
        if ip.gateway is not None:
            gateways[ip.version] = ip.gateway
    for r in prev.routes:
        # a route in a table of its own (a rail's) has its gateway spelt out: none means on-link
        gw = r.gw if r.gw is not None or r.table is not None else gateways.get(r.dst.version)
        if not any(k.dst == r.dst and (gw is None or k.gw == gw) and r.table in (None, k.table)
                   for k in have):
            where = f" table {r.table}" if r.table is not None else ""
            raise CheckError(f"{name}: route {r.dst} via {gw or 'link'}{where} from prevResult is missing")


def opt_bool(conf: dict[str, Any], key: str, default: bool = False) -> bool:
    return bool(f.opt(conf, key, bool, "", default))
