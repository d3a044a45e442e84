"""Load every conf-examples file with pycni's own loaders (the plugin's config class, the IPAM's
config.load)."""

from __future__ import annotations

import importlib
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


def load_plugin(conf: dict[str, Any]) -> object:
    kind = conf["type"]
    if kind not in PLUGINS:
        raise ValueError(f"{kind}: not a pycni plugin")
    return _real_loader(kind)(request(conf))


def load_ipam(ipam: dict[str, Any], flat_files: tuple[str, ...]) -> object:
    if ipam.get("type") != "whereabouts":
        return None  # a reference IPAM (host-local): exercised by the e2e run
    from ipam import config

    return config.load(ipam, flat_files)


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
