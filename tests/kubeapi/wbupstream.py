"""Upstream whereabouts v0.9.4 (the real binaries from ../shared/upstream) and ours, installed side by
side on one test "node" of the real kube-apiserver (tests/kubeup.py), serving the same networks.

- `Implementation`: one IPAM plugin as installed: the NAD's config plus that installation's flat file
  (`configuration_path`, as its installer would write it). Ours runs in this process through skel
  (tests/concurrency/harness.run_inline, the code of `python -m cni whereabouts`); upstream's binary
  is executed. Upstream takes its per-call Lease, so its kubeconfig is the admin's (the shipped RBAC
  grants our service accounts no leases).
- `ControlLoop`: upstream's ip-control-loop. It only knows in-cluster config and fixed paths (the SA
  token under /var/run/secrets, the flat file under /host/etc/cni/net.d), so it runs chrooted into a
  directory under the test's tmp_path, in a private mount namespace (the binary is bind-mounted in):
  nothing is written outside tmp_path.

Nothing here creates a network namespace or touches an interface: IPAM calls need none."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from tests import kubeup
from tests.concurrency.harness import run_inline

NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def cni_env(command: str, cid: str, ifname: str, pod: str, uid: str, node: str) -> dict[str, str]:
    ns, name = pod.split("/")
    args = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID={cid}"
    return {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": "/run/netns/none",
        "CNI_IFNAME": ifname,
        "CNI_PATH": "/usr/lib/cni",
        "NODENAME": node,
        "CNI_ARGS": f"{args};K8S_POD_UID={uid}",
    }


def admin_kubeconfig(server: kubeup.KubeServer, path: Path, namespace: str) -> Path:
    """An admin kubeconfig with the CA inline (usable inside the control loop's chroot)."""
    ca = base64.b64encode(Path(server.ca_file).read_bytes()).decode()
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server.url, "certificate-authority-data": ca}}],
        "users": [{"name": "u", "user": {"token": server.admin_token}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": namespace}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    path.chmod(0o600)
    return path


# Upstream takes a Lease around every IPAM operation (its plugin's and its ip-control-loop's), with
# defaults of 1.5 s lease, 1 s renew deadline, 0.5 s retry. On a loaded 2-core machine its client's rate
# limiter can hold a renewal past the deadline: the lease is lost mid-operation, the control loop drops
# the rest of a deleted pod's cleanup (one range of a dual-stack pod freed, the other kept) and never
# retries it. Its flat files here set the documented whereabouts fields as an operator of a loaded
# cluster would; ours accepts and ignores them.
UPSTREAM_LEADER = {"leader_lease_duration": 15000, "leader_renew_deadline": 10000, "leader_retry_period": 500}


class Implementation:
    def __init__(self, name: str, flat: Path, kubeconfig: Path, binary: Path | None = None) -> None:
        """`binary` None: ours, in this process."""
        self.name, self.flat, self.binary = name, flat, binary
        flat.parent.mkdir(parents=True, exist_ok=True)
        doc = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)},
               "local_db": str(flat.parent / "state" / "whereabouts.db"),  # ours: node-local state in tmp
               **(UPSTREAM_LEADER if binary is not None else {})}
        flat.write_text(json.dumps(doc))

    def conf(self, nad_conf: dict[str, Any], **extra: Any) -> dict[str, Any]:
        return {**nad_conf, "ipam": {**nad_conf["ipam"], "configuration_path": str(self.flat)}, **extra}

    def call(self, env: dict[str, str], nad_conf: dict[str, Any], **extra: Any) -> tuple[int, Any]:
        conf = self.conf(nad_conf, **extra)
        if self.binary is None:
            return run_inline(env, conf)
        proc = subprocess.run(
            [str(self.binary)], input=json.dumps(conf).encode(), capture_output=True, timeout=120,
            env={**env, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, check=False,
        )
        text = proc.stdout.decode().strip()
        try:
            out: Any = json.loads(text) if text else None
        except ValueError:
            out = {"stdout": text[-2000:]}
        if proc.returncode != 0:
            out = {"upstream-error": out, "stderr": proc.stderr.decode(errors="replace")[-3000:]}
        return proc.returncode, out


class ControlLoop:
    """upstream's ip-control-loop for one node, chrooted into `root` (see the module docstring)."""

    def __init__(self, server: kubeup.KubeServer, namespace: str, node: str, root: Path) -> None:
        self.server, self.namespace, self.node, self.root = server, namespace, node, root
        self.log = root.parent / "ip-control-loop.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def _layout(self) -> None:
        sa = self.root / "var/run/secrets/kubernetes.io/serviceaccount"
        sa.mkdir(parents=True, exist_ok=True)
        (sa / "token").write_text(self.server.admin_token)
        (sa / "ca.crt").write_bytes(Path(self.server.ca_file).read_bytes())
        (sa / "namespace").write_text(self.namespace)
        conf_dir = self.root / "host/etc/cni/net.d/whereabouts.d"
        admin_kubeconfig(self.server, conf_dir / "whereabouts.kubeconfig", self.namespace)
        flat = {
            "datastore": "kubernetes",
            "configuration_path": "/etc/cni/net.d/whereabouts.d",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
            **UPSTREAM_LEADER,
        }
        (conf_dir / "whereabouts.conf").write_text(json.dumps(flat))
        (self.root / "ip-control-loop").touch()

    def start(self, deadline: float = 30) -> None:
        self._layout()
        binary = kubeup.unpack("whereabouts-controller") / "whereabouts-controller"
        host, port = self.server.url.removeprefix("https://").rsplit(":", 1)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port,
            "NODENAME": self.node, "WHEREABOUTS_NAMESPACE": self.namespace,
        }
        script = 'mount --bind "$0" "$1/ip-control-loop" && exec chroot "$1" /ip-control-loop'
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(binary),
                 str(self.root)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        end = time.monotonic() + deadline
        while "starting network controller" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"ip-control-loop did not start:\n{self.tail()}")
            time.sleep(0.1)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n: int = 40) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # it does not act on SIGTERM; it keeps no state worth a clean exit
            self.proc.wait(10)


def create_node(server: kubeup.KubeServer, name: str) -> None:
    """The Node object the control loop insists on (cluster-scoped: name it per test)."""
    try:
        server.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
    except kubeup.ApiFailure as e:
        if e.status != 409:
            raise


def create_nad(tenant: kubeup.Tenant, conf: dict[str, Any]) -> None:
    nad = {
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": conf["name"], "namespace": tenant.namespace},
        "spec": {"config": json.dumps(conf)},
    }
    tenant.server.create(tenant.path("network-attachment-definitions", group="k8s.cni.cncf.io",
                                     version="v1"), nad)


def set_network_status(tenant: kubeup.Tenant, pod: str, entries: list[tuple[str, str, list[str]]]) -> None:
    """The annotation as Multus writes it: the default network, then (nad, interface, ips) each."""
    status: list[dict[str, Any]] = [
        {"name": "default", "interface": "eth0", "ips": ["198.18.255.10"], "default": True}
    ]
    status += [
        {"name": f"{tenant.namespace}/{nad}", "interface": ifname, "ips": ips, "default": False}
        for nad, ifname, ips in entries
    ]
    tenant.server.request(
        "PATCH", tenant.path("pods", pod, group=""),
        {"metadata": {"annotations": {NETWORK_STATUS: json.dumps(status)}}},
        content_type="application/merge-patch+json",
    )
