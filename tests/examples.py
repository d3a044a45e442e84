"""Load every conf-examples file with pycni's own loaders. A plugin or IPAM type that cni.registry does
not have yet (it lands from another branch) is checked against the field list of the reference docs
instead: PENDING_TYPES is that TODO hook, and it turns into the real parse by itself, with no edit, as
soon as the registry has the type (a registered type never reaches the field-list check)."""

from __future__ import annotations

import importlib
import ipaddress
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cni import jsonio
from cni.registry import PLUGINS
from cni.skel import parse_request
from cni.types.netconf import Request

EXAMPLES = Path(__file__).resolve().parent.parent / "conf-examples"
MULTUS_DEVICE = "0000:3b:02.1"  # what Multus injects for a resourceName NAD
PENDING_TYPES = {
    "whereabouts": "ipam.plugin (issue 3 branch)",
    "host-device": "cni.plugins.hostdevice (issue 4 branch)",
    "sriov": "cni.plugins.sriov (issue 4 branch)",
}

STD = {"cniVersion", "name", "type", "ipam", "dns", "capabilities", "runtimeConfig", "args", "prevResult",
       "deviceID", "pciBusID"}  # the last two: injected by Multus for resourceName NADs
FIELDS: dict[str, set[str]] = {  # shared/reference/anchor-behaviour.md §3.1, §4.1, §5.1 and issue 3
    "host-device": STD | {"device", "hwaddr", "kernelpath"},
    "sriov": STD | {"vlan", "vlanQoS", "vlanProto", "mac", "spoofchk", "trust", "link_state", "min_tx_rate",
                    "max_tx_rate", "logLevel", "logFile"},
    "whereabouts": {"type", "range", "range_start", "range_end", "exclude", "ipRanges", "gateway", "routes",
                    "dns", "addresses", "enable_overlapping_ranges", "network_name", "kubernetes",
                    "etcd_host", "etcd_username", "etcd_password", "etcd_key_file", "etcd_cert_file",
                    "etcd_ca_cert_file", "log_file", "log_level", "configuration_path", "datastore",
                    "local_db", "reconciler_cron_expression", "leader_lease_duration",
                    "leader_renew_deadline", "leader_retry_period", "sleep_for_race"},
}


def request(conf: dict[str, Any]) -> Request:
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "example", "CNI_NETNS": "/run/netns/pycni-example-none",
           "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=example;K8S_POD_UID=u1"}
    return parse_request("ADD", env, jsonio.dumps(conf))


def _real_loader(kind: str) -> Callable[[Request], object]:
    module = importlib.import_module(PLUGINS[kind])
    classes = [v for v in vars(module).values() if isinstance(v, type) and hasattr(v, "from_request")]
    own = [c for c in classes if c.__module__ == module.__name__]
    loader: Callable[[Request], object] = (own or classes)[0].from_request
    return loader


def _cidr(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{where}: not a string")
    ipaddress.ip_network(value.split("-")[-1] if "-" in value else value, strict=False)


def field_check(kind: str, conf: dict[str, Any]) -> None:
    """The TODO-hook check for a type not in the registry yet: known fields only, basic shapes."""
    unknown = set(conf) - FIELDS[kind]
    if unknown:
        raise ValueError(f"{kind}: unknown fields {sorted(unknown)}")
    if kind == "whereabouts":
        ranges = [conf] if "range" in conf else list(conf.get("ipRanges", []))
        if not ranges:
            raise ValueError("whereabouts: range or ipRanges is required")
        for i, r in enumerate(ranges):
            _cidr(r["range"], f"ipRanges[{i}].range")
            for j, ex in enumerate(r.get("exclude", [])):
                _cidr(ex, f"exclude[{j}]")
    if kind == "sriov" and not 0 <= int(conf.get("vlan", 0)) <= 4094:
        raise ValueError("sriov: vlan out of range")


def load_plugin(conf: dict[str, Any]) -> object:
    kind = conf["type"]
    if kind in PLUGINS:
        return _real_loader(kind)(request(conf))
    if kind not in PENDING_TYPES:
        raise ValueError(f"{kind}: neither registered nor pending")
    field_check(kind, conf)
    return None


def load_ipam(ipam: dict[str, Any], flat_files: tuple[str, ...]) -> object:
    if ipam.get("type") != "whereabouts":
        return None  # a reference IPAM (host-local): exercised by the e2e run
    if "whereabouts" in PLUGINS:
        config = importlib.import_module("ipam.config")
        return config.load(ipam, flat_files)
    field_check("whereabouts", ipam)
    return None


def nads() -> list[Path]:
    return sorted(p for p in (EXAMPLES / "kubernetes").glob("*.yaml")
                  if yaml.safe_load(p.read_text())["kind"] == "NetworkAttachmentDefinition")


def conflists() -> list[Path]:
    return sorted((EXAMPLES / "local").glob("*.conflist"))


def nad_config(path: Path) -> dict[str, Any]:
    """The NAD's config as the delegate receives it, with what Multus injects for resourceName."""
    nad = yaml.safe_load(path.read_text())
    conf: dict[str, Any] = jsonio.loads(nad["spec"]["config"], str(path))
    if "k8s.v1.cni.cncf.io/resourceName" in nad["metadata"].get("annotations", {}):
        conf["deviceID"] = MULTUS_DEVICE
        if conf["type"] == "host-device":
            conf["pciBusID"] = MULTUS_DEVICE
    return conf
