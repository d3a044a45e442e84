"""whereabouts-compatible IPAM configuration. Parsing is pure: `read_flat_file` is the only I/O, `merge`
and `from_dict` are functions of their arguments, and every error is code 7 naming the field.

Keys are whereabouts' own (snake_case, `ipRanges`). Ours: `datastore: local` and `local_db`. Which store
serves a config (`store_config`, `merge`): `datastore` when given, else the one its settings imply
(`kubernetes.kubeconfig`, else `etcd_host`), the inline config deciding before the flat file; with
neither, the call fails (`NoStoreError`): the node-local store is never a silent default. Accepted
and ignored: `leader_lease_duration`, `leader_renew_deadline`, `leader_retry_period` (we elect no
leader) and `sleep_for_race` (a test knob upstream); `answer_before_write` (an opt-in of earlier pycni
releases, removed since every call is as fast answered after its pool write: docs/ipam.md), when a
boolean. `node_slice_size` (node slices, ipam.slices) needs the kubernetes datastore and exactly one
range."""

from __future__ import annotations

import os
from collections.abc import Mapping

from cni import jsonio
from cni.errors import ConfigError, DecodeError
from cni.types import fields as f
from cni.types.result import DNS, Route, parse_dns, parse_route
from cni.types.valueclass import field, valueclass
from ipam import ranges
from ipam.ranges import IPRange

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

DATASTORES = ("local", "kubernetes", "etcd")
DEFAULT_LOCAL_DB = "/var/lib/cni/pycni/whereabouts.db"
FLAT_FILES = (
    "/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
)
ETCD_KEYS = tuple(
    f"etcd_{k}" for k in ("host", "username", "password", "key_file", "cert_file", "ca_cert_file")
)


@valueclass
class KubernetesConf:
    kubeconfig: str = ""
    k8s_api_root: str = ""  # parsed, unused (as upstream)


@valueclass
class EtcdConf:
    host: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    key_file: str = ""
    cert_file: str = ""
    ca_cert_file: str = ""


@valueclass
class StoreConfig:
    """Which store and how to reach it. `datastore` is one of DATASTORES."""

    datastore: str = "local"
    local_db: str = DEFAULT_LOCAL_DB
    kubernetes: KubernetesConf = field(default_factory=KubernetesConf)
    etcd: EtcdConf = field(default_factory=EtcdConf)


@valueclass
class StaticAddress:
    address: f.IPInterface
    gateway: f.IPAddress | None = None


@valueclass
class IpamConfig:
    ranges: tuple[IPRange, ...]
    gateway: f.IPAddress | None = None
    routes: tuple[Route, ...] = ()
    dns: DNS = field(default_factory=DNS)
    addresses: tuple[StaticAddress, ...] = ()
    overlapping: bool = True
    network_name: str = ""
    store: StoreConfig = field(default_factory=StoreConfig)
    log_file: str = ""
    log_level: str = ""
    reconciler_cron_expression: str = ""
    node_slice_size: str = ""  # as written (upstream compares it as a string); ipam.slices.parse_size


class NoStoreError(ConfigError):
    """No store is configured: no `datastore`, `kubernetes.kubeconfig` or `etcd_host` in the ipam config
    or a flat file. `load`/`load_store` add which flat files were looked for."""


def flat_file_paths(inline: Mapping[str, Any], candidates: tuple[str, ...] = FLAT_FILES) -> tuple[str, ...]:
    """Where the flat file is looked for, in order: inline `configuration_path` (a file, or a directory
    holding whereabouts.conf), then `candidates`."""
    first = inline.get("configuration_path")
    if isinstance(first, str) and first:
        return (os.path.join(first, "whereabouts.conf") if os.path.isdir(first) else first, *candidates)
    return candidates


def read_flat_file(
    inline: Mapping[str, Any], candidates: tuple[str, ...] = FLAT_FILES
) -> tuple[str, dict[str, Any]]:
    """(path, object) of the first flat file that exists (`flat_file_paths`). ("", {}) when there is
    none."""
    for path in flat_file_paths(inline, candidates):
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            raise ConfigError(f"flat file {path}: cannot read: {e.strerror}") from None
        try:
            obj = jsonio.loads(data, f"flat file {path}") if data.strip() else {}
        except DecodeError as e:
            raise ConfigError(e.msg, e.details) from None
        if not isinstance(obj, dict):
            raise ConfigError(f"flat file {path}: must be a JSON object")
        return path, obj
    return "", {}


def _empty(value: Any) -> bool:
    return value is None or value is False or value == 0 or value in ("", [], {})


def merge(inline: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flat-file values fill what the inline config leaves empty (recursively); inline wins. The flat
    file's enable_overlapping_ranges is ignored, as upstream: inline or the default (true) decides.
    The store is the inline config's when it names or implies one (`datastore`, else
    `kubernetes.kubeconfig`, else `etcd_host`): a NAD's kubeconfig is never served from the store a
    flat file's `datastore` names."""
    out = _merge(inline, flat)
    implied = _implied(inline)
    if _empty(inline.get("datastore")) and implied:
        out["datastore"] = implied
    return out


def _merge(inline: Mapping[str, Any], flat: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(inline)
    for key, value in flat.items():
        if key == "enable_overlapping_ranges":
            continue
        mine = out.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            out[key] = _merge(mine, value)
        elif _empty(mine):
            out[key] = value
    return out


def _implied(d: Mapping[str, Any]) -> str:
    """The store a config's settings imply without `datastore` ("" for none)."""
    kube = d.get("kubernetes")
    if isinstance(kube, dict) and not _empty(kube.get("kubeconfig")):
        return "kubernetes"
    return "etcd" if not _empty(d.get("etcd_host")) else ""


def from_dict(d: dict[str, Any], path: str = "ipam") -> IpamConfig:
    """Every field parsed and checked; the store last, so a config naming no store (NoStoreError) is
    otherwise valid."""
    gateway = _gateway(d, path)
    parsed = _ranges(d, path, gateway)
    routes = f.opt(d, "routes", list, path, [])
    overlapping = bool(f.opt(d, "enable_overlapping_ranges", bool, path, True))
    return IpamConfig(
        ranges=parsed,
        gateway=gateway,
        routes=tuple(parse_route(r, f.join(f.join(path, "routes"), i)) for i, r in enumerate(routes)),
        dns=parse_dns(d.get("dns"), f.join(path, "dns")),
        addresses=_addresses(d, path),
        overlapping=overlapping,
        network_name=_network_name(d, path),
        log_file=f.opt(d, "log_file", str, path, ""),
        log_level=f.opt(d, "log_level", str, path, ""),
        reconciler_cron_expression=f.opt(d, "reconciler_cron_expression", str, path, ""),
        store=(store := store_config(d, path)),
        node_slice_size=_node_slice_size(d, path, parsed, store),
    )
    f.opt(d, "answer_before_write", bool, path, False)  # removed: accepted (a boolean) and ignored


def _node_slice_size(d: dict[str, Any], path: str, parsed: tuple[IPRange, ...], store: StoreConfig) -> str:
    """`node_slice_size` as written, once valid for this config ("" when unset, as upstream)."""
    value = d.get("node_slice_size")
    if value in (None, ""):
        return ""
    where = f.join(path, "node_slice_size")
    from ipam import slices

    slices.parse_size(value, parsed[0].network, where)
    if store.datastore != "kubernetes":
        raise ConfigError(
            f"{where}: node slices live in the NodeSlicePool CRD: needs the kubernetes datastore, "
            f"not {store.datastore}"
        )
    if len(parsed) != 1:
        raise ConfigError(f"{where}: node slices take exactly one range, this config has {len(parsed)}")
    return str(value)


def _gateway(d: dict[str, Any], path: str) -> f.IPAddress | None:
    value = d.get("gateway")
    return None if value in (None, "") else f.ip(value, f.join(path, "gateway"))


def _one_range(entry: dict[str, Any], path: str, gateway: f.IPAddress | None) -> IPRange:
    net, start, end = ranges.parse_range(f.req(entry, "range", str, path), f.join(path, "range"))
    if start is not None and (entry.get("range_start") or entry.get("range_end")):
        raise ConfigError(
            f"{f.join(path, 'range')}: start-end/prefix notation conflicts with range_start/range_end"
        )
    for key in ("range_start", "range_end"):
        if entry.get(key) not in (None, ""):
            value = f.ip(entry[key], f.join(path, key))
            start, end = (value, end) if key == "range_start" else (start, value)
    items = f.opt(entry, "exclude", list, path, [])
    excludes = tuple(
        ranges.parse_exclude(x, net, f.join(f.join(path, "exclude"), i)) for i, x in enumerate(items)
    )
    return ranges.build(net, start, end, excludes, gateway, path)


def _ranges(d: dict[str, Any], path: str, gateway: f.IPAddress | None) -> tuple[IPRange, ...]:
    out: list[IPRange] = []
    if d.get("range") not in (None, ""):
        out.append(_one_range(d, path, gateway))
    for i, entry in enumerate(f.opt(d, "ipRanges", list, path, [])):
        epath = f.join(f.join(path, "ipRanges"), i)
        f.typed(entry, dict, epath)
        rng = _one_range(entry, epath, gateway)
        for other in out:
            if other.version == rng.version and other.network.overlaps(rng.network):
                raise ConfigError(
                    f"{f.join(epath, 'range')}: {rng.cidr} overlaps {other.cidr} of this config"
                )
        out.append(rng)
    if not out:
        raise ConfigError(f"{f.join(path, 'range')}: required (or ipRanges)")
    return tuple(out)


def _addresses(d: dict[str, Any], path: str) -> tuple[StaticAddress, ...]:
    out = []
    for i, item in enumerate(f.opt(d, "addresses", list, path, [])):
        ipath = f.join(f.join(path, "addresses"), i)
        f.typed(item, dict, ipath)
        address = f.cidr(f.req(item, "address", str, ipath), f.join(ipath, "address"))
        out.append(StaticAddress(address, _gateway(item, ipath)))
    return tuple(out)


def _network_name(d: dict[str, Any], path: str) -> str:
    name = f.opt(d, "network_name", str, path, "")
    # (NAME_PATTERN as re.match took it, as it always has: "$" lets one trailing newline through)
    if name and not f.valid_name(name.removesuffix("\n")):
        raise ConfigError(
            f"{f.join(path, 'network_name')}: invalid characters in {f.show(name)} "
            f"(allowed: {f.NAME_PATTERN})"
        )
    return str(name)


def store_config(d: dict[str, Any], path: str = "ipam") -> StoreConfig:
    """Only the store part of an ipam section (the operator CLI needs no range)."""
    kube = f.opt(d, "kubernetes", dict, path, {})
    kpath = f.join(path, "kubernetes")
    k = KubernetesConf(f.opt(kube, "kubeconfig", str, kpath, ""), f.opt(kube, "k8s_api_root", str, kpath, ""))
    e = EtcdConf(*(f.opt(d, key, str, path, "") for key in ETCD_KEYS))
    default = "kubernetes" if k.kubeconfig else "etcd" if e.host else ""
    datastore = f.choice(d, "datastore", path, DATASTORES, default) if default else _chosen(d, path)
    if datastore == "kubernetes" and not k.kubeconfig:
        raise NoStoreError(f"{f.join(kpath, 'kubeconfig')}: required when the datastore is kubernetes")
    if datastore == "etcd" and not e.host:
        raise NoStoreError(f"{f.join(path, 'etcd_host')}: required when the datastore is etcd")
    local_db = f.opt(d, "local_db", str, path, "") or DEFAULT_LOCAL_DB
    if not os.path.isabs(local_db):
        raise ConfigError(f"{f.join(path, 'local_db')}: must be an absolute path, got {f.show(local_db)}")
    return StoreConfig(datastore, local_db, k, e)


def _chosen(d: dict[str, Any], path: str) -> str:
    """`datastore` as written, when no setting implies a store: the only way to the local store."""
    if _empty(d.get("datastore")):
        also = " (local_db is set: add \"datastore\": \"local\" to use it)" if d.get("local_db") else ""
        raise NoStoreError(
            f"{f.join(path, 'datastore')}: no store configured: no datastore, kubernetes.kubeconfig or "
            f"etcd_host in the ipam config or a flat file{also}",
            LOCAL_IS_EXPLICIT,
        )
    return str(f.choice(d, "datastore", path, DATASTORES, ""))


LOCAL_IS_EXPLICIT = (
    'the node-local store serves a config only when chosen: "datastore": "local" in the ipam config '
    "or the flat file (its addresses are unique on this node only)"
)


def load(ipam: Mapping[str, Any], candidates: tuple[str, ...] = FLAT_FILES) -> IpamConfig:
    """The plugin's entry: flat file found and merged, then parsed."""
    return _merged(ipam, candidates, from_dict)


def load_store(ipam: Mapping[str, Any], candidates: tuple[str, ...] = FLAT_FILES) -> StoreConfig:
    """The store part of `load` (the operator CLI and the reconciler: no range needed)."""
    return _merged(ipam, candidates, store_config)


def _merged[T](
    ipam: Mapping[str, Any], candidates: tuple[str, ...], parse: Callable[[dict[str, Any]], T]
) -> T:
    flat_path, flat = read_flat_file(ipam, candidates)
    try:
        return parse(merge(ipam, flat))
    except ConfigError as e:
        raise _located(e, ipam, candidates, flat_path) from None


def _located(
    e: ConfigError, ipam: Mapping[str, Any], candidates: tuple[str, ...], flat_path: str
) -> ConfigError:
    """`e` naming the flat file it was merged with; with no store configured and no flat file, every
    path looked at."""
    if isinstance(e, NoStoreError):
        where = f"merged with flat file {flat_path}" if flat_path else _looked_at(ipam, candidates)
        e.details = f"{where}; {e.details}" if e.details else where
    elif flat_path:
        where = f"merged with flat file {flat_path}"
        e.details = f"{e.details}; {where}" if e.details else where
    return e


def _looked_at(ipam: Mapping[str, Any], candidates: tuple[str, ...]) -> str:
    paths = flat_file_paths(ipam, candidates)
    if not paths:
        return "no flat file looked for"
    given = ipam.get("configuration_path")
    first = f" (the first from configuration_path {f.show(given)})" if paths != candidates else ""
    return f"no flat file at {', '.join(paths)}{first}"
