"""whereabouts-compatible IPAM configuration (stub: the store part first; the rest follows)."""

from __future__ import annotations

from dataclasses import dataclass, field

DATASTORES = ("local", "kubernetes", "etcd")
DEFAULT_LOCAL_DB = "/var/lib/cni/pycni/whereabouts.db"


@dataclass(frozen=True)
class KubernetesConf:
    kubeconfig: str = ""
    k8s_api_root: str = ""  # parsed, unused (as upstream)


@dataclass(frozen=True)
class EtcdConf:
    host: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    key_file: str = ""
    cert_file: str = ""
    ca_cert_file: str = ""


@dataclass(frozen=True)
class StoreConfig:
    """Which store and how to reach it. `datastore` is one of DATASTORES."""

    datastore: str = "local"
    local_db: str = DEFAULT_LOCAL_DB
    kubernetes: KubernetesConf = field(default_factory=KubernetesConf)
    etcd: EtcdConf = field(default_factory=EtcdConf)
