"""Rail interfaces (multi-rail pods): one option, `rail`, shared by macvlan, sriov and host-device,
that makes an interface answer ARP only for its own addresses (arp_ignore=1, arp_announce=2), accept
what arrives on it (rp_filter=2) and send from its addresses through itself: a routing table of its
own in the pod (its connected routes and the IPAM's routes and gateway for it) and a rule
`from <address> lookup <table>` per address. Also `sysctl`, the per-interface sysctls spelled as the
reference `tuning` plugin spells them. docs/multi-rail.md has the why and how to check it on a node."""

from __future__ import annotations

import ipaddress
import os
import re
import socket

from cni import log, netns, spec, sysctl
from cni.errors import CheckError, CniError, Code, ConfigError
from cni.netlink import addrs, links, routes, rules
from cni.netlink.socket import EEXIST, ENOENT, ESRCH, Netlink, NetlinkError, opened
from cni.types import fields as f
from cni.types.netconf import Request
from cni.types.result import Result, Route
from cni.types.valueclass import replace, valueclass
from cni.undo import Undo

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

TABLE_BASE = 100  # the first table an interface gets: TABLE_BASE + its index in the pod, or the next free
PRIORITY = 1000  # of the `from <address>` rules: before `main` (32766), after `local` (0)
RESERVED_TABLES = (0, 253, 254, 255)  # unspec, default, main, local
# what `rail` sets on its interface (a `sysctl` entry for the same key wins)
RAIL_SYSCTLS = (("ipv4/conf/{}/arp_ignore", "1"), ("ipv4/conf/{}/arp_announce", "2"),
                ("ipv4/conf/{}/rp_filter", "2"))
PREFIXES = ("net.ipv4.conf.", "net.ipv6.conf.", "net.ipv4.neigh.", "net.ipv6.neigh.")
_LEAF = re.compile(r"[a-z0-9_]+")

Net = ipaddress.IPv4Network | ipaddress.IPv6Network
Addr = ipaddress.IPv4Address | ipaddress.IPv6Address


@valueclass
class RailConf:
    rail: bool = False
    table: int | None = None
    sysctl: tuple[tuple[str, str], ...] = ()  # (key under /proc/sys/net, value), the ifname in place

    @property
    def active(self) -> bool:
        return self.rail or bool(self.sysctl)

    @staticmethod
    def from_conf(c: dict[str, Any], ifname: str) -> RailConf:
        raw = c.get("rail")
        table = None
        if isinstance(raw, dict):
            for key in raw:
                if key != "table":
                    raise ConfigError(f'rail.{key}: unknown field (rail takes "table" only)')
            table = f.int_range(raw, "table", "rail", 1, 2**32 - 1)
            if table in RESERVED_TABLES:
                raise ConfigError(f"rail.table: {table} is a reserved table (0, default, main, local)")
            on = True
        elif raw is None or isinstance(raw, bool):
            on = bool(raw)
        else:
            raise ConfigError(f"rail: {f.show(raw)} must be true, false or an object like "
                              '{"table": 1001}')
        return RailConf(on, table, _sysctls(c, ifname))


def _sysctls(c: dict[str, Any], ifname: str) -> tuple[tuple[str, str], ...]:
    raw = f.opt(c, "sysctl", dict, "", {})
    out = []
    for key, value in raw.items():
        if not isinstance(value, str):
            raise ConfigError(f"sysctl.{key}: {f.show(value)} must be a string (as in tuning)")
        path = _own_key(key.replace("IFNAME", ifname), ifname) if ifname else _any_key(key)
        if path is None:
            raise ConfigError(f"sysctl.{key}: only settings of this interface are allowed: "
                              f"net.ipv4.conf.{ifname}.*, net.ipv6.conf.{ifname}.*, "
                              f"net.ipv4.neigh.{ifname}.*, net.ipv6.neigh.{ifname}.* "
                              "(IFNAME stands for the interface name)")
        out.append((path, value.strip()))
    return tuple(out)


def _any_key(key: str) -> str | None:
    """Without CNI_IFNAME (STATUS, GC): the shape of an interface's key only."""
    for prefix in PREFIXES:
        name, _, leaf = key[len(prefix):].rpartition(".")
        if key.startswith(prefix) and name and _LEAF.fullmatch(leaf):
            return key
    return None


def _own_key(key: str, ifname: str) -> str | None:
    """'net.ipv4.conf.<ifname>.<leaf>' as the path under /proc/sys/net; None for any other key."""
    for prefix in PREFIXES:
        head = f"{prefix}{ifname}."
        if key.startswith(head) and _LEAF.fullmatch(key[len(head):]):
            return f"{prefix[4:].replace('.', '/')}{ifname}/{key[len(head):]}"
    return None


def wanted_sysctls(conf: RailConf, name: str) -> list[tuple[str, str]]:
    out = {k.format(name): v for k, v in RAIL_SYSCTLS} if conf.rail else {}
    out.update(conf.sysctl)
    return list(out.items())


# ---- ADD ------------------------------------------------------------------------------------------


def apply(ns_fd: int, index: int, result: Result, conf: RailConf, req_version: str, undo: Undo) -> Result:
    """Make link `index` (configured with `result`) a rail; each step pushes its undo. Returns the
    result with the rail table's routes added (CNI 1.1 carries a route's table; older versions not)."""
    if not conf.active:
        return result
    with netns.entered(ns_fd):
        nl = Netlink()
        try:
            link = links.get(nl, index=index)
            if link is None:
                raise CniError(f"link {index} vanished while being made a rail", code=Code.NETLINK)
            _apply_sysctls(ns_fd, conf, link.name, undo)
            if not conf.rail:
                return result
            table = conf.table or _choose_table(nl, index, result)
            wanted = table_routes(result, table)
            for r in wanted:
                _add_route(nl, ns_fd, r, index, undo)
            for src in sources(result):
                _add_rule(nl, ns_fd, src, table, undo)
        finally:
            nl.close()
    log.info("%s: a rail, table %d, %d rule(s)", link.name, table, len(sources(result)))
    if spec.at_least(req_version, "1.1.0"):
        return replace(result, routes=(*result.routes, *wanted))
    return result


def _apply_sysctls(ns_fd: int, conf: RailConf, name: str, undo: Undo) -> None:
    for key, value in wanted_sysctls(conf, name):
        old = sysctl.read(key)
        if old is None:
            raise ConfigError(f"sysctl.net.{key.replace('/', '.')}: no such setting of {name}")
        try:
            sysctl.write(key, value, quiet=False)
        except OSError as e:
            dotted = key.replace("/", ".")
            raise ConfigError(f'sysctl.net.{dotted}: "{value}" refused: {e.strerror}') from None
        undo.push(f"restore {key}", _restore_sysctl, ns_fd, key, old)


def _restore_sysctl(ns_fd: int, key: str, value: str) -> None:
    with netns.entered(ns_fd):  # a rollback runs outside the pod
        sysctl.write(key, value)


def _in_pod(ns_fd: int, fn: Any, *args: Any) -> None:
    """A rollback step on a socket of its own in the pod (the ADD's socket is closed by then)."""
    with opened(ns_fd) as nl:
        fn(nl, *args)


def sources(result: Result) -> list[Net]:
    """`from` of the rules: every address of the interface, as a host prefix."""
    return [ipaddress.ip_network(ip.address.ip) for ip in result.ips]


def table_routes(result: Result, table: int) -> list[Route]:
    """The rail table: connected routes of the interface's addresses, the IPAM's routes (a route
    without gw via its family's gateway) and, for a family with a gateway but no default route in
    the result, a default route via that gateway."""
    out: list[Route] = []
    gateways: dict[int, Addr] = {}
    for ip in result.ips:
        if ip.gateway is not None:
            gateways.setdefault(ip.version, ip.gateway)
        connected = Route(ip.address.network, None, table=table, scope=routes.RT_SCOPE_LINK)
        if connected not in out:
            out.append(connected)
    for r in result.routes:
        if r.table is not None:  # the IPAM already put it in a table of its choice
            continue
        route = Route(r.dst, r.gw if r.gw is not None else gateways.get(r.dst.version), table=table)
        if route not in out:
            out.append(route)
    for version, gw in gateways.items():
        if not any(r.dst.prefixlen == 0 and r.dst.version == version for r in out):
            out.append(Route(ipaddress.ip_network("0.0.0.0/0" if version == 4 else "::/0"), gw, table=table))
    return out


def _add_route(nl: Netlink, ns_fd: int, r: Route, index: int, undo: Undo) -> None:
    assert r.table is not None
    try:
        routes.add(nl, r.dst, r.gw, index, table=r.table, scope=r.scope)
    except NetlinkError as e:
        if e.errno != EEXIST:
            raise CniError(f"add route {r.dst} via {r.gw or 'link'} table {r.table}: {e}",
                           code=Code.NETLINK) from None
        return  # there already (a repeated ADD): not ours to undo
    undo.push(f"delete route {r.dst} table {r.table}", _in_pod, ns_fd, _delete_route, r.dst, r.gw, index,
              r.table)


def _add_rule(nl: Netlink, ns_fd: int, src: Net, table: int, undo: Undo) -> None:
    try:
        rules.add(nl, src, table, PRIORITY)
    except NetlinkError as e:
        if e.errno != EEXIST:
            raise CniError(f"add rule from {src} lookup {table}: {e}", code=Code.NETLINK) from None
        return
    undo.push(f"delete rule from {src}", _in_pod, ns_fd, _delete_rule, src, table)


def _choose_table(nl: Netlink, index: int, result: Result) -> int:
    """The table of an earlier ADD of these addresses (a repeated ADD), else TABLE_BASE + the link's
    index (unique in the pod while the link lives), else the next id no rule or route uses."""
    ours = set(sources(result))
    used: set[int] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        for rule in rules.dump(nl, family):
            if rule.src in ours and rule.table not in RESERVED_TABLES:
                return rule.table
            used.add(rule.table)
    used.update(r.table for r in routes.dump(nl) if r.oif != index)
    table = TABLE_BASE + index
    while table in used or table in RESERVED_TABLES:
        table += 1
    return table


# ---- DEL ------------------------------------------------------------------------------------------


def remove_for(req: Request) -> None:
    """DEL of a rail: what `remove` does, when the configuration asks for a rail. Never fails on
    configuration (a DEL must get through): a bad prevResult only leaves it unused."""
    if not req.conf.get("rail"):
        return
    try:
        prev = req.prev_result()
    except CniError as e:
        log.warning("rail DEL: prevResult unusable (%s); the link's addresses only", e.msg)
        prev = None
    remove(req.netns, req.ifname, prev)


def remove(netns_path: str, ifname: str, prev: Result | None) -> None:
    """Remove the rules from this interface's addresses (those on the link, and those prevResult
    gives it) and the routes of their tables on this link; nothing else. Missing netns, link,
    rules or routes: fine (DEL is idempotent)."""
    if not netns_path:
        return
    try:
        fd = netns.open_netns(netns_path)
    except CniError as e:
        log.info("rail DEL: %s; nothing to remove there", e.msg)
        return
    try:
        with opened(fd) as nl:
            _remove(nl, ifname, prev)
    finally:
        os.close(fd)


def _remove(nl: Netlink, ifname: str, prev: Result | None) -> None:
    link = links.get(nl, ifname)
    index = link.index if link is not None and link.name == ifname else 0
    ours: set[Net] = set()
    if index:
        ours.update(ipaddress.ip_network(a.address.ip) for a in addrs.dump(nl, index)
                    if a.scope == 0)
    if prev is not None:
        mine = [i for i, iface in enumerate(prev.interfaces) if iface.name == ifname]
        ours.update(ipaddress.ip_network(ip.address.ip) for ip in prev.ips
                    if ip.interface is None or ip.interface in mine)
    tables: set[int] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        for rule in rules.dump(nl, family):
            if rule.src in ours and not rule.selectors and rule.table not in RESERVED_TABLES:
                assert rule.src is not None
                _delete_rule(nl, rule.src, rule.table, rule.priority)
                tables.add(rule.table)
    if index:
        for r in routes.dump(nl):
            if r.table in tables and r.oif == index:
                _delete_route(nl, r.dst, r.gw, index, r.table)
    if tables:
        log.info("DEL %s: rail table(s) %s and their rules removed", ifname, sorted(tables))


def _delete_rule(nl: Netlink, src: Net, table: int, priority: int = PRIORITY) -> None:
    try:
        rules.delete(nl, src, table, priority)
    except NetlinkError as e:
        if e.errno != ENOENT:
            raise


def _delete_route(nl: Netlink, dst: Net, gw: Addr | None, index: int, table: int) -> None:
    try:
        routes.delete(nl, dst, gw, index, table)
    except NetlinkError as e:
        if e.errno not in (ESRCH, ENOENT):
            raise


# ---- CHECK ----------------------------------------------------------------------------------------


def check(ns_fd: int, index: int, name: str, prev: Result, iface_idx: int, conf: RailConf) -> None:
    """The sysctls have their values; each address of the interface has its rule, all to one table
    that holds the interface's routes. CheckError (105) on any difference."""
    if not conf.active:
        return
    with netns.entered(ns_fd):
        for key, value in wanted_sysctls(conf, name):
            have = sysctl.read(key)
            if have is None or have.split() != value.split():
                raise CheckError(f"{name}: sysctl net.{key.replace('/', '.')} is {have}, expected {value}")
        if not conf.rail:
            return
        nl = Netlink()
        try:
            _check_routing(nl, index, name, _own(prev, iface_idx), conf)
        finally:
            nl.close()


def _own(prev: Result, iface_idx: int) -> Result:
    ips = tuple(ip for ip in prev.ips if ip.interface is None or ip.interface == iface_idx)
    return replace(prev, ips=ips, routes=tuple(r for r in prev.routes if r.table is None))


def _check_routing(nl: Netlink, index: int, name: str, own: Result, conf: RailConf) -> None:
    found: dict[Net, int] = {}
    for family in (socket.AF_INET, socket.AF_INET6):
        for rule in rules.dump(nl, family):
            if rule.src is not None and rule.priority == PRIORITY and not rule.selectors:
                found.setdefault(rule.src, rule.table)
    tables = set()
    for src in sources(own):
        if src not in found:
            raise CheckError(f"{name}: no rule from {src.network_address} to a rail table")
        tables.add(found[src])
    if not tables:
        return
    if len(tables) > 1 or (conf.table and conf.table not in tables):
        raise CheckError(f"{name}: rules of its addresses look up tables {sorted(tables)}, expected one "
                         f"table{f' ({conf.table})' if conf.table else ''}")
    table = tables.pop()
    have = [r for r in routes.dump(nl) if r.table == table]
    for r in table_routes(own, table):
        if not any(k.dst == r.dst and k.gw == r.gw and k.oif == index for k in have):
            raise CheckError(f"{name}: route {r.dst} via {r.gw or 'link'} missing from table {table}")
