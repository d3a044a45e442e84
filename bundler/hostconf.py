"""Files the installer writes into the CNI conf dir for the IPAM, whereabouts-compatible paths:

    whereabouts.d/whereabouts.conf        flat file: datastore + where the kubeconfig is (host paths)
    whereabouts.d/whereabouts.kubeconfig  server, CA file and `tokenFile` (never an embedded token)
    whereabouts.d/pycni-sa-token          copy of the projected service-account token, refreshed as it
    whereabouts.d/pycni-ca.crt            rotates (the kubeconfig points at these files)
    whereabouts.d/nodename                the node name

All 0600, written atomically. Paths inside the files are host paths: the installer usually runs in a
container with the host's conf dir mounted at /host/etc/cni/net.d."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cni import jsonio

SUBDIR = "whereabouts.d"
FLAT = f"{SUBDIR}/whereabouts.conf"
KUBECONFIG = f"{SUBDIR}/whereabouts.kubeconfig"
TOKEN = f"{SUBDIR}/pycni-sa-token"
CA = f"{SUBDIR}/pycni-ca.crt"
NODENAME = f"{SUBDIR}/nodename"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
RECONCILER_CRON = "30 4 * * *"


@dataclass(frozen=True)
class KubeSettings:
    server: str
    namespace: str
    token_file: Path  # the projected token inside the installer's pod
    ca_file: Path | None
    skip_tls_verify: bool = False


@dataclass(frozen=True)
class HostConf:
    host_conf_dir: str  # the conf dir as the host (and so the IPAM) sees it
    datastore: str  # kubernetes | local | none
    node_name: str
    kube: KubeSettings | None


def server_from_env(env: dict[str, str] | os._Environ[str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{env.get('KUBERNETES_SERVICE_PROTOCOL', 'https')}://{host}:{port}"


def host_path(conf: HostConf, rel: str) -> str:
    return f"{conf.host_conf_dir.rstrip('/')}/{rel}"


def kubeconfig(conf: HostConf, kube: KubeSettings) -> bytes:
    cluster: dict[str, object] = {"server": kube.server}
    if kube.skip_tls_verify:
        cluster["insecure-skip-tls-verify"] = True
    elif kube.ca_file is not None:
        cluster["certificate-authority"] = host_path(conf, CA)
    doc = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "pycni", "cluster": cluster}],
        "users": [{"name": "pycni", "user": {"tokenFile": host_path(conf, TOKEN)}}],
        "contexts": [{"name": "pycni", "context": {"cluster": "pycni", "user": "pycni",
                                                    "namespace": kube.namespace}}],
        "current-context": "pycni",
    }
    return jsonio.dumps(doc, indent=True) + b"\n"  # JSON is YAML: every kubeconfig reader takes it


def flat_file(conf: HostConf) -> bytes:
    doc: dict[str, object] = {"datastore": conf.datastore, "configuration_path": host_path(conf, SUBDIR)}
    if conf.datastore == "kubernetes":
        doc["kubernetes"] = {"kubeconfig": host_path(conf, KUBECONFIG)}
        doc["reconciler_cron_expression"] = RECONCILER_CRON
    return jsonio.dumps(doc, indent=True) + b"\n"


def desired(conf: HostConf) -> dict[str, bytes]:
    """Every file (relative to the conf dir) and its exact content. Reads the current token and CA."""
    if conf.datastore == "none":
        return {}
    files = {FLAT: flat_file(conf)}
    if conf.node_name:
        files[NODENAME] = conf.node_name.encode()
    kube = conf.kube
    if conf.datastore == "kubernetes" and kube is not None:
        files[TOKEN] = kube.token_file.read_bytes()
        if kube.ca_file is not None and not kube.skip_tls_verify:
            files[CA] = kube.ca_file.read_bytes()
        files[KUBECONFIG] = kubeconfig(conf, kube)
    return files
