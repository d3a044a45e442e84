"""One kept-alive HTTP(S) connection to one server: the HTTP layer of every cluster store (the
Kubernetes API, ipam.kubeapi; etcd's JSON gateway, ipam.store.etcdgw). http.client and ssl only: a few
milliseconds to import, where a client library's stack (urllib3, requests) costs tens (README: IPAM,
"One HTTP layer").

- Timeouts: `connect` bounds the TCP connect, `read` the TLS handshake and every read of an answer.
- A kept-alive connection the server closed meanwhile is reopened once, and only when it was reused:
  a request on a fresh connection is never sent twice by this layer (a write is never repeated).
- TLS: the caller's ssl.SSLContext; `server_name` overrides the name checked and sent in SNI.
- Proxy: an `http://` proxy tunnels (CONNECT) to an https server and forwards plain http.
Errors are OSError (SlowAnswer: a timeout waiting for the answer), ssl.SSLError and
http.client.HTTPException, for the caller to map."""

from __future__ import annotations

import http.client
import socket
import ssl
from urllib.parse import urlsplit


class SlowAnswer(TimeoutError):
    """No answer within the read timeout from a server that accepted the connection and the request:
    a busy server (an outage fails to connect instead). The request may or may not have been applied."""


class _TLSConnection(http.client.HTTPSConnection):
    """HTTPSConnection whose certificate check and SNI use `server_name` (kubeconfig tls-server-name)."""

    def __init__(
        self, host: str, port: int, server_name: str, context: ssl.SSLContext, timeout: float,
        handshake: float,
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self.server_name, self.tls_context, self.handshake = server_name, context, handshake

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy tunnel when set
        # the TLS handshake is the server's work (a busy API server takes seconds): the read bound
        self.sock.settimeout(self.handshake)
        self.sock = self.tls_context.wrap_socket(self.sock, server_hostname=self.server_name)


class Connection:
    """Requests to `base` (scheme://host:port); one thread at a time."""

    def __init__(
        self,
        base: str,
        tls: ssl.SSLContext | None = None,
        connect: float = 3.0,
        read: float = 10.0,
        server_name: str = "",
        proxy: str = "",
    ) -> None:
        url = urlsplit(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{base!r} is not an http(s) URL")
        self.scheme, self.host = url.scheme, url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.tls = tls if tls is not None or url.scheme == "http" else ssl.create_default_context()
        self.connect_timeout, self.read_timeout = connect, read
        self.server_name = server_name
        self.proxy = urlsplit(proxy) if proxy else None
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request; (status, body)."""
        target = self.prefix + path
        for attempt in (0, 1):
            reused = self._conn is not None
            conn = self._open()
            try:
                if self.proxy is not None and self.scheme == "http":
                    conn.request(method, f"http://{self.host}:{self.port}{target}", body, headers)
                else:
                    conn.request(method, target, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    self.close()
                return resp.status, data
            except (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected):
                self.close()
                if not reused or attempt:
                    raise
            except TimeoutError as e:  # connected, the request sent: the server is slow to answer
                self.close()
                raise SlowAnswer(*e.args) from None
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def _open(self) -> http.client.HTTPConnection:
        if self._conn is not None:
            return self._conn
        host, port = self.host, self.port
        if self.proxy is not None:
            host, port = self.proxy.hostname or "", self.proxy.port or 80
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            assert self.tls is not None
            conn = _TLSConnection(
                host, port, self.server_name or self.host, self.tls, self.connect_timeout, self.read_timeout
            )
            if self.proxy is not None:
                conn.set_tunnel(self.host, self.port)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        if conn.sock is not None:
            conn.sock.settimeout(self.read_timeout)
            if conn.sock.family in (socket.AF_INET, socket.AF_INET6):
                conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn = conn
        return conn


def describe(e: BaseException) -> str:
    """A short, secret-free reason for a failed request."""
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS: certificate verify failed: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        return f"TLS: {e.reason or e}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__
