"""Node slices, pure: upstream whereabouts' `node_slice_size` (v0.9.4 "fast IPAM") split a range into
equal subnets (slices); each node allocates only inside the slice assigned to it, from its own IPPool.

- Size: a prefix length, `"/24"` or `"24"` (upstream trims one leading '/'), at least the range's
  prefix length, and leaving each slice usable addresses (IPv4 at most /30, IPv6 at most /126).
- Slices: the range's subnets of that size in address order, written `<network>/<size>` (upstream's
  `DivideRangeBySize`; ipaddress prints IPv4 exactly as Go does). Assignment takes the first slice
  whose node is empty, in list order (upstream's `assignNodeToSlice`), so every assigner agrees.
- Pool of a slice: `spec.range` is the slice, offsets count from the slice's network address, and the
  name is `<node>-<slice>` or `<network_name>-<node>-<slice>` (upstream's `IPPoolName` with NodeName);
  the result carries the whole range's prefix length.
- Unlike upstream (whereabouts#666), `exclude`, `range_start`/`range_end` and the gateway still apply:
  the slice's allocatable segments are the range's (already cut by them) intersected with the slice."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from cni.errors import CniError, Code, ConfigError
from cni.types import fields as f
from ipam.ranges import IPRange, usable_bounds
from ipam.store.names import pool_name

# a NodeSlicePool lists every slice (~60 bytes each plus the node's name): 16,384 slices (upstream's own
# example, a /8 in /22 slices) is ~1 MB, under the API server's 1.5 MiB object limit
MAX_SLICES = 16384


def parse_size(value: object, net: f.IPNetwork, path: str) -> int:
    """The slice prefix length `node_slice_size` names for range `net` (code 7 naming `path`)."""
    if not isinstance(value, str):
        raise ConfigError(f"{path}: must be a string like \"/24\", got {f.show(value)}")
    text = value.removeprefix("/")
    if not (text.isascii() and text.isdigit()) or len(text) > 3:
        raise ConfigError(f"{path}: not a prefix length like \"/24\": {f.show(value)}")
    size = int(text)
    bits = net.max_prefixlen
    if size < net.prefixlen:
        raise ConfigError(f"{path}: /{size} is larger than the range {net} itself")
    if size > bits - 2:
        raise ConfigError(f"{path}: /{size} slices hold no usable address (at most /{bits - 2})")
    if size - net.prefixlen > 14 or 2 ** (size - net.prefixlen) > MAX_SLICES:
        raise ConfigError(
            f"{path}: /{size} cuts {net} into {2 ** (size - net.prefixlen)} slices, more than "
            f"{MAX_SLICES} (the NodeSlicePool lists them all): use a larger slice"
        )
    return size


def slices(net: f.IPNetwork, size: int) -> Iterator[str]:
    """Every slice of `net`, in address order, as upstream writes them."""
    for sub in net.subnets(new_prefix=size):
        yield str(sub)


def first_free(allocations: list[tuple[str, str]], node: str) -> int | None:
    """The index of `node`'s slice if it has one, else of the first slice without a node."""
    for i, (owner, _) in enumerate(allocations):
        if owner == node:
            return i
    for i, (owner, _) in enumerate(allocations):
        if not owner:
            return i
    return None


def slice_of(allocations: list[tuple[str, str]], node: str) -> str | None:
    for owner, cidr in allocations:
        if owner == node:
            return cidr
    return None


def fits(cidr: str, rng: IPRange, size: int) -> f.IPNetwork | None:
    """The slice `cidr` names if it is a /size subnet of the range, else None."""
    try:
        net = ipaddress.ip_network(cidr)
    except ValueError:
        return None
    if net.version != rng.version or net.prefixlen != size or not net.subnet_of(rng.network):  # type: ignore[arg-type]
        return None
    return net


def slice_pool_name(cidr: str, node: str, network_name: str = "") -> str:
    """The IPPool of `node`'s slice `cidr` (canonical), named as upstream names it."""
    return pool_name(cidr, f"{network_name}-{node}" if network_name else node)


def in_slice(rng: IPRange, net: f.IPNetwork, node: str, network_name: str) -> IPRange:
    """The range as `node` allocates from it: the slice's network (pool range and offsets), the
    range's allocatable segments cut to the slice, the range's prefix length for results."""
    lo, hi = usable_bounds(net)
    segments = tuple((max(a, lo), min(b, hi)) for a, b in rng.segments if a <= hi and b >= lo)
    name = slice_pool_name(str(net), node, network_name)
    if not segments:
        raise CniError(
            f"node {node}: its slice {net} of {rng.cidr} has no usable address "
            f"(range_start/range_end, exclude and gateway leave none in it)",
            f"{rng.describe()}; pool {name}",
            code=Code.SLICE_FULL,
        )
    return IPRange(
        net, segments[0][0], segments[-1][1], rng.excludes, segments, rng.network.prefixlen, name
    )


def slice_full(err: CniError, node: str, rng: IPRange) -> CniError:
    """Pool exhaustion inside a node's slice: its own code, naming the node and the slice."""
    return CniError(
        f"node {node}: its slice {rng.cidr} of the range is full ({err.msg})", err.details,
        code=Code.SLICE_FULL,
    )
