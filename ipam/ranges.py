"""Range math on integers (128-bit for IPv6): the allocatable addresses of one range are a short sorted
tuple of inclusive (lo, hi) segments: [start, end] minus the excludes minus the gateway. The network
address and the IPv4 broadcast are never in it; for IPv6 the last address is usable (a /64 end to end).
Offsets (the store's keys) count from the network address."""

from __future__ import annotations

import ipaddress

from cni.errors import ConfigError
from cni.types import fields as f
from cni.types.valueclass import valueclass

Segment = tuple[int, int]


@valueclass
class IPRange:
    network: f.IPNetwork
    start: int  # first address handed out (absolute integer)
    end: int  # last address handed out
    excludes: tuple[f.IPNetwork, ...] = ()
    segments: tuple[Segment, ...] = ()
    prefixlen: int = 0  # the result's prefix length when not the network's (a node slice: the whole range's)
    pool: str = ""  # the pool's name when not derived from the network (a node slice: ipam.slices)

    @property
    def cidr(self) -> str:
        """The canonical CIDR, as the pool's spec.range holds it."""
        return str(self.network)

    @property
    def base(self) -> int:
        return int(self.network.network_address)

    @property
    def size(self) -> int:
        """How many addresses can be handed out."""
        return sum(hi - lo + 1 for lo, hi in self.segments)

    def address(self, offset: int) -> f.IPAddress:
        return to_address(self.version, self.base + offset)

    def offset(self, ip: f.IPAddress) -> int:
        return int(ip) - self.base

    def interface(self, offset: int) -> f.IPInterface:
        return ipaddress.ip_interface(f"{self.address(offset)}/{self.prefixlen or self.network.prefixlen}")

    @property
    def version(self) -> int:
        return self.network.version

    def allocatable(self, ip: int) -> bool:
        return any(lo <= ip <= hi for lo, hi in self.segments)

    def describe(self) -> str:
        v = self.version
        parts = [f"range {self.cidr}", f"{to_address(v, self.start)}-{to_address(v, self.end)}"]
        if self.excludes:
            parts.append("exclude " + ", ".join(map(str, self.excludes)))
        return " ".join(parts)


def to_address(version: int, value: int) -> f.IPAddress:
    return ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)


def usable_bounds(net: f.IPNetwork) -> Segment:
    """[network+1, broadcast-1] for IPv4, [network+1, last] for IPv6; empty (lo > hi) if none."""
    lo = int(net.network_address) + 1
    hi = int(net.broadcast_address) - (1 if net.version == 4 else 0)
    return lo, hi


def subtract(segments: list[Segment], lo: int, hi: int) -> list[Segment]:
    out: list[Segment] = []
    for a, b in segments:
        if hi < a or lo > b:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo - 1))
        if hi < b:
            out.append((hi + 1, b))
    return out


def parse_range(text: object, path: str) -> tuple[f.IPNetwork, f.IPAddress | None, f.IPAddress | None]:
    """`range`: a CIDR (host bits cleared), or `start-end/prefix` (the network is that of end/prefix)."""
    f.typed(text, str, path)
    assert isinstance(text, str)
    if "-" not in text:
        return f.network(text, path), None, None
    first, _, rest = text.partition("-")
    if "/" not in rest:
        raise ConfigError(f"{path}: not a CIDR or start-end/prefix: {f.show(text)}")
    end_text, _, prefix = rest.partition("/")
    start = f.ip(first.strip(), path)
    iface = f.cidr(f"{end_text.strip()}/{prefix.strip()}", path)
    if start.version != iface.version:
        raise ConfigError(f"{path}: start {start} and end {iface.ip} are of different IP versions")
    if start not in iface.network:
        raise ConfigError(f"{path}: start {start} is not inside {iface.network}")
    return iface.network, start, iface.ip


def _bound(ip: f.IPAddress | None, net: f.IPNetwork, default: int, path: str) -> int:
    if ip is None:
        return default
    if ip.version != net.version or ip not in net:
        raise ConfigError(f"{path}: {ip} is outside the range {net}")
    return int(ip)


def build(
    net: f.IPNetwork,
    start: f.IPAddress | None,
    end: f.IPAddress | None,
    excludes: tuple[f.IPNetwork, ...],
    gateway: f.IPAddress | None,
    path: str,
) -> IPRange:
    """An IPRange; raises code 7 naming `path` (or its fields) when nothing would be allocatable."""
    lo, hi = usable_bounds(net)
    first = max(_bound(start, net, lo, f.join(path, "range_start")), lo)
    last = min(_bound(end, net, hi, f.join(path, "range_end")), hi)
    if start is not None and end is not None and int(start) > int(end):
        raise ConfigError(f"{f.join(path, 'range_start')}: {start} is after range_end {end}")
    segments = [(first, last)] if first <= last else []
    for ex in excludes:
        segments = subtract(segments, int(ex.network_address), int(ex.broadcast_address))
    if gateway is not None and gateway.version == net.version and gateway in net:
        segments = subtract(segments, int(gateway), int(gateway))
    if not segments:
        raise ConfigError(
            f"{f.join(path, 'range')}: no usable address in {net}"
            + (
                " after range_start/range_end, exclude and gateway"
                if (start or end or excludes or gateway)
                else ""
            )
        )
    return IPRange(net, first, last, excludes, tuple(segments))


def parse_exclude(value: object, net: f.IPNetwork, path: str) -> f.IPNetwork:
    """A CIDR (host bits cleared) or a bare IP (/32, /128), inside the range."""
    f.typed(value, str, path)
    assert isinstance(value, str)
    ex = f.network(value, path) if "/" in value else ipaddress.ip_network(f.ip(value, path))
    if ex.version != net.version or not ex.subnet_of(net):  # type: ignore[arg-type]
        raise ConfigError(f"{path}: {ex} is not inside the range {net}")
    return ex


def same_network(stored: str, rng: IPRange) -> bool:
    """spec.range as written by us or upstream (host bits set or not) names the same network."""
    try:
        return ipaddress.ip_network(stored, strict=False) == rng.network
    except ValueError:
        return False
