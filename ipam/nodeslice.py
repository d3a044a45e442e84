"""Which slice this node allocates from (ipam.slices), resolved before the engine runs: the config's one
range becomes the slice's range (its pool, offsets and name; ipam.slices.in_slice), so the engine
allocates, releases, checks and collects in that pool exactly as in any other.

Who assigns: the plugin, on the ADD that first needs a slice (upstream's node-slice-controller, where
it runs, does the same; a node's first ADD must not wait for it). Read the NodeSlicePool
(`network_name`, else the CNI config's `name`); absent: create it with every slice and this node in
the first; present and this node without a slice: give it the first free slice (upstream's rules),
compare-and-swap on resourceVersion, so concurrent assigners (other nodes, the controller) never hand
one slice out twice. A controller started later keeps every assignment of a node with a Node object.

DEL, CHECK and GC never assign: a node without a slice has nothing in any slice pool."""

from __future__ import annotations

import threading
import time

from cni import log
from cni.errors import CniError, Code, ConfigError
from cni.types import fields as f
from cni.types.valueclass import replace
from ipam import slices
from ipam.config import IpamConfig
from ipam.retry import Retry, retrying
from ipam.store.base import Store
from ipam.store.nodeslices import NodeSlicePools, allocations, assigned, new_object, spec

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any


def pool_name_of(conf: IpamConfig, cni_name: str) -> str:
    """The NodeSlicePool's name: network_name, else the CNI network's name (upstream's getSliceName)."""
    return conf.network_name or cni_name


def api_for(store: Store) -> NodeSlicePools:
    from ipam.store.kube import KubeStore  # loaded already when the datastore is kubernetes

    if not isinstance(store, KubeStore):
        raise ConfigError("ipam.node_slice_size: node slices need the kubernetes datastore")
    return NodeSlicePools(store.client, store.namespace, store.role)


def resolve(
    conf: IpamConfig, store: Store, cni_name: str, node: str, assign: bool, retry: Retry | None = None
) -> IpamConfig:
    """`conf` with its range replaced by this node's slice; no range at all when the node has no slice
    and `assign` is off. Code 108 when the node has none and none is free."""
    if not node:
        raise ConfigError("ipam.node_slice_size: the node's name is unknown (set NODENAME)")
    api = api_for(store)
    name = pool_name_of(conf, cni_name)
    rng = conf.ranges[0]
    size = slices.parse_size(conf.node_slice_size, rng.network, "ipam.node_slice_size")

    def attempt() -> str | None:
        obj = api.get(name)
        if obj is None:
            if not assign:
                return None
            cuts = list(slices.slices(rng.network, size))
            fresh = new_object(name, api.namespace, rng.cidr, conf.node_slice_size, cuts)
            api.create(assigned(fresh, 0, node))  # Conflict: someone made it meanwhile; read again
            log.info("NodeSlicePool %s created: node %s has slice %s", name, node, cuts[0])
            return cuts[0]
        held = allocations(obj)
        mine = slices.slice_of(held, node)
        if mine is not None:
            return _checked(mine, obj, name, node, conf, size)
        if not assign:
            return None
        _same_spec(obj, name, conf)
        index = slices.first_free(held, node)
        if index is None:
            raise CniError(
                f"node {node}: no slice of {rng.cidr} in NodeSlicePool {name}: all {len(held)} "
                f"/{size} slices are assigned to other nodes",
                "a slice is freed when its node's Node object is deleted (node-slice-controller); "
                "or use a larger range or smaller slices",
                code=Code.NO_SLICE,
            )
        api.update(assigned(obj, index, node))  # Conflict: changed meanwhile; read again
        log.info("NodeSlicePool %s: node %s assigned slice %s", name, node, held[index][1])
        return held[index][1]

    server = api.client.conf.server
    key = (server, api.namespace, name, node, rng.cidr, conf.node_slice_size)
    found = _Known.get(key)
    if found is None:
        found = retrying(retry or Retry(), f"node slice of {node} in {name}", attempt)
        if found is not None:
            _Known.put(key, found)
    if found is None:
        return replace(conf, ranges=())
    net = slices.fits(found, rng, size)
    assert net is not None  # _checked or built by us
    return replace(conf, ranges=(slices.in_slice(rng, net, node, conf.network_name),))


class _Known:
    """This node's slice as this process last read or assigned it, for KEEP seconds: the agent's calls
    then skip reading the NodeSlicePool (a node keeps its slice while its Node object exists; a NAD
    with another range or slice size is another key). A plugin process makes one call: no effect."""

    KEEP = 10.0
    lock = threading.Lock()
    slices: dict[tuple[str, ...], tuple[float, str]] = {}

    @classmethod
    def get(cls, key: tuple[str, ...]) -> str | None:
        with cls.lock:
            hit = cls.slices.get(key)
        return hit[1] if hit is not None and time.monotonic() - hit[0] < cls.KEEP else None

    @classmethod
    def put(cls, key: tuple[str, ...], cidr: str) -> None:
        with cls.lock:
            cls.slices[key] = (time.monotonic(), cidr)


def _same_spec(obj: dict[str, Any], name: str, conf: IpamConfig) -> None:
    """Ours never assigns in a NodeSlicePool made for another range or size (the controller re-slices)."""
    have = spec(obj)
    want = (conf.ranges[0].cidr, conf.node_slice_size)
    if have != want:
        raise ConfigError(
            f"ipam.node_slice_size: NodeSlicePool {name} slices range {have[0]!r} by {have[1]!r}, "
            f"this config {want[0]!r} by {want[1]!r}",
            "every NetworkAttachmentDefinition of one network must agree; the node-slice-controller "
            "re-slices when a NAD changes",
        )


def _checked(cidr: str, obj: dict[str, Any], name: str, node: str, conf: IpamConfig, size: int) -> str:
    if slices.fits(cidr, conf.ranges[0], size) is None:
        have = spec(obj)
        raise ConfigError(
            f"ipam.node_slice_size: NodeSlicePool {name} gives node {node} slice {cidr!r}, not a "
            f"/{size} slice of {conf.ranges[0].cidr} (it slices {have[0]!r} by {have[1]!r})",
        )
    return cidr


def requested_in_slice(
    conf: IpamConfig, mine: IpamConfig, store: Store, cni_name: str, node: str, address: f.IPAddress,
    path: str,
) -> None:  # fmt: skip
    """A requested address (valid for the whole range) must lie in this node's slice (`mine`): else
    code 7 naming the slice it lies in and the node that slice is assigned to (the NodeSlicePool)."""
    slice_range = mine.ranges[0]
    if address in slice_range.network:
        return
    holder, cidr = "", ""
    obj = retrying(Retry(), f"reading NodeSlicePool {pool_name_of(conf, cni_name)}",
                   lambda: api_for(store).get(pool_name_of(conf, cni_name)))  # fmt: skip
    for owner, text in allocations(obj) if obj is not None else []:
        net = slices.fits(text, conf.ranges[0], slice_range.network.prefixlen)
        if net is not None and address in net:
            holder, cidr = owner, text
            break
    whose = f"node slice {cidr} of node {holder}" if holder else f"node slice {cidr}, assigned to no node"
    raise ConfigError(
        f"{path}: {address} is in {whose}, not in this node's ({node}: {slice_range.cidr})",
        "with node_slice_size a requested address must lie in the slice of the node the pod runs on",
    )
