"""The one in-memory result model (spec 1.x) and its conversion to and from every wire version."""

from __future__ import annotations

from cni import spec
from cni.errors import ConfigError
from cni.types import fields as f
from cni.types.valueclass import field, replace, valueclass

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any


@valueclass
class Interface:
    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: int = 0  # 1.1.0
    socket_path: str = ""  # 1.1.0
    pci_id: str = ""  # 1.1.0


@valueclass
class IPConfig:
    address: f.IPInterface
    gateway: f.IPAddress | None = None
    interface: int | None = None

    @property
    def version(self) -> int:
        return self.address.version


@valueclass
class Route:
    dst: f.IPNetwork
    gw: f.IPAddress | None = None
    mtu: int = 0  # the rest: 1.1.0
    advmss: int = 0
    priority: int = 0
    table: int | None = None
    scope: int | None = None


@valueclass
class DNS:
    nameservers: tuple[str, ...] = ()
    domain: str = ""
    search: tuple[str, ...] = ()
    options: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.nameservers or self.domain or self.search or self.options)


@valueclass
class Result:
    interfaces: tuple[Interface, ...] = ()
    ips: tuple[IPConfig, ...] = ()
    routes: tuple[Route, ...] = ()
    dns: DNS = field(default_factory=DNS)

    def with_interface(self, iface: Interface) -> Result:
        """This result with `iface` as the only interface and every IP pointing at it."""
        ips = tuple(replace(ip, interface=0) for ip in self.ips)
        return replace(self, interfaces=(iface,), ips=ips)


# ---- decoding -------------------------------------------------------------------------------------


def parse_dns(d: Any, path: str) -> DNS:
    if d is None:
        return DNS()
    f.typed(d, dict, path)

    def strs(key: str) -> tuple[str, ...]:
        items = f.opt(d, key, list, path, [])
        return tuple(f.typed(s, str, f.join(f.join(path, key), i)) for i, s in enumerate(items))

    return DNS(strs("nameservers"), f.opt(d, "domain", str, path, ""), strs("search"), strs("options"))


def _gateway(d: dict[str, Any], key: str, path: str, family: int) -> f.IPAddress | None:
    """d[key] as an address of IP version `family` (that of the address or route it belongs to)."""
    value = d.get(key)
    if value in (None, ""):
        return None
    gw = f.ip(value, f.join(path, key))
    if gw.version != family:
        raise ConfigError(f"{f.join(path, key)}: {gw} is an IPv{gw.version} address in an IPv{family} entry")
    return gw


def parse_route(d: Any, path: str) -> Route:
    f.typed(d, dict, path)
    dst = f.network(f.req(d, "dst", str, path), f.join(path, "dst"))
    return Route(
        dst=dst,
        gw=_gateway(d, "gw", path, dst.version),
        mtu=f.int_range(d, "mtu", path, 0, 2**31 - 1, 0),
        advmss=f.int_range(d, "advmss", path, 0, 2**31 - 1, 0),
        priority=f.int_range(d, "priority", path, 0, 2**32 - 1, 0),
        table=f.int_range(d, "table", path, 0, 2**32 - 1),
        scope=f.int_range(d, "scope", path, 0, 255),
    )


def _routes(items: Any, path: str) -> tuple[Route, ...]:
    if items is None:
        return ()
    f.typed(items, list, path)
    return tuple(parse_route(r, f.join(path, i)) for i, r in enumerate(items))


def _parse_v02(d: dict[str, Any], path: str) -> Result:
    ips: list[IPConfig] = []
    routes: list[Route] = []
    for key in ("ip4", "ip6"):
        block = d.get(key)
        if block is None:
            continue
        bpath = f.join(path, key)
        f.typed(block, dict, bpath)
        address = f.cidr(f.req(block, "ip", str, bpath), f.join(bpath, "ip"))
        family = 4 if key == "ip4" else 6
        if address.version != family:
            raise ConfigError(f"{f.join(bpath, 'ip')}: {f.show(block['ip'])} is not an IPv{family} address")
        ips.append(IPConfig(address, _gateway(block, "gateway", bpath, family)))
        routes.extend(_routes(block.get("routes"), f.join(bpath, "routes")))
    return Result(ips=tuple(ips), routes=tuple(routes), dns=parse_dns(d.get("dns"), f.join(path, "dns")))


def _parse_interface(d: Any, path: str) -> Interface:
    f.typed(d, dict, path)
    return Interface(
        name=f.opt(d, "name", str, path, ""),
        mac=f.opt(d, "mac", str, path, ""),
        sandbox=f.opt(d, "sandbox", str, path, ""),
        mtu=f.int_range(d, "mtu", path, 0, 2**31 - 1, 0),
        socket_path=f.opt(d, "socketPath", str, path, ""),
        pci_id=f.opt(d, "pciID", str, path, ""),
    )


def _parse_ip(d: Any, path: str, n_ifaces: int) -> IPConfig:
    f.typed(d, dict, path)
    address = f.cidr(f.req(d, "address", str, path), f.join(path, "address"))
    family = f.opt(d, "version", str, path)  # 0.3.x/0.4.0 only; when present it must fit the address
    if family is not None and family != str(address.version):
        raise ConfigError(
            f'{f.join(path, "version")}: "{family}" does not match address {address} (IPv{address.version})'
        )
    iface = f.opt(d, "interface", int, path)
    # an IPAM result has no interfaces, so any index >= 0 is accepted there
    if iface is not None and (iface < 0 or (n_ifaces and iface >= n_ifaces)):
        raise ConfigError(f"{f.join(path, 'interface')}: index {iface} out of range (interfaces: {n_ifaces})")
    return IPConfig(address, _gateway(d, "gateway", path, address.version), iface)


def parse(d: Any, version: str, path: str = "result") -> Result:
    """A result of any supported version -> the 1.x model. Errors name the field (code 7)."""
    f.typed(d, dict, path)
    v = d.get("cniVersion") or version
    if not isinstance(v, str) or v not in spec.SUPPORTED:
        raise ConfigError(f"{f.join(path, 'cniVersion')}: unsupported version {f.show(v)}")
    if spec.family(v) == "0.2":
        return _parse_v02(d, path)
    raw_ifaces = f.opt(d, "interfaces", list, path, [])
    ifaces = tuple(
        _parse_interface(x, f.join(f.join(path, "interfaces"), i)) for i, x in enumerate(raw_ifaces)
    )
    raw_ips = f.opt(d, "ips", list, path, [])
    ips = tuple(_parse_ip(x, f.join(f.join(path, "ips"), i), len(ifaces)) for i, x in enumerate(raw_ips))
    routes = _routes(d.get("routes"), f.join(path, "routes"))
    return Result(ifaces, ips, routes, parse_dns(d.get("dns"), f.join(path, "dns")))


# ---- encoding -------------------------------------------------------------------------------------


def _dns_wire(dns: DNS) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if dns.nameservers:
        out["nameservers"] = list(dns.nameservers)
    if dns.domain:
        out["domain"] = dns.domain
    if dns.search:
        out["search"] = list(dns.search)
    if dns.options:
        out["options"] = list(dns.options)
    return out


def _route_wire(r: Route, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"dst": str(r.dst)}
    if r.gw is not None:
        out["gw"] = str(r.gw)
    if full:
        for key, value in (("mtu", r.mtu), ("advmss", r.advmss), ("priority", r.priority)):
            if value:
                out[key] = value
        if r.table is not None:
            out["table"] = r.table
        if r.scope is not None:
            out["scope"] = r.scope
    return out


def _iface_wire(i: Interface, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": i.name}
    if i.mac:
        out["mac"] = i.mac
    if full and i.mtu:
        out["mtu"] = i.mtu
    if i.sandbox:
        out["sandbox"] = i.sandbox
    if full and i.socket_path:
        out["socketPath"] = i.socket_path
    if full and i.pci_id:
        out["pciID"] = i.pci_id
    return out


def _ip_wire(ip: IPConfig, with_version: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"version": str(ip.version)} if with_version else {}
    if ip.interface is not None:
        out["interface"] = ip.interface
    out["address"] = str(ip.address)
    if ip.gateway is not None:
        out["gateway"] = str(ip.gateway)
    return out


def _to_v02(r: Result, version: str) -> dict[str, Any]:
    out: dict[str, Any] = {"cniVersion": version}
    for fam, key in ((4, "ip4"), (6, "ip6")):
        ip = next((x for x in r.ips if x.version == fam), None)
        if ip is None:
            continue
        block: dict[str, Any] = {"ip": str(ip.address)}
        if ip.gateway is not None:
            block["gateway"] = str(ip.gateway)
        routes = [_route_wire(rt, False) for rt in r.routes if rt.dst.version == fam]
        if routes:
            block["routes"] = routes
        out[key] = block
    if "ip4" not in out and "ip6" not in out:
        raise _no_ips(version)
    out["dns"] = _dns_wire(r.dns)
    return out


def _no_ips(version: str) -> ConfigError:
    return ConfigError(
        f"cniVersion {version} cannot express a result without IP addresses",
        "use cniVersion 0.3.0 or newer for an attachment without IPAM",
    )


def to_wire(r: Result, version: str) -> dict[str, Any]:
    """The result as the spec `version` prints it; fields a version lacks are dropped."""
    fam = spec.family(version)
    if fam == "0.2":
        return _to_v02(r, version)
    full = version == "1.1.0"
    out: dict[str, Any] = {"cniVersion": version}
    if r.interfaces:
        out["interfaces"] = [_iface_wire(i, full) for i in r.interfaces]
    if r.ips:
        out["ips"] = [_ip_wire(ip, fam == "0.4") for ip in r.ips]
    if r.routes:
        out["routes"] = [_route_wire(rt, full) for rt in r.routes]
    dns = _dns_wire(r.dns)
    if dns or fam == "0.4":
        out["dns"] = dns
    return out


def narrowed(r: Result, version: str) -> Result:
    """`r` as a `version` result holds it: what `to_wire(r, version)` prints, parsed back, without
    printing it (an IPAM run in process hands its Result over). ConfigError where to_wire raises."""
    if version == "1.1.0":
        return r
    routes = tuple(Route(rt.dst, rt.gw) for rt in r.routes)  # the fields before 1.1.0
    if spec.family(version) != "0.2":
        interfaces = tuple(Interface(i.name, i.mac, i.sandbox) for i in r.interfaces)
        return Result(interfaces, r.ips, routes, r.dns)
    firsts = [next((ip for ip in r.ips if ip.version == fam), None) for fam in (4, 6)]
    ips = tuple(IPConfig(ip.address, ip.gateway) for ip in firsts if ip is not None)
    if not ips:
        raise _no_ips(version)
    return Result(ips=ips, routes=tuple(rt for ip in ips for rt in routes if rt.dst.version == ip.version),
                  dns=r.dns)  # fmt: skip
