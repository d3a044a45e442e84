"""The NetworkAttachmentDefinitions the NVIDIA Network Operator and the SR-IOV Network Operator render
from their CRs, written again in Python from what their templates emit (nothing of theirs is copied):

- MacvlanNetwork: Mellanox/network-operator `manifests/state-macvlan-network/0010-macvlan-net-cr.yml`
  filled by `pkg/state/state_macvlan_network.go` (the ipam string with all whitespace removed, Go's
  strings.Fields joined; `"ipam":{}` without one; master, mode and mtu only when set; the namespace
  `default` when networkNamespace is empty);
- HostDeviceNetwork: `manifests/state-hostdevice-network/0010-hostdevice-net-cr.yml` filled by
  `pkg/state/state_hostdevice_network.go` (the ipam string inserted AS WRITTEN, not stripped; the
  resourceName annotation gets the `nvidia.com/` prefix when it lacks it);
- SriovNetwork: k8snetworkplumbingwg/sriov-network-operator `bindata/manifests/cni-config/sriov/
  sriov-cni-config.yaml` filled by `api/v1/helper.go` RenderNetAttDef (cniVersion 1.0.0 since that
  template's change of 2024-03; `vlan` always, `vlanQoS` whenever 0-7, the others only when set; the
  resource prefix from RESOURCE_PREFIX, `nvidia.com` in the Network Operator's chart).

Each template writes the config as a multi-line single-quoted YAML scalar; the operator decodes that
YAML, so the config is the folded scalar (line breaks become spaces, an empty line a newline). Here the
same text is built and decoded with a YAML parser. `tests/unit/test_netop_examples.py` checks the
SR-IOV output against the operator's own golden file and every conf-examples/network-operator NAD
against its CR. metaPlugins (a conflist) is not rendered here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.examples import EXAMPLES

DIR = EXAMPLES / "network-operator"
KINDS = ("MacvlanNetwork", "HostDeviceNetwork", "SriovNetwork")
NVIDIA_PREFIX = "nvidia.com"


def _stripped(ipam: str) -> str:
    return '"ipam":' + "".join(ipam.split()) if ipam else '"ipam":{}'


def _folded(text: str) -> str:
    """The single-quoted YAML scalar `'text'`, decoded as the operator decodes the rendered manifest."""
    if "'" in text:
        raise ValueError("a single quote in the CR's strings breaks the operator's template too")
    value: str = yaml.safe_load(f"config: '{text}'")["config"]
    return value


def _nad(name: str, namespace: str, config: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": meta,
            "spec": {"config": config}}


def _no_meta_plugins(spec: dict[str, Any]) -> None:
    if spec.get("metaPlugins"):
        raise NotImplementedError("metaPlugins (a conflist) is not rendered here")


def macvlan(cr: dict[str, Any]) -> dict[str, Any]:
    spec, name = cr["spec"], cr["metadata"]["name"]
    _no_meta_plugins(spec)
    options = ""
    if spec.get("master"):
        options += f'"master": "{spec["master"]}",'
    if spec.get("mode"):
        options += f'"mode" : "{spec["mode"]}",'
    if spec.get("mtu"):
        options += f'"mtu" : {int(spec["mtu"])},'
    text = (f'{{\n  "cniVersion":"0.3.1",\n  "name":"{name}",\n  "type":"macvlan",{options}'
            f'{_stripped(spec.get("ipam", ""))}\n}}\n')
    return _nad(name, spec.get("networkNamespace") or "default", _folded(text))


def host_device(cr: dict[str, Any]) -> dict[str, Any]:
    spec, name = cr["spec"], cr["metadata"]["name"]
    _no_meta_plugins(spec)
    resource = spec["resourceName"]
    if not resource.startswith(f"{NVIDIA_PREFIX}/"):
        resource = f"{NVIDIA_PREFIX}/{resource}"
    text = (f'{{\n  "cniVersion":"0.3.1",\n  "name":"{name}",\n  "type":"host-device",\n'
            f'  "ipam":{spec.get("ipam") or "{}"}\n}}\n')
    return _nad(name, spec["networkNamespace"], _folded(text), {"k8s.v1.cni.cncf.io/resourceName": resource})


def sriov(cr: dict[str, Any], resource_prefix: str = NVIDIA_PREFIX) -> dict[str, Any]:
    spec, meta = cr["spec"], cr["metadata"]
    name = meta["name"]
    _no_meta_plugins(spec)
    fields = f'"type":"sriov","vlan":{int(spec.get("vlan", 0))},'
    for key, out in (("spoofChk", "spoofchk"), ("trust", "trust")):
        if spec.get(key) in ("on", "off"):
            fields += f'"{out}":"{spec[key]}",'
    if 0 <= int(spec.get("vlanQoS", 0)) <= 7:
        fields += f'"vlanQoS":{int(spec.get("vlanQoS", 0))},'
    if spec.get("vlanProto"):
        fields += f'"vlanProto":"{spec["vlanProto"]}",'
    for key, out in (("minTxRate", "min_tx_rate"), ("maxTxRate", "max_tx_rate")):
        if spec.get(key) is not None and int(spec[key]) >= 0:
            fields += f'"{out}":{int(spec[key])},'
    if spec.get("capabilities"):
        fields += f'"capabilities":{spec["capabilities"]},'
    if spec.get("linkState") in ("auto", "enable", "disable"):
        fields += f'"link_state":"{spec["linkState"]}",'
    if spec.get("logLevel"):
        fields += f'"logLevel":"{spec["logLevel"]}",'
    if spec.get("logFile"):
        fields += f'"logFile":"{spec["logFile"]}",'
    text = f'{{\n  "cniVersion":"1.0.0",\n  "name":"{name}",{fields}{_stripped(spec.get("ipam", ""))}\n}}'
    owner = f"{cr['kind']}.{cr['apiVersion'].split('/')[0]}/{meta.get('namespace', '')}/{name}"
    annotations = {"k8s.v1.cni.cncf.io/resourceName": f"{resource_prefix}/{spec['resourceName']}",
                   "sriovnetwork.openshift.io/owner-ref": owner}
    return _nad(name, spec.get("networkNamespace") or meta.get("namespace", ""), _folded(text), annotations)


def render(cr: dict[str, Any]) -> dict[str, Any]:
    kinds = {"MacvlanNetwork": macvlan, "HostDeviceNetwork": host_device, "SriovNetwork": sriov}
    return kinds[cr["kind"]](cr)


def crs() -> list[Path]:
    return sorted(p for p in DIR.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] in KINDS)


def nad_of(cr_path: Path) -> Path:
    return cr_path.with_name(f"{cr_path.stem}-nad.yaml")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc
