"""A real kube-apiserver (v1.36.2 from ../shared/upstream) for tests and benchmarks.

`KubeServer.start()` runs `kube-up` (etcd + kube-apiserver on 127.0.0.1, RBAC on, the whereabouts and
NetworkAttachmentDefinition CRDs installed; ~5 s) and `stop()` runs `kube-down` on exactly that state
directory. Tests share one server per session (tests/conftest.py `kube`) and isolate themselves with a
fresh namespace each (`Tenant`): a namespace deletion never finishes on this server (no namespace
controller), so namespaces are only ever created.

A `Tenant` is one namespace set up as a node is: `bundler/manifests/rbac.yaml` applied as shipped (only
the namespace substituted, and the cluster-scoped names suffixed so tenants do not share a binding),
ServiceAccounts `pycni-node` and `pycni-reconciler`, and for each a kubeconfig whose user is a `tokenFile`
holding a TokenRequest token: the plugin and the reconciler authenticate exactly as in a cluster.

Admin requests (setting up, reading objects behind the code's back) go through `KubeServer.request`, a
plain http.client call with the admin token: not through the code under test.

The server lives only on loopback; nothing here touches a network interface."""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

REPO = Path(__file__).resolve().parent.parent


def _shared() -> Path:
    """../shared next to the checkout; for a linked git worktree, next to its main checkout too."""
    if os.environ.get("PYCNI_SHARED"):
        return Path(os.environ["PYCNI_SHARED"])
    near = REPO.parent / "shared"
    dotgit = REPO / ".git"
    if not near.exists() and dotgit.is_file():  # "gitdir: MAIN/.git/worktrees/NAME"
        gitdir = Path(dotgit.read_text().partition("gitdir:")[2].strip())
        if gitdir.parent.name == "worktrees" and (gitdir.parents[2].parent / "shared").exists():
            return gitdir.parents[2].parent / "shared"
    return near


SHARED = _shared()
UPSTREAM = SHARED / "upstream"
RBAC_YAML = REPO / "bundler" / "manifests" / "rbac.yaml"
IPAMCLAIM_CRD = UPSTREAM / "ipamclaims" / "k8s.cni.cncf.io_ipamclaims.yaml"  # not installed by kube-up
ABSENT_REASON = f"{UPSTREAM} is absent (the real kube-apiserver and upstream binaries live there)"
NODE_SA, RECONCILER_SA = "pycni-node", "pycni-reconciler"
SHIPPED_NAMESPACE = "pycni-system"
PLURALS = {"Role": "roles", "RoleBinding": "rolebindings", "ClusterRole": "clusterroles",
           "ClusterRoleBinding": "clusterrolebindings"}  # the kinds rbac.yaml ships (KubeServer.create_all)
_counter = itertools.count()


def shared_missing(*names: str) -> str:
    """Why the named entries of ../shared/upstream cannot be used here ("" when they can): ABSENT_REASON
    when ../shared/upstream is absent altogether (tests/skips.py allows that skip then), else which are
    missing (no skip allows that: a ../shared that is there is whole)."""
    if not UPSTREAM.exists():
        return ABSENT_REASON
    missing = [n for n in names if not (UPSTREAM / n).exists()]
    return f"{', '.join(missing)} missing from {UPSTREAM}" if missing else ""


def absent() -> str:
    """Why the real server cannot run here ("" when it can)."""
    reason = shared_missing("kube-up")
    if reason:
        return reason
    for tool in ("etcd", "kubectl"):
        if not any(Path(d, tool).exists() for d in os.environ.get("PATH", "").split(os.pathsep)):
            return f"{tool} is not installed (make deps installs it)"
    return ""


def unpack(*names: str) -> Path:
    """The directory holding the named upstream binaries, decompressed and checked."""
    out = subprocess.run(
        [str(UPSTREAM / "unpack"), *names], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(out.splitlines()[-1])


class ApiFailure(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


class KubeServer:
    def __init__(self, state: Path) -> None:
        self.dir = state
        env = dict(
            line.split("=", 1) for line in (state / "env").read_text().splitlines() if "=" in line
        )
        self.url = env["APISERVER_URL"]
        self.ca_file = env["CA_FILE"]
        self.admin_token = env["ADMIN_TOKEN"]
        self.admin_kubeconfig = Path(env["KUBECONFIG"])
        self.etcd_endpoint = env["ETCD_ENDPOINT"]
        self.pid = int(env["KUBE_APISERVER_PID"])
        self.etcd_pid = int(env.get("ETCD_PID") or 0)
        self._ssl = ssl.create_default_context(cafile=self.ca_file)
        self._host = urlsplit(self.url)

    @classmethod
    def start(cls, parent: Path | None = None) -> KubeServer:
        env = dict(os.environ)
        if parent is not None:
            env["UP_TMPDIR"] = str(parent)
        try:
            proc = subprocess.run(
                [str(UPSTREAM / "kube-up")], capture_output=True, text=True, env=env, check=False, timeout=300
            )
        except BaseException:  # interrupted (SIGTERM, a timeout): kube-up may have started etcd and the
            if parent is not None:  # apiserver (nohup) before run() killed it: stop what its directory names
                for started in parent.glob("kube-up.*"):
                    subprocess.run([str(UPSTREAM / "kube-down"), str(started)], capture_output=True,
                                   check=False)  # fmt: skip
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"kube-up failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return cls(Path(proc.stdout.strip().splitlines()[-1]))

    def stop(self) -> None:
        subprocess.run([str(UPSTREAM / "kube-down"), str(self.dir)], capture_output=True, check=False)

    def restart_apiserver(self, down: float = 0.0) -> None:
        """Stop the kube-apiserver (SIGTERM), wait `down` seconds, start it again with the same command
        line (same port and etcd: every object stays), wait until it is ready. The new process is
        recorded in the state directory's pids, so `stop` (kube-down) stops it."""
        with open(f"/proc/{self.pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(self.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(down)
        with open(self.dir / "kube-apiserver.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                    start_new_session=True)  # fmt: skip
        with open(self.dir / "pids", "a") as f:
            f.write(f"{proc.pid}\n")
        self.pid = proc.pid
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.request("GET", "/readyz", raw=True).strip() == "ok":
                    return
            except (RuntimeError, ApiFailure):  # (request: RuntimeError when it cannot connect)
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kube-apiserver not ready again after 60 s")
            time.sleep(0.1)

    # ---- admin requests -----------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
        token: str | None = None, content_type: str = "application/json", raw: bool = False,
    ) -> Any:
        """One request as admin (or with `token`); the decoded JSON (raw: the text). ApiFailure on >= 400."""
        conn = http.client.HTTPSConnection(
            self._host.hostname or "127.0.0.1", self._host.port, context=self._ssl, timeout=60
        )
        headers = {"Authorization": f"Bearer {token or self.admin_token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path + ("?" + urlencode(query) if query else ""), data, headers)
            resp = conn.getresponse()
            text = resp.read().decode()
        except (OSError, http.client.HTTPException) as e:  # ssl.SSLError is an OSError
            raise RuntimeError(f"{method} {path}: {e!r}; {self.liveness()}") from e
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                detail: Any = json.loads(text)
            except ValueError:
                detail = text
            raise ApiFailure(resp.status, detail)
        if raw:
            return text
        return json.loads(text) if text else {}

    def liveness(self) -> str:
        """What a failed connection says about the server (a TLS error from a port nobody listens on is
        the client's own connection to itself): its processes alive or not, the end of its log."""
        alive = {name: _alive(pid) for name, pid in (("kube-apiserver", self.pid), ("etcd", self.etcd_pid))}
        try:
            tail = (self.dir / "kube-apiserver.log").read_text(errors="replace").splitlines()[-5:]
        except OSError as e:
            tail = [f"(no log: {e})"]
        return f"alive: {alive}; the apiserver's log ends:\n" + "\n".join(tail)

    def create(self, path: str, obj: dict[str, Any], strict: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = self.request("POST", path, obj,
                                              query={"fieldValidation": "Strict"} if strict else None)
        return result

    def namespace(self, prefix: str = "t") -> str:
        """A fresh namespace with its `default` ServiceAccount (no controller makes it here)."""
        name = f"{prefix}-{os.getpid()}-{next(_counter)}"
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        self.create("/api/v1/namespaces", ns)
        self.service_account(name, "default")
        return name

    def service_account(self, namespace: str, name: str) -> None:
        try:
            self.create(
                f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            )
        except ApiFailure as e:
            if e.status != 409:
                raise

    def token(self, namespace: str, sa: str, seconds: int = 3600) -> str:
        doc = self.create(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}},
        )
        return str(doc["status"]["token"])

    def kubeconfig(self, path: Path, namespace: str, token_file: Path | None = None,
                   token: str | None = None) -> Path:
        """A kubeconfig onto this server; the user is `tokenFile` (or an inline token), 0600."""
        user: dict[str, Any] = {"tokenFile": str(token_file)} if token_file else {"token": token}
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [
                {"name": "k", "cluster": {"server": self.url, "certificate-authority": self.ca_file}}
            ],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": namespace}}],
        }
        _write_private(path, json.dumps(doc, indent=1))
        return path

    def await_allowed(self, namespace: str, sa: str, resource: str, group: str,
                      timeout: float = 60.0) -> None:
        """Until the server's authorizer lets ServiceAccount `sa` get `resource` in `namespace` (a
        SubjectAccessReview): RBAC objects just created take effect once its cache has seen them."""
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]
        spec = {"user": f"system:serviceaccount:{namespace}:{sa}", "groups": groups,
                "resourceAttributes": {"namespace": namespace, "verb": "get", "group": group,
                                       "resource": resource}}
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        deadline = time.monotonic() + timeout
        while not self.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)["status"].get(
                "allowed"):
            assert time.monotonic() < deadline, f"{sa} in {namespace} may not get {resource} in {timeout} s"
            time.sleep(0.05)

    def create_all(self, yaml_text: str) -> None:
        """Create every object of a multi-document YAML (namespaced or cluster-scoped RBAC kinds) as
        admin, validated strictly by the server (unknown and duplicate fields refused). One request
        each: `kubectl apply` cost a process, discovery and an OpenAPI fetch per Tenant."""
        import yaml

        for doc in yaml.safe_load_all(yaml_text):
            if not doc:
                continue
            ns = doc["metadata"].get("namespace")
            where = f"/namespaces/{ns}" if ns else ""
            self.create(f"/apis/{doc['apiVersion']}{where}/{PLURALS[doc['kind']]}", doc, strict=True)

    # ---- CRDs beyond kube-up's -----------------------------------------------------------------

    def install_crd(self, path: Path, timeout: float = 60.0) -> None:
        """Create the CRD of YAML file `path` (kept when it exists) and wait until it is served."""
        import yaml

        crd = yaml.safe_load(path.read_text())
        try:
            self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        except ApiFailure as e:
            if e.status != 409:
                raise
        self._await_served(crd, True, timeout)

    def remove_crd(self, path: Path, timeout: float = 60.0) -> None:
        """Delete the CRD of YAML file `path` (with every object of it) and wait until it is not served."""
        import yaml

        crd = yaml.safe_load(path.read_text())
        try:
            self.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                   f"{crd['metadata']['name']}")  # fmt: skip
        except ApiFailure as e:
            if e.status != 404:
                raise
        self._await_served(crd, False, timeout)

    def _await_served(self, crd: dict[str, Any], served: bool, timeout: float) -> None:
        spec = crd["spec"]
        path = f"/apis/{spec['group']}/{spec['versions'][0]['name']}/{spec['names']['plural']}"
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", path, query={"limit": "1"})
                now = True
            except ApiFailure as e:
                if e.status != 404:
                    raise
                now = False
            if now == served:
                return
            assert time.monotonic() < deadline, f"{path} still {'not ' if served else ''}served"
            time.sleep(0.1)

    # ---- figures ------------------------------------------------------------------------------

    def metrics(self) -> str:
        text: str = self.request("GET", "/metrics", raw=True)
        return text

    def request_counts(self, text: str = "") -> dict[tuple[str, ...], float]:
        """apiserver_request_total summed per (verb, resource, code), of `text` (a /metrics page already
        fetched) or of the page now."""
        return metric_sums(text or self.metrics(), "apiserver_request_total", ("verb", "resource", "code"))

    def storage_counts(self, text: str = "") -> dict[tuple[str, ...], float]:
        """etcd_requests_total per (operation, resource): what the server asked etcd. A write the
        server had to redo (the object changed under it meanwhile) is one more update."""
        return metric_sums(text or self.metrics(), "etcd_requests_total", ("operation", "resource"))

    def termination_counts(self, text: str = "") -> dict[tuple[str, ...], float]:
        """apiserver_request_terminations_total per (verb, resource, code): the requests the server
        answered itself, in self-defense: 504 from its timeout filter (the request ran past its
        deadline, 60 s or the client's `timeout`), 429. The handler behind such a 504 goes on and records
        its own code in apiserver_request_total, mostly 500, not 504."""
        return metric_sums(text or self.metrics(), "apiserver_request_terminations_total",
                           ("verb", "resource", "code"))

    def cpu_seconds(self) -> float:
        """CPU time (user + system) the API server process has used so far."""
        return process_cpu_seconds(self.pid)

    def etcd_cpu_seconds(self) -> float:
        """CPU time (user + system) its etcd has used so far (0 when unknown)."""
        return process_cpu_seconds(self.etcd_pid) if self.etcd_pid else 0.0


def metric_sums(text: str, name: str, labels: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """The counter `name` of a Prometheus text page summed per the values of `labels` ("" for a label a
    series lacks)."""
    out: dict[tuple[str, ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line[: line.rindex("}")]))
        key = tuple(found.get(label, "") for label in labels)
        out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def process_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Tenant:
    """One namespace set up as shipped: RBAC from bundler/manifests/rbac.yaml, the node's and the
    reconciler's ServiceAccounts, and a tokenFile kubeconfig for each (0600, in `where`)."""

    def __init__(self, server: KubeServer, where: Path, prefix: str = "t") -> None:
        self.server = server
        self.namespace = server.namespace(prefix)
        where.mkdir(parents=True, exist_ok=True)
        server.create_all(shipped_rbac(self.namespace))
        self.kubeconfigs: dict[str, Path] = {}
        for sa in (NODE_SA, RECONCILER_SA):
            server.service_account(self.namespace, sa)
            token_file = where / f"{sa}.token"
            _write_private(token_file, server.token(self.namespace, sa))
            self.kubeconfigs[sa] = server.kubeconfig(
                where / f"{sa}.kubeconfig", self.namespace, token_file=token_file
            )
        self.admin_kubeconfig = server.kubeconfig(
            where / "admin.kubeconfig", self.namespace, token=server.admin_token
        )
        for sa in (NODE_SA, RECONCILER_SA):  # a Role and a ClusterRole each: both bindings in effect
            server.await_allowed(self.namespace, sa, "ippools", "whereabouts.cni.cncf.io")
            server.await_allowed(self.namespace, sa, "pods", "")

    @property
    def node(self) -> Path:
        return self.kubeconfigs[NODE_SA]

    @property
    def reconciler(self) -> Path:
        return self.kubeconfigs[RECONCILER_SA]

    def path(self, resource: str, name: str = "", group: str = "whereabouts.cni.cncf.io",
             version: str = "") -> str:
        """The REST path of a namespaced resource here (core group: group="")."""
        root = f"/apis/{group}/{version or 'v1alpha1'}" if group else f"/api/{version or 'v1'}"
        return f"{root}/namespaces/{self.namespace}/{resource}" + (f"/{name}" if name else "")

    def objects(self, resource: str, group: str = "whereabouts.cni.cncf.io") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.server.request("GET", self.path(resource, group=group))["items"]
        return items

    def pools(self) -> dict[str, dict[str, Any]]:
        """name -> spec.allocations of every IPPool in the namespace."""
        return {o["metadata"]["name"]: o["spec"].get("allocations") or {} for o in self.objects("ippools")}

    def reservations(self) -> dict[str, dict[str, Any]]:
        return {o["metadata"]["name"]: o["spec"] for o in self.objects("overlappingrangeipreservations")}

    def write_pool(self, name: str, cidr: str, allocations: dict[str, Any]) -> int:
        """IPPool `name` (range `cidr`) written as admin, holding exactly `allocations` (entries as the CRD
        has them) and no field tracking (as pycni's writes leave a pool): created if absent, two requests
        however many entries. Returns the size in bytes of the object as the server answers it (a GET
        answers the same). ApiFailure when the server refuses it (500: too large for etcd)."""
        obj = {"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool", "metadata": {"name": name},
               "spec": {"range": cidr, "allocations": {}}}  # fmt: skip
        try:
            self.server.create(self.path("ippools"), obj)
        except ApiFailure as e:
            if e.status != 409:
                raise
        from ipam.store.kube import JSON_PATCH, UNTRACKED  # (what pycni's own pool writes send)

        ops = [{"op": "add", "path": "/spec/allocations", "value": allocations}, UNTRACKED]
        text: str = self.server.request("PATCH", self.path("ippools", name), ops, raw=True,
                                        content_type=JSON_PATCH)
        return len(text.encode())

    def create_pod(self, name: str, uid_hint: str = "", node: str = "node-a",
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace}
        if annotations:
            meta["annotations"] = annotations
        pod = {
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [{"name": "c", "image": "busybox"}]},
        }
        return self.server.create(self.path("pods", group=""), pod)

    def delete_pod(self, name: str) -> None:
        try:
            self.server.request("DELETE", self.path("pods", name, group=""), {"gracePeriodSeconds": 0})
        except ApiFailure as e:
            if e.status != 404:
                raise


def shipped_rbac(namespace: str) -> str:
    """bundler/manifests/rbac.yaml for `namespace`: the namespace substituted, cluster-scoped names
    (ClusterRole, ClusterRoleBinding) suffixed with it. Rules and subjects are left as shipped."""
    text = RBAC_YAML.read_text()
    out = []
    for doc in text.split("\n---\n"):
        named = doc
        if re.search(r"^kind: Cluster", doc, re.M):
            # metadata.name and (bindings) roleRef.name sit at two spaces; subjects' names deeper
            named = re.sub(r"^(  name: pycni-[a-z]+)$", rf"\1-{namespace}", doc, flags=re.M)
        out.append(named.replace(SHIPPED_NAMESPACE, namespace))
    return "\n---\n".join(out)


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


class Forwarder:
    """The server's loopback port inside a network namespace: a listener on 127.0.0.1:<port> there
    (made from a thread that entered the namespace; the socket stays in it) whose connections are
    spliced to 127.0.0.1:<port> of this process' namespace. Code running in a test's host namespace
    (Multus, the IPAM) then reaches the server at its own URL, certificate names unchanged."""

    def __init__(self, server: KubeServer, netns: str) -> None:
        self.port = urlsplit(server.url).port or 443
        self.netns = netns if netns.startswith("/") else f"/run/netns/{netns}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        made: list[socket.socket | BaseException] = []

        def listen() -> None:
            try:
                fd = os.open(self.netns, os.O_RDONLY)
                try:
                    os.setns(fd, os.CLONE_NEWNET)  # this thread only
                finally:
                    os.close(fd)
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", self.port))
                s.listen(64)
                s.settimeout(0.2)
                made.append(s)
            except BaseException as e:  # handed to the constructor
                made.append(e)

        t = threading.Thread(target=listen)
        t.start()
        t.join()
        if isinstance(made[0], BaseException):
            raise made[0]
        self._listener = made[0]
        self._spawn(self._accept)

    def _spawn(self, target: Any, *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(None)
            try:
                upstream = socket.create_connection(("127.0.0.1", self.port))
            except OSError:
                conn.close()
                continue
            pair = _Pair(conn, upstream)
            self._spawn(pair.pipe, conn, upstream)
            self._spawn(pair.pipe, upstream, conn)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


class _Pair:
    """Two spliced sockets: each direction half-closes the other side at EOF; an error shuts both
    down (so the other direction wakes), and the second direction to end closes both."""

    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.sockets = (a, b)
        self.lock = threading.Lock()
        self.ended = 0

    def pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
        with self.lock:
            self.ended += 1
            last = self.ended == 2
        if last:
            for s in self.sockets:
                s.close()


def stranger_kubeconfig(tenant: Tenant, path: Path) -> Path:
    """A tokenFile kubeconfig for the namespace's `default` ServiceAccount, which rbac.yaml grants
    nothing: every request of the code is refused (403) for it."""
    token_file = path.with_name(path.name + ".token")
    _write_private(token_file, tenant.server.token(tenant.namespace, "default"))
    return tenant.server.kubeconfig(path, tenant.namespace, token_file=token_file)
