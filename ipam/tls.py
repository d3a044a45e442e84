"""TCP and TLS for the cluster stores' HTTP layer (ipam.httpconn), on the public `socket` and `ssl`
modules; the one module of ours that imports `ssl` (an import-linter contract). Contexts are the
interpreter's default one (certificate and name checked, TLS 1.2 or later); only a kubeconfig's
`insecure-skip-tls-verify` turns the checks off (`skip_verify`, logged), and a handshake without a
server name is refused, never silently made without a check. Errors are the ssl module's own classes
(re-exported here for the callers, which import no ssl)."""

from __future__ import annotations

import socket
import ssl

from cni import log

SSLError = ssl.SSLError
SSLCertVerificationError = ssl.SSLCertVerificationError
Context = ssl.SSLContext
Socket = socket.socket


def client_context(cafile: str | None = None, cadata: str | None = None) -> Context:
    """`ssl.create_default_context(cafile=cafile, cadata=cadata)`. OSError (ssl.SSLError included)
    when the CAs cannot be loaded."""
    return ssl.create_default_context(cafile=cafile, cadata=cadata)


def skip_verify(ctx: Context, setting: str) -> None:
    """Check neither the server's certificate nor its name (`setting`: what asked for it, logged)."""
    log.warning("%s: the server's TLS certificate and name are NOT checked", setting)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE


def connect(host: str | bytes, port: int, timeout: float) -> Socket:
    """`socket.create_connection((host, port), timeout)`. `host` as getaddrinfo takes it (bytes: a name
    already encoded)."""
    return socket.create_connection((host, port), timeout)  # type: ignore[arg-type]  # bytes: getaddrinfo's


def wrap(ctx: Context, sock: Socket, server_hostname: str | bytes) -> Socket:
    """The TLS handshake on connected `sock` (bounded by its timeout), as `server_hostname`: checked
    against the certificate (unless the context skips it) and sent in SNI (a name, not an address).
    Refuses an empty name. On a failed handshake `sock` is closed."""
    if not server_hostname:
        sock.close()
        raise ValueError("TLS: no server hostname (the name the certificate is checked against)")
    return ctx.wrap_socket(sock, server_hostname=server_hostname)
