"""Import cost of the Kubernetes store on the plugin's path (every CNI call is a fresh process): an ADD on
the kube store loads ipam.kubeapi over the stdlib HTTP layer (ipam.httpconn), never a client library
(kubernetes, urllib3, requests) nor PyYAML for a JSON kubeconfig; other stores load nothing of it. The
kube ADD runs against the session's real kube-apiserver (HTTPS, a ServiceAccount token file), as on a
node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cni import jsonio
from tests.kubeup import Tenant
from tests.nsutil import REPO

# client stacks the plugin's path must never load (ipam.httpconn is sockets + ssl)
HEAVY = ("http", "email", "kubernetes", "urllib3", "requests", "oauthlib", "requests_oauthlib", "yaml",
         "certifi")
# stdlib modules the plugin's path stopped importing, each a cost of every call (docs/benchmarks.md):
# typing (type checking only: TYPE_CHECKING; Allocation a collections.namedtuple,
# Protocols plain base classes at run time), random (loaded when a retry or a spread first needs a
# number), urllib.parse (ipam.httpconn's split_url, quote, urlencode), the idna codec (ASCII host names
# reach getaddrinfo and TLS as bytes), threading (_thread's locks); hashlib is imported on first use
# (ipam.digest). ssl, socket and json are the public modules again (issue 27: ipam.tls, cni.jsonio; their
# cost is in docs/benchmarks.md, "Public modules"); ssl imports base64. A local store's ADD loads no ssl, no
# base64 (ours is binascii) nor hashlib.
DROPPED = ("typing", "random", "urllib", "encodings.idna", "stringprep", "unicodedata", "threading")


def add(tmp: Path, store: dict[str, Any], cid: str) -> list[str]:
    flat = tmp / "whereabouts.conf"
    flat.write_text("{}")
    ipam = {"type": "whereabouts", "range": "198.51.100.0/24", "configuration_path": str(flat),
            "local_db": str(tmp / "ipam.db"), **store}
    conf = {"cniVersion": "1.1.0", "name": "imp", "type": "macvlan", "ipam": ipam}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(PYTHONPATH=str(REPO), CNI_COMMAND="ADD", CNI_CONTAINERID=cid, CNI_NETNS="/run/netns/none",
               CNI_IFNAME="net1", CNI_PATH="/usr/lib/cni", NODENAME="n",
               CNI_ARGS="K8S_POD_NAMESPACE=a;K8S_POD_NAME=p")  # fmt: skip
    p = subprocess.run(
        [sys.executable, "-S", "-X", "importtime", "-m", "cni", "whereabouts"],  # no site: as frozen
        input=jsonio.dumps(conf), env=env, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout
    return [
        line.rsplit("|", 1)[1].strip()
        for line in p.stderr.decode().splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    ]


def test_kube_add_loads_only_the_stdlib_http_layer(tenant: Tenant, tmp_path: Path) -> None:
    mods = add(tmp_path, {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}}, "c1")
    # (modules loaded with importlib.import_module, as ipam.store.select does, are not listed)
    assert {"ipam.kubeapi", "ipam.httpconn", "ipam.tls", "ssl", "_ssl"} <= set(mods)
    assert [m for m in mods if m.split(".")[0] in HEAVY] == []
    assert [m for m in mods if m in DROPPED or m.split(".")[0] in DROPPED] == []
    assert "ipam.claims" not in mods  # only a config with allowPersistentIPs loads it (issue 46)
    assert list(tenant.pools()) == ["198.51.100.0-24"]  # the ADD did reach the server


def test_local_add_loads_nothing_of_the_client(tmp_path: Path) -> None:
    mods = add(tmp_path, {"datastore": "local", "local_db": str(tmp_path / "ipam.db")}, "c2")
    assert [
        m for m in mods if m.split(".")[0] in HEAVY or m.startswith(("ipam.kubeapi", "ipam.store.kube"))
    ] == []
    local = (*DROPPED, "ssl", "_ssl", "base64", "hashlib", "_hashlib")
    assert [m for m in mods if m in local or m.split(".")[0] in DROPPED] == []
