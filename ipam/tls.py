"""Sockets and TLS for the cluster stores' HTTP layer (ipam.httpconn), on the interpreter's own `_socket`
and `_ssl` modules: what `socket.create_connection`, `ssl.create_default_context` and
`SSLContext.wrap_socket` do for a client, without the Python modules around them.

Why: `ssl` and `socket` (with `selectors`, `enum`, `array`) add to the imports of every plugin call on
a cluster store (figures: docs/benchmarks.md); `_ssl` (OpenSSL itself) is all
that is needed. The TLS checks are OpenSSL's, configured by `_ssl` in C exactly as `ssl` configures them:
`client_context` is `ssl.create_default_context()` (PROTOCOL_TLS_CLIENT: the server's certificate
required and its name checked, TLS 1.2 or later, the same options, flags and ciphers;
tests/unit/ipam/test_tls.py compares every setting with the ssl module's), and `TlsSocket` does the
handshake before any byte of a request is sent, as `wrap_socket` does by default. Errors are the ssl
module's own classes (`ssl.SSLError is _ssl.SSLError`): callers and tests may still catch those.
Not taken over from `ssl`: the `SSLKEYLOGFILE` variable (a debugging aid that writes session keys to a
file)."""

from __future__ import annotations

import _socket
import _ssl

SSLError = _ssl.SSLError
SSLCertVerificationError = _ssl.SSLCertVerificationError
CERT_NONE = _ssl.CERT_NONE
SOCK_STREAM = _socket.SOCK_STREAM
Context = _ssl._SSLContext  # ssl.SSLContext is a subclass: either is accepted wherever a Context is


class Socket(_socket.socket):
    """A plain TCP socket (`_socket.socket` takes no weak reference, which `_ssl` keeps of it)."""

    __slots__ = ("__weakref__",)


def client_context(cafile: str | None = None, cadata: str | None = None) -> Context:
    """`ssl.create_default_context(cafile=cafile, cadata=cadata)`: the server's certificate checked
    against these CAs (the system's without any) and its name against the one asked for."""
    ctx = _ssl._SSLContext(_ssl.PROTOCOL_TLS_CLIENT)  # C sets CERT_REQUIRED, check_hostname, TLS >= 1.2
    if cafile or cadata:
        ctx.load_verify_locations(cafile, None, cadata)
    else:
        ctx.set_default_verify_paths()  # ssl's load_default_certs() on Linux
    return ctx


def connect(host: str | bytes, port: int, timeout: float) -> Socket:
    """socket.create_connection((host, port), timeout): each address in turn, the last one's error if
    none connects. `host` as getaddrinfo takes it (bytes: a name already encoded)."""
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, SOCK_STREAM):
        sock = None
        try:
            sock = Socket(family, kind, proto)
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            error = e
            if sock is not None:
                sock.close()
    raise error if error is not None else OSError("getaddrinfo returns an empty list")


def server_hostname(host: str | bytes) -> str:
    """The name to check and send in SNI, as ssl's `_encode_hostname` makes it."""
    if isinstance(host, bytes):
        return host.decode("ascii")
    return host if host.isascii() else host.encode("idna").decode("ascii")


class TlsSocket:
    """A connected socket after a completed TLS handshake: the calls ipam.httpconn makes of a socket."""

    __slots__ = ("_tls", "sock")

    def __init__(self, ctx: Context, sock: Socket, host: str | bytes) -> None:
        self.sock = sock  # kept: _ssl holds only a weak reference to it
        self._tls = ctx._wrap_socket(sock, False, server_hostname(host))  # type: ignore[attr-defined]
        self._tls.do_handshake()  # bounded by the socket's timeout (C waits on it)

    def sendall(self, data: bytes) -> None:
        view, sent = memoryview(data), 0
        while sent < len(view):
            sent += self._tls.write(view[sent:])

    def recv(self, size: int) -> bytes:
        try:
            data: bytes = self._tls.read(size)
            return data
        except _ssl.SSLEOFError:  # the peer closed without close_notify: an end, as ssl's ragged EOFs
            return b""

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.sock.setsockopt(level, option, value)

    def shutdown(self, how: int) -> None:
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
