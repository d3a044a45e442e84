"""The Kubernetes API as the IPAM uses it: a kubeconfig, and JSON requests through the `kubernetes`
client's REST layer (`kubernetes.client.rest.RESTClientObject` with its `Configuration`: urllib3, TLS
as the kubeconfig says). Shared by the CRD store (ipam.store.kube) and the pod source (ipam.kubepods).

Import cost is latency (every CNI call is a fresh process): `import kubernetes` runs the package
__init__, which loads every API model, the dynamic client, watch, stream and leader election (270-290
ms on the 2-core build machine). As cni.netlink.codec does for pyroute2, `kubernetes`,
`kubernetes.client`, `kubernetes.config` and `kubernetes.utils` are registered as bare packages (their
real search path, no __init__ run) and only `kubernetes.client.rest` and
`kubernetes.client.configuration` are imported: ~90 ms, most of it urllib3 (`python -X importtime`;
see the README; under load: 170 ms against 600 ms for `kubernetes.config.kube_config`). A process
that imported the whole package first simply uses it. The kubeconfig is read here (JSON, else YAML
via PyYAML, which the client depends on), not with `kubernetes.config.kube_config`, which pulls in
requests, oauthlib and every model; exec credential plugins run through the client's own
`ExecProvider`.

Kubeconfig: the current context's cluster, user and namespace (upstream whereabouts' rule: the
context namespace, `kube-system` when empty). Cluster: `server`, `certificate-authority(-data)`,
`insecure-skip-tls-verify`, `tls-server-name`, `proxy-url`. User: `token`, `tokenFile` (re-read
once when the server answers 401: the kubelet rotates projected tokens), `client-certificate(-data)`
and `client-key(-data)`, `username`/`password`, `exec`. Relative paths are relative to the kubeconfig.
`auth-provider` (removed from kubectl) is refused with a clear error. Secrets are never logged.

Requests have bounded timeouts (connect, read) and no hidden retries of writes; the callers map
`ApiError` (an HTTP status) and `Unreachable` (no answer) to their own errors."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import os
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from cni import jsonio
from cni.errors import ConfigError

DEFAULT_NAMESPACE = "kube-system"  # upstream whereabouts' default (wbNamespaceFromCtx)
TIMEOUT = (3.0, 10.0)  # connect, read: seconds per request
FIELD = "kubernetes.kubeconfig"


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}" + (f": {message}" if message else ""))
        self.status, self.reason, self.message = status, reason, message


class Unreachable(Exception):
    """No answer: connection refused, TLS failure, timeout."""


@dataclass
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
        return base64.b64decode(str(value), validate=False).decode()
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{FIELD}: {path}: {what} is not base64 PEM") from None


def load_kubeconfig(path: str) -> KubeConfig:
    """Read `path` (the current context). Raises ConfigError naming the field."""
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


def _bare(name: str) -> None:
    """Register package `name` without running its __init__ (see the module docstring)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not installed", name=name)
    pkg = types.ModuleType(name)
    pkg.__path__ = list(spec.submodule_search_locations)
    pkg.__spec__ = spec
    pkg.__file__ = spec.origin
    sys.modules[name] = pkg
    if "." in name:
        parent, child = name.rsplit(".", 1)
        setattr(sys.modules[parent], child, pkg)


def rest_modules() -> tuple[Any, Any]:
    """kubernetes.client.rest and kubernetes.client.configuration, at the lowest import cost."""
    for name in ("kubernetes", "kubernetes.client", "kubernetes.config", "kubernetes.utils"):
        _bare(name)
    from kubernetes.client import configuration, rest

    return rest, configuration


class _ExecNode(dict[str, Any]):
    """The ConfigNode interface ExecProvider expects, over a plain dict."""

    def safe_get(self, key: str) -> Any:
        return self.get(key)

    @property
    def value(self) -> dict[str, Any]:
        return dict(self)


class Client:
    """One connection pool onto the API server. Used by one thread at a time."""

    def __init__(self, conf: KubeConfig, timeout: tuple[float, float] = TIMEOUT) -> None:
        self.conf, self.timeout = conf, timeout
        self._tmp = ""
        rest, configuration = rest_modules()
        import urllib3

        self._urllib3 = urllib3
        self._api_exception = sys.modules["kubernetes.client.exceptions"].ApiException
        c = configuration.Configuration(host=conf.server)
        c.verify_ssl = not conf.insecure
        c.ssl_ca_cert = conf.ca_file or None
        c.ca_cert_data = conf.ca_data or None
        c.cert_file, c.key_file = (
            self._pem(conf.cert_file, conf.cert_data),
            self._pem(conf.key_file, conf.key_data),
        )
        c.tls_server_name = conf.tls_server_name or None
        c.proxy = conf.proxy or None
        c.connection_pool_maxsize = 2
        # one reconnect for a connection that never got through; never a resent write
        c.retries = urllib3.Retry(total=1, connect=1, read=0, status=0, redirect=0, other=0)
        self.rest = rest.RESTClientObject(c)
        self._auth = ""
        self._authorize(initial=True)

    def _pem(self, path: str, data: str) -> str | None:
        """A client certificate or key given inline: written to a private 0600 file (ssl needs a path)."""
        if path:
            return path
        if not data:
            return None
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
            self._auth = f"Bearer {self._exec_token()}"
        elif conf.username and initial:
            raw = f"{conf.username}:{conf.password}".encode()
            self._auth = "Basic " + base64.b64encode(raw).decode()

    def _exec_token(self) -> str:
        rest_modules()
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.exec_provider import ExecProvider

        try:
            provider = ExecProvider(_ExecNode(self.conf.exec or {}), os.path.dirname(self.conf.path))  # type: ignore[no-untyped-call]
            status = provider.run()  # type: ignore[no-untyped-call]
        except (ConfigException, OSError) as e:
            raise Unreachable(f"exec credential plugin: {e}") from None
        token = status.get("token") if isinstance(status, dict) else None
        if not token:
            raise Unreachable("exec credential plugin returned no token (client certificates: not supported)")
        return str(token)

    def url(self, path: str, query: dict[str, Any] | None = None) -> str:
        q = {k: v for k, v in (query or {}).items() if v not in (None, "")}
        return self.conf.server + path + ("?" + urlencode(q) if q else "")

    def request(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Send one request; the decoded JSON answer. Raises ApiError or Unreachable. A 401 re-reads the
        credentials (token file, exec plugin) once and tries again."""
        for attempt in (0, 1):
            status, data = self._send(method, self.url(path, query), body)
            if status == 401 and attempt == 0 and (self.conf.token_file or self.conf.exec is not None):
                self._authorize()
                continue
            break
        try:
            doc = jsonio.loads(data, f"{method} {path}") if data else {}
        except Exception:
            doc = {}
        if status >= 400:
            message = doc.get("message", "") if isinstance(doc, dict) else ""
            reason = doc.get("reason", "") if isinstance(doc, dict) else ""
            raise ApiError(status, str(reason), str(message) or data[:200].decode(errors="replace"))
        if not isinstance(doc, dict):
            raise ApiError(status, "BadResponse", f"{method} {path}: expected a JSON object")
        return doc

    def _send(self, method: str, url: str, body: Any) -> tuple[int, bytes]:
        headers = {"Accept": "application/json", "User-Agent": "pycni-ipam"}
        if self._auth:
            headers["Authorization"] = self._auth
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            r = self.rest.request(method, url, headers=headers, body=body, _request_timeout=self.timeout)
            data = r.read()
        except self._api_exception as e:  # TLS failures come back as status 0
            raise Unreachable(f"{self.conf.server}: {e.reason}".strip()) from None
        except self._urllib3.exceptions.HTTPError as e:
            raise Unreachable(f"{self.conf.server}: {_short(e)}") from None
        except OSError as e:
            raise Unreachable(f"{self.conf.server}: {e}") from None
        return int(r.status), bytes(data or b"")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.rest.close()
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = ""


def _short(e: Exception) -> str:
    """urllib3's errors wrap the reason in a long repr; keep the innermost message."""
    reason = getattr(e, "reason", None)
    while getattr(reason, "reason", None) is not None:
        reason = reason.reason  # type: ignore[union-attr]
    text = str(reason or e)
    return text.split(": ", 1)[-1] if "object at 0x" in text else text


def open_client(kubeconfig: str) -> Client:
    return Client(load_kubeconfig(kubeconfig))


def path_of(group: str, version: str, namespace: str, resource: str, name: str = "") -> str:
    """The REST path of a namespaced resource (collection when `name` is empty). Core group: ""."""
    root = f"/apis/{group}/{version}" if group else f"/api/{version}"
    out = f"{root}/namespaces/{quote(namespace, safe='')}/{resource}"
    return f"{out}/{quote(name, safe='')}" if name else out
