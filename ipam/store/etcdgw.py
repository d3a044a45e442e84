"""etcd v3 through its own JSON gRPC gateway (`POST /v3/kv/range`, `/v3/kv/txn`, `/v3/auth/authenticate`;
keys and values base64, int64s as strings), over ipam.httpconn (sockets and TLS): no grpc, no protobuf, a
light import. Served by every etcd since 3.4 on the client port (3.3 only under /v3beta).
Why not the `etcd3` package: docs/benchmarks.md (figures behind code choices).

- Endpoints: `etcd_host` is one or several comma-separated `host[:port]` or `http(s)://host[:port]`
  (port 2379 by default; https when any TLS file is configured and no scheme is given). The first
  that answers is kept; one that cannot be reached is skipped. A request that times out or whose
  connection drops after it was sent is sent again to the next endpoint: every write is a txn
  comparing revisions, so a repeat of an applied write fails its compare and changes nothing.
- Timeouts: CONNECT_TIMEOUT to connect, REQUEST_TIMEOUT per read; an unreachable cluster is
  StoreUnavailable (code 11) after at most (connect + request) timeouts per endpoint.
- Auth: user/password -> a token (`Authorization` header), re-authenticated once when the server says
  it is invalid (expired, or etcd restarted). Tokens are cached in a 0600 file (`TokenCache`) so that
  each plugin process does not pay a bcrypt check on the server. The password and the token are never
  put into a message or a log line."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cni import jsonio, log
from cni.errors import ConfigError
from ipam.digest import sha256_hex
from ipam.httpconn import Connection, describe, split_url
from ipam.store.base import StoreUnavailable
from ipam.tls import Context, client_context

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

CONNECT_TIMEOUT = 2.0
REQUEST_TIMEOUT = 10.0  # one read; writing a pool of 60,000 allocations (~10 MB) takes well under it
DEFAULT_PORT = 2379
UNAUTHENTICATED = 16  # gRPC code of "etcdserver: invalid auth token"
UNAVAILABLE = 14  # gRPC code of "etcdserver: no leader", "... request timed out" and the like
AUTH_NOT_ENABLED = "authentication is not enabled"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_end(prefix: bytes) -> bytes:
    """The range_end that covers every key starting with `prefix`."""
    for i in range(len(prefix) - 1, -1, -1):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_endpoints(text: str, tls: bool, field: str = "ipam.etcd_host") -> list[Endpoint]:
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        url = split_url(item if "://" in item else f"{'https' if tls else 'http'}://{item}")
        try:
            port = url.port or DEFAULT_PORT
        except ValueError:
            port = -1
        if url.scheme not in ("http", "https") or not url.hostname or port < 0 or url.path not in ("", "/"):
            raise ConfigError(f"{field}: {item!r} is not host[:port] or http(s)://host[:port]")
        out.append(Endpoint(url.scheme, url.hostname, port))
    if not out:
        raise ConfigError(f"{field}: no endpoint given")
    return out


def tls_context(ca_file: str, cert_file: str, key_file: str) -> Context:
    """Server verified against `ca_file` (system CAs without it); a client certificate when given."""
    if bool(cert_file) != bool(key_file):
        missing = "ipam.etcd_key_file" if cert_file else "ipam.etcd_cert_file"
        raise ConfigError(f"{missing}: required with {'etcd_cert_file' if cert_file else 'etcd_key_file'}")
    try:
        ctx = client_context(cafile=ca_file or None)
    except OSError as e:  # ssl.SSLError included
        raise ConfigError(f"ipam.etcd_ca_cert_file: cannot load {ca_file}: {describe(e)}") from None
    try:
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file)
    except OSError as e:
        raise ConfigError(f"ipam.etcd_cert_file: cannot load it with its key: {describe(e)}") from None
    return ctx


class Rejected(Exception):
    """The server answered with an error (gRPC code and message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class TokenCache:
    """One token in `directory`/etcd-token-<hash of endpoints, user, password>: 0600, ours only, written
    to a temp file and renamed, opened relative to the directory without following symlinks."""

    def __init__(self, directory: str, identity: Iterable[str]) -> None:
        self.directory = directory
        digest = sha256_hex("\0".join(identity).encode())[:24]
        self.name = f"etcd-token-{digest}"

    def _dir(self) -> int:
        return os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    @contextlib.contextmanager
    def _in_dir(self) -> Iterator[int]:
        d = self._dir()
        try:
            yield d
        finally:
            os.close(d)

    def read(self) -> str | None:
        try:
            with self._in_dir() as d:
                fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
                with os.fdopen(fd, "rb") as fh:
                    st = os.fstat(fh.fileno())
                    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                        return None
                    return fh.read(4096).decode().strip() or None
        except (OSError, UnicodeDecodeError):
            return None

    def write(self, token: str) -> None:
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            d = self._dir()
        except OSError as e:
            log.debug("etcd token not cached in %s: %s", self.directory, e.strerror)
            return
        tmp = f".{self.name}.{os.getpid()}.tmp"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(tmp, flags, 0o600, dir_fd=d), "wb") as fh:
                fh.write(token.encode())
                os.fchmod(fh.fileno(), 0o600)
                os.fsync(fh.fileno())
            os.replace(tmp, self.name, src_dir_fd=d, dst_dir_fd=d)
        except OSError as e:
            log.debug("etcd token not cached in %s: %s", self.directory, e.strerror)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=d)
        finally:
            os.close(d)

    def forget(self, token: str) -> None:
        """Remove the cached token if it is still `token` (another process may have renewed it)."""
        if self.read() == token:
            with contextlib.suppress(OSError), self._in_dir() as d:
                os.unlink(self.name, dir_fd=d)


class Gateway:
    """A connection to one etcd cluster. One thread at a time (like every store handle)."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        tls: Context | None = None,
        username: str = "",
        password: str = "",
        token_cache: TokenCache | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.endpoints, self.tls = endpoints, tls
        self._username, self._password = username, password
        self._cache = token_cache if username else None
        self.connect_timeout, self.request_timeout = connect_timeout, request_timeout
        self._current = 0
        self._conn: Connection | None = None
        self._token: str | None = None  # "" : auth is not enabled on the server

    def __repr__(self) -> str:
        return f"Gateway({', '.join(map(str, self.endpoints))}, user={self._username!r})"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # ---- one call -----------------------------------------------------------------------------------

    def call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v3/<method>; the decoded answer. Rejected for a server error, StoreUnavailable when no
        endpoint answers (or the credentials are refused)."""
        token = self._auth()
        try:
            return self._post(method, body, token)
        except Rejected as e:
            if not token or e.code != UNAUTHENTICATED:
                raise
            log.debug("etcd: auth token refused (%s), authenticating again", e.message)
            self._drop_token(token)
            return self._post(method, body, self._auth())

    def _post(self, method: str, body: dict[str, Any], token: str) -> dict[str, Any]:
        data = jsonio.dumps(body)
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = token
        errors = []
        for _ in range(len(self.endpoints)):
            ep = self.endpoints[self._current]
            try:
                status, answer = self._send(ep, method, data, headers)
                return _decode(ep, method, status, answer)
            except OSError as e:
                errors.append(f"{ep}: {describe(e)}")
            except Rejected as e:
                if e.code != UNAVAILABLE:  # no leader, leader changed, request timed out: ask another
                    raise
                errors.append(f"{ep}: {e.message}")
            self.close()
            self._current = (self._current + 1) % len(self.endpoints)
        raise StoreUnavailable(f"etcd unreachable ({'; '.join(errors)})")

    def _send(self, ep: Endpoint, method: str, data: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        if self._conn is None:
            self._conn = Connection(str(ep), self.tls, self.connect_timeout, self.request_timeout)
        return self._conn.request("POST", f"/v3/{method}", data, headers)

    # ---- authentication -----------------------------------------------------------------------------

    def _auth(self) -> str:
        if not self._username:
            return ""
        if self._token is None and self._cache is not None:
            self._token = self._cache.read()
        if self._token is None:
            self._token = self._authenticate()
            if self._token and self._cache is not None:
                self._cache.write(self._token)
        return self._token

    def _authenticate(self) -> str:
        try:
            answer = self._post("auth/authenticate", {"name": self._username, "password": self._password}, "")
        except Rejected as e:
            if AUTH_NOT_ENABLED in e.message:
                return ""
            raise StoreUnavailable(
                f"etcd: authentication of user {self._username!r} failed: {e.message}"
            ) from None
        token = answer.get("token")
        if not isinstance(token, str) or not token:
            raise StoreUnavailable(f"etcd: authentication of user {self._username!r} returned no token")
        return token

    def _drop_token(self, token: str) -> None:
        self._token = None
        if self._cache is not None:
            self._cache.forget(token)


def _decode(ep: Endpoint, method: str, status: int, answer: bytes) -> dict[str, Any]:
    try:
        obj = jsonio.loads(answer, f"etcd {ep} /v3/{method}")
    except Exception:
        obj = None
    if not isinstance(obj, dict):
        text = answer[:200].decode(errors="replace").strip()
        raise StoreUnavailable(f"etcd {ep} /v3/{method}: HTTP {status}, not an etcd answer: {text!r}")
    if status != 200 or "error" in obj:
        message = str(obj.get("message") or obj.get("error") or f"HTTP {status}")
        raise Rejected(int(obj.get("code") or 2), message)
    return obj
