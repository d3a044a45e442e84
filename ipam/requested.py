"""Requested (static) addresses of one attachment, pure: where they come from and whether this config can
give them. The engine then takes exactly them (ipam.engine, ipam.allocator), held like any allocated
address: the pool entry and, with overlapping ranges, the cluster-wide reservation.

Sources, as the reference `static` plugin reads them, each replacing the ones before it (a plugin that
understands `args` ignores the CNI_ARGS copy, CONVENTIONS.md): CNI_ARGS `IP=` (comma-separated), then
`args.cni.ips`, then `runtimeConfig.ips` (the `ips` capability). Multus sends a network selection
element's `ips` both as `runtimeConfig.ips` (when the NAD declares the capability) and, on ADD, as `IP=`.
Each entry is `ip` or `ip/prefix`; a prefix, when given, must be the one the result carries (the range's).

Rules (code 7 naming the address, its field and the rule): inside one of the config's ranges, and none of
its network address, IPv4 broadcast, gateway, an `exclude`, or outside `range_start`/`range_end`; a
family with no range is refused; one requested address per range (a dual-stack config: one per family,
the other family allocated as usual)."""

from __future__ import annotations

from cni.errors import ConfigError, EnvError
from cni.types import fields as f
from cni.types.netconf import Request
from cni.types.valueclass import valueclass
from ipam.ranges import IPRange, to_address


@valueclass
class Wanted:
    address: f.IPAddress
    prefixlen: int | None  # as written; None for a bare address
    path: str  # the field it came from, for messages: runtimeConfig.ips[0], args.cni.ips[1], CNI_ARGS IP


def wanted(req: Request) -> tuple[Wanted, ...]:
    """The addresses this request asks for (none: allocate as usual)."""
    runtime = req.runtime_config().get("ips")
    if runtime:
        return _listed(runtime, "runtimeConfig.ips")
    args = req.cni_args().get("ips")
    if args:
        return _listed(args, "args.cni.ips")
    text = req.args.get("IP")
    if not text:
        return ()
    try:
        return tuple(_one(item.strip(), f"CNI_ARGS IP[{i}]") for i, item in enumerate(text.split(",")))
    except ConfigError as e:
        raise EnvError(e.msg) from None  # an environment variable: code 4, as CNI_ARGS MAC


def _listed(value: object, path: str) -> tuple[Wanted, ...]:
    f.typed(value, list, path)
    assert isinstance(value, list)
    return tuple(_one(item, f.join(path, i)) for i, item in enumerate(value))


def _one(value: object, path: str) -> Wanted:
    f.typed(value, str, path)
    assert isinstance(value, str)
    if "/" in value:
        iface = f.cidr(value, path)
        return Wanted(iface.ip, iface.network.prefixlen, path)
    return Wanted(f.ip(value, path), None, path)


def place(
    ranges: tuple[IPRange, ...], gateway: f.IPAddress | None, want: tuple[Wanted, ...]
) -> dict[int, int]:
    """Which range gives each requested address: {index in `ranges`: offset}. Code 7 for an address this
    config cannot give (see the module docstring)."""
    out: dict[int, int] = {}
    first: dict[int, Wanted] = {}
    for w in want:
        index = _range_of(ranges, w)
        rng = ranges[index]
        result_prefix = rng.prefixlen or rng.network.prefixlen
        if w.prefixlen is not None and w.prefixlen != result_prefix:
            raise ConfigError(
                f"{w.path}: {w.address}/{w.prefixlen}: prefix /{w.prefixlen} is not the range's "
                f"/{result_prefix} ({rng.cidr}): give the bare address or /{result_prefix}"
            )
        rule = refusal(rng, gateway, w.address)
        if rule:
            raise ConfigError(f"{w.path}: {w.address} {rule}: not allocatable in {rng.describe()}")
        if index in first:
            raise ConfigError(
                f"{w.path}: {w.address}: {first[index].path} already asks for {first[index].address} in "
                f"range {rng.cidr} (one requested address per range)"
            )
        first[index] = w
        out[index] = rng.offset(w.address)
    return out


def _range_of(ranges: tuple[IPRange, ...], w: Wanted) -> int:
    family = [i for i, r in enumerate(ranges) if r.version == w.address.version]
    if not family:
        have = ", ".join(r.cidr for r in ranges)
        raise ConfigError(
            f"{w.path}: {w.address}: this config has no IPv{w.address.version} range (it has {have})"
        )
    for i in family:
        if w.address in ranges[i].network:
            return i
    raise ConfigError(
        f"{w.path}: {w.address} is not inside any IPv{w.address.version} range of this config "
        f"({', '.join(ranges[i].cidr for i in family)})"
    )


def refusal(rng: IPRange, gateway: f.IPAddress | None, ip: f.IPAddress) -> str:
    """Why `ip` (inside rng.network) is not allocatable in `rng`, "" when it is."""
    value = int(ip)
    net = f"node slice {rng.cidr}" if rng.prefixlen else rng.cidr  # a slice: ipam.slices.in_slice
    if value == int(rng.network.network_address):
        return f"is the network address of {net}"
    if rng.version == 4 and value == int(rng.network.broadcast_address):
        return f"is the broadcast address of {net}"
    if gateway is not None and gateway == ip:
        return "is the gateway"
    for ex in rng.excludes:
        if ip in ex:
            return f"is excluded ({ex})"
    if not rng.start <= value <= rng.end:
        v = rng.version
        return f"is outside range_start-range_end {to_address(v, rng.start)}-{to_address(v, rng.end)}"
    return "" if rng.allocatable(value) else "is not allocatable"
