"""The Kubernetes API as the IPAM uses it: a kubeconfig, and JSON requests over one kept-alive
connection of ipam.httpconn (sockets + TLS: ipam.tls), shared by the CRD store (ipam.store.kube) and the
pod source (ipam.kubepods). Not the `kubernetes` client: its REST layer alone (urllib3) costs every
plugin process more than all of this (figures: docs/benchmarks.md).

Kubeconfig (JSON, else YAML through PyYAML): the current context's cluster, user and namespace
(upstream whereabouts' rule: the context namespace, `kube-system` when empty). Cluster: `server`,
`certificate-authority(-data)`, `insecure-skip-tls-verify`, `tls-server-name`, `proxy-url`. User:
`token`, `tokenFile` (re-read once when the server answers 401: the kubelet rotates projected tokens;
awaited to change, TOKEN_WAIT, while it still holds the refused token), `client-certificate(-data)`,
`client-key(-data)`, `username`/`password`, `exec` (`exec_token`, the ExecCredential protocol).
Relative paths are relative to the kubeconfig; `auth-provider` is refused; secrets are never logged.
`"kubeconfig": "in-cluster"` (IN_CLUSTER) takes the pod's own ServiceAccount as client-go's
`rest.InClusterConfig()` does (`in_cluster_config`).

Requests have bounded timeouts (connect, read) and no hidden retries of writes; the callers map
`ApiError` (an HTTP status) and `Unreachable` (no answer) to their own errors."""

from __future__ import annotations

import binascii  # base64's functions without base64.py, which imports re (every call on this store)
import os

from cni import jsonio, log
from cni.errors import ConfigError
from cni.types.valueclass import field, valueclass
from ipam.httpconn import Connection, SlowAnswer, describe, quote, urlencode
from ipam.tls import Context, client_context, skip_verify

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

DEFAULT_NAMESPACE = "kube-system"  # upstream whereabouts' default (wbNamespaceFromCtx)
IN_CLUSTER = "in-cluster"  # the kubeconfig value naming the pod's own ServiceAccount (in_cluster_config)
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = (3.0, 10.0)  # connect, read: seconds per request
# A 401 with a token file that still holds the refused token: how long to wait for a new one. On a node
# the installer's copy of its pod's token stops working the moment that pod is deleted (bound tokens die
# with their pod), and the next installer pod writes its own once it has started: a DaemonSet rollout.
TOKEN_WAIT = 30.0
TOKEN_POLL = 0.2
FIELD = "kubernetes.kubeconfig"


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}" + (f": {message}" if message else ""))
        self.status, self.reason, self.message = status, reason, message


class Unreachable(Exception):
    """No answer: connection refused, TLS failure, timeout."""


class Busy(Unreachable):
    """The server took the request but did not answer within the read timeout (overloaded)."""


@valueclass(frozen=False)
class KubeConfig:
    """What one context of a kubeconfig says; data fields already decoded to PEM text."""

    path: str
    server: str
    namespace: str = DEFAULT_NAMESPACE
    ca_file: str = ""
    ca_data: str = ""
    insecure: bool = False
    tls_server_name: str = ""
    proxy: str = ""
    cert_file: str = ""
    key_file: str = ""
    cert_data: str = ""
    key_data: str = ""
    token: str = field(default="", repr=False)
    token_file: str = ""
    username: str = ""
    password: str = field(default="", repr=False)
    exec: dict[str, Any] | None = field(default=None, repr=False)


def _parse(data: bytes, path: str) -> dict[str, Any]:
    try:
        doc = jsonio.loads(data, path)
    except Exception:
        import yaml

        try:
            doc = yaml.safe_load(data)
        except yaml.YAMLError as e:
            raise ConfigError(f"{FIELD}: {path} is neither JSON nor YAML", str(e)) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{FIELD}: {path} is not a kubeconfig (expected a mapping)")
    return doc


def _named(doc: dict[str, Any], key: str, name: str, inner: str, path: str) -> dict[str, Any]:
    for item in doc.get(key) or []:
        if isinstance(item, dict) and item.get("name") == name:
            value = item.get(inner) or {}
            if not isinstance(value, dict):
                break
            return value
    raise ConfigError(f"{FIELD}: {path} has no {inner} named {name!r}")


def _b64(value: Any, what: str, path: str) -> str:
    try:
        return binascii.a2b_base64(str(value).encode("ascii")).decode()  # base64.b64decode(value)
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{FIELD}: {path}: {what} is not base64 PEM") from None


def in_cluster_config(env: dict[str, str] | os._Environ[str], sa_dir: str = SA_DIR) -> KubeConfig:
    """The pod's ServiceAccount, as client-go's rest.InClusterConfig() has it (module doc). ConfigError
    naming what is missing when this is not a pod."""
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigError(f"{FIELD}: {IN_CLUSTER}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are "
                          "not both set (not in a pod?)")
    token = os.path.join(sa_dir, "token")
    if not os.path.isfile(token):
        raise ConfigError(f"{FIELD}: {IN_CLUSTER}: no ServiceAccount token at {token} "
                          "(automountServiceAccountToken off?)")
    try:
        with open(os.path.join(sa_dir, "namespace"), encoding="utf-8") as fh:
            namespace = fh.read().strip()
    except OSError:
        namespace = ""
    ca = os.path.join(sa_dir, "ca.crt")
    if ":" in host and not host.startswith("["):  # net.JoinHostPort
        host = f"[{host}]"
    return KubeConfig(path=IN_CLUSTER, server=f"https://{host}:{port}",
                      namespace=namespace or DEFAULT_NAMESPACE, ca_file=ca if os.path.isfile(ca) else "",
                      token_file=token)


def load_kubeconfig(path: str) -> KubeConfig:
    """Read `path` (the current context), or the pod's ServiceAccount when `path` is IN_CLUSTER.
    Raises ConfigError naming the field."""
    if path == IN_CLUSTER:
        return in_cluster_config(os.environ)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise ConfigError(f"{FIELD}: cannot read {path}: {e.strerror}") from None
    doc = _parse(data, path)
    base = os.path.dirname(os.path.abspath(path))

    def rel(p: Any) -> str:
        return os.path.join(base, str(p)) if p else ""

    current = doc.get("current-context")
    if not current:
        contexts = doc.get("contexts") or []
        if len(contexts) != 1:
            raise ConfigError(f"{FIELD}: {path} has no current-context")
        current = contexts[0].get("name")
    ctx = _named(doc, "contexts", str(current), "context", path)
    cluster = _named(doc, "clusters", str(ctx.get("cluster", "")), "cluster", path)
    user = _named(doc, "users", str(ctx.get("user", "")), "user", path) if ctx.get("user") else {}
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise ConfigError(f"{FIELD}: {path}: cluster server {server!r} is not an http(s) URL")
    if user.get("auth-provider"):
        raise ConfigError(f"{FIELD}: {path}: auth-provider plugins are not supported (use exec or a token)")
    conf = KubeConfig(
        path=path,
        server=server,
        namespace=str(ctx.get("namespace") or DEFAULT_NAMESPACE),
        ca_file=rel(cluster.get("certificate-authority")),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=str(cluster.get("tls-server-name") or ""),
        proxy=str(cluster.get("proxy-url") or ""),
        cert_file=rel(user.get("client-certificate")),
        key_file=rel(user.get("client-key")),
        token=str(user.get("token") or ""),
        token_file=rel(user.get("tokenFile")),
        username=str(user.get("username") or ""),
        password=str(user.get("password") or ""),
        exec=user.get("exec") if isinstance(user.get("exec"), dict) else None,
    )
    if cluster.get("certificate-authority-data"):
        conf.ca_data = _b64(cluster["certificate-authority-data"], "certificate-authority-data", path)
    if user.get("client-certificate-data"):
        conf.cert_data = _b64(user["client-certificate-data"], "client-certificate-data", path)
    if user.get("client-key-data"):
        conf.key_data = _b64(user["client-key-data"], "client-key-data", path)
    return conf


def tls_context(conf: KubeConfig, client_cert: str | None, client_key: str | None) -> Context:
    """The server checked against the kubeconfig's CA (system CAs without one; nothing when insecure);
    the client certificate when given. ConfigError naming the field when a file cannot be loaded."""
    try:
        ctx = client_context(cafile=conf.ca_file or None, cadata=conf.ca_data or None)
    except OSError as e:  # ssl.SSLError included
        raise ConfigError(f"{FIELD}: {conf.path}: certificate-authority: {describe(e)}") from None
    if conf.insecure:  # the kubeconfig asks for it: honoured, and logged (ipam.tls.skip_verify)
        skip_verify(ctx, f"{conf.path}: insecure-skip-tls-verify")
    if client_cert or client_key:
        try:
            ctx.load_cert_chain(client_cert or "", client_key)
        except OSError as e:
            raise ConfigError(f"{FIELD}: {conf.path}: client-certificate/client-key: {describe(e)}") from None
    return ctx


class Client:
    """One kept-alive connection onto the API server (ipam.httpconn). Used by one thread at a time."""

    def __init__(self, conf: KubeConfig, timeout: tuple[float, float] = TIMEOUT) -> None:
        self.conf, self.timeout = conf, timeout
        self.received = 0  # bytes of the last answer's body (a pool's size as stored: ipam.store.kube)
        self._tmp = ""
        tls = None
        if conf.server.startswith("https://"):
            cert, key = self._pem(conf.cert_file, conf.cert_data), self._pem(conf.key_file, conf.key_data)
            tls = tls_context(conf, cert, key)
        self.http = Connection(
            conf.server, tls, timeout[0], timeout[1], server_name=conf.tls_server_name, proxy=conf.proxy
        )
        self._auth = ""
        self.token_wait = TOKEN_WAIT
        self._authorize(initial=True)

    def _pem(self, path: str, data: str) -> str | None:
        """A client certificate or key given inline: written to a private 0600 file (ssl needs a path)."""
        if path:
            return path
        if not data:
            return None
        import tempfile  # only for inline client certificates: not on a token's path

        if not self._tmp:
            self._tmp = tempfile.mkdtemp(prefix="pycni-kube-")
        fd, name = tempfile.mkstemp(dir=self._tmp)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        return name

    def _authorize(self, initial: bool = False) -> None:
        """Set the Authorization header from the kubeconfig: a token, its file (re-read), exec, basic."""
        conf = self.conf
        if conf.token_file:
            try:
                with open(conf.token_file) as fh:
                    token = fh.read().strip()
            except OSError as e:
                raise ConfigError(
                    f"{FIELD}: {conf.path}: tokenFile {conf.token_file}: {e.strerror}"
                ) from None
            self._auth = f"Bearer {token}"
        elif conf.token:
            self._auth = f"Bearer {conf.token}"
        elif conf.exec is not None:
            self._auth = f"Bearer {exec_token(conf)}"
        elif conf.username and initial:
            raw = f"{conf.username}:{conf.password}".encode()
            self._auth = "Basic " + binascii.b2a_base64(raw, newline=False).decode()

    def _await_new_token(self, refused: str) -> None:
        """The token file still holds the token the server refused: re-read it until it changes, at most
        `token_wait` seconds (TOKEN_WAIT); the caller then tries once more either way."""
        import time

        deadline = time.monotonic() + self.token_wait
        while time.monotonic() < deadline:
            time.sleep(TOKEN_POLL)
            self._authorize()
            if self._auth != refused:
                log.info("kubernetes: %s: a new token after a 401", self.conf.token_file)
                return

    def target(self, path: str, query: dict[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return path + ("?" + urlencode(q) if q else "")

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        """Send one request; the decoded JSON answer. Raises ApiError or Unreachable. A 401 re-reads the
        credentials (token file, exec plugin) once and tries again; a token file still holding the
        refused token is first awaited to change (TOKEN_WAIT). `content_type`: of the body
        (default application/json; a JSON Patch is application/json-patch+json)."""
        for attempt in (0, 1):
            status, data = self._send(method, self.target(path, query), body, content_type)
            if status == 401 and attempt == 0 and (self.conf.token_file or self.conf.exec is not None):
                refused = self._auth
                self._authorize()
                if self.conf.token_file and self._auth == refused:
                    self._await_new_token(refused)
                continue
            break
        self.received = len(data)
        doc = _decoded(data, f"{method} {path}")
        if status >= 400:
            raise _error(status, doc, data)
        if not isinstance(doc, dict):
            raise ApiError(status, "BadResponse", f"{method} {path}: expected a JSON object")
        return doc

    def watch(self, path: str, query: dict[str, Any] | None = None,
              opened: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
        """A watch (`watch=1` added to `query`): its events ({"type", "object"}) as they come, until the
        server ends the answer. ApiError for an error status (410 Gone: a resourceVersion too old),
        Unreachable when the connection fails or a read waits longer than the read timeout (set it
        above the watch's timeoutSeconds). A 401 re-reads the credentials once, as `request`. `opened`
        is called once the server accepted the watch (before its first event, which may be minutes
        away on a quiet node)."""
        target = self.target(path, {**(query or {}), "watch": "1"})
        for attempt in (0, 1):
            try:
                status, lines = self.http.stream(target, self._headers("pycni-agent"))
                if status == 401 and attempt == 0 and (self.conf.token_file or self.conf.exec is not None):
                    self.http.close()
                    self._authorize()
                    continue
                if status >= 400:
                    data = b"".join(lines)
                    raise _error(status, _decoded(data, f"GET {path}"), data)
                if opened is not None:
                    opened()
                for line in lines:
                    event = jsonio.loads(line, f"watch {path}")
                    if isinstance(event, dict):
                        yield event
                return
            except SlowAnswer as e:
                raise Busy(f"{self.conf.server}: {describe(e)}") from None
            except OSError as e:
                raise Unreachable(f"{self.conf.server}: {describe(e)}") from None
            finally:
                self.http.close()

    def _headers(self, agent: str) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": agent}
        if self._auth:
            headers["Authorization"] = self._auth
        return headers

    def _send(self, method: str, target: str, body: Any, content_type: str = "") -> tuple[int, bytes]:
        headers, data = self._headers("pycni-ipam"), None
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
            data = body if isinstance(body, bytes) else jsonio.dumps(body)
        try:
            return self.http.request(method, target, data, headers)
        except SlowAnswer as e:
            raise Busy(f"{self.conf.server}: {describe(e)}") from None
        except OSError as e:
            raise Unreachable(f"{self.conf.server}: {describe(e)}") from None

    def close(self) -> None:
        self.http.close()
        if self._tmp:
            import shutil

            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = ""


def _decoded(data: bytes, what: str) -> Any:
    """An answer's JSON ({} when empty or not JSON)."""
    try:
        return jsonio.loads(data, what) if data else {}
    except Exception:
        return {}


def _error(status: int, doc: Any, data: bytes) -> ApiError:
    """The error an error status answer (`doc`, decoded from `data`) stands for."""
    doc = doc if isinstance(doc, dict) else {}
    message = str(doc.get("message", "")) or data[:200].decode(errors="replace")
    return ApiError(status, str(doc.get("reason", "")), message)


EXEC_TIMEOUT = 30.0


def exec_token(conf: KubeConfig) -> str:
    """Run the kubeconfig's exec credential plugin (client.authentication.k8s.io ExecCredential): its
    `command` with `args`, `env` added to ours and KUBERNETES_EXEC_INFO; the token from its stdout."""
    spec = conf.exec or {}
    command = str(spec.get("command") or "")
    if not command:
        raise ConfigError(f"{FIELD}: {conf.path}: exec: no command")
    if "/" in command and not os.path.isabs(command):
        command = os.path.join(os.path.dirname(os.path.abspath(conf.path)), command)
    env = dict(os.environ)
    for item in spec.get("env") or []:
        if isinstance(item, dict) and "name" in item:
            env[str(item["name"])] = str(item.get("value", ""))
    api = str(spec.get("apiVersion") or "client.authentication.k8s.io/v1")
    info = {"apiVersion": api, "kind": "ExecCredential", "spec": {"interactive": False}}
    env["KUBERNETES_EXEC_INFO"] = jsonio.dumps(info).decode()
    import subprocess

    try:
        proc = subprocess.run(
            [command, *map(str, spec.get("args") or [])], env=env, stdin=subprocess.DEVNULL,
            capture_output=True, timeout=EXEC_TIMEOUT, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise Unreachable(f"exec credential plugin {command}: timed out") from None
    except OSError as e:
        raise Unreachable(f"exec credential plugin {command}: {describe(e)}") from None
    if proc.returncode != 0:
        raise Unreachable(f"exec credential plugin {command} exited {proc.returncode}")
    try:
        status = jsonio.loads(proc.stdout, "ExecCredential").get("status") or {}
    except Exception:
        status = {}
    token = status.get("token") if isinstance(status, dict) else None
    if not token:
        raise Unreachable("exec credential plugin returned no token (client certificates: not supported)")
    return str(token)


def open_client(kubeconfig: str) -> Client:
    return Client(load_kubeconfig(kubeconfig))


def path_of(group: str, version: str, namespace: str, resource: str, name: str = "") -> str:
    """The REST path of a namespaced resource (collection when `name` is empty). Core group: ""."""
    root = f"/apis/{group}/{version}" if group else f"/api/{version}"
    out = f"{root}/namespaces/{quote(namespace)}/{resource}"
    return f"{out}/{quote(name)}" if name else out
