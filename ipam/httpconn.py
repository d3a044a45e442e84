"""One kept-alive HTTP(S) connection to one server: the HTTP layer of every cluster store (the
Kubernetes API, ipam.kubeapi; etcd's JSON gateway, ipam.store.etcdgw). HTTP/1.1 as these two servers
speak it (Content-Length, chunked or close-delimited answers, keep-alive) is a small reader over
ipam.tls's sockets; http.client would add the email package's parser to every plugin call
(docs/benchmarks.md).

- Timeouts: `connect` bounds the TCP connect, `read` the TLS handshake and every read of an answer.
- A kept-alive connection the server closed meanwhile is reopened once, and only when it was reused:
  a request on a fresh connection is never sent twice by this layer (a write is never repeated).
- TLS: the caller's context (ipam.tls.client_context); `server_name` overrides the name checked and
  sent in SNI (by default the URL's host). An `http://` proxy tunnels (CONNECT) to an https server
  and forwards plain http.
Errors are OSError (SlowAnswer: a timeout waiting for the answer; BadAnswer: not HTTP/1.x), the TLS
ones (ssl.SSLError) included, for the caller to map."""

from __future__ import annotations

import ipaddress
import socket

from ipam.tls import Context, Socket, SSLCertVerificationError, SSLError, client_context, wrap
from ipam.tls import connect as tls_connect

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Iterator
    from urllib.parse import SplitResult

MAX_LINE = 65536  # a status or header line, a chunk-size line
MAX_HEADERS = 200


class SlowAnswer(TimeoutError):
    """No answer within the read timeout from a server that accepted the connection and the request:
    a busy server (an outage fails to connect instead). The request may or may not have been applied."""


class BadAnswer(OSError):
    """The server's answer is not HTTP/1.x as this reader understands it."""


class Closed(ConnectionResetError):
    """The server closed the connection before its answer began."""


# urllib.parse would cost every plugin call its import: the URLs, path segments and queries of our
# requests take these small equivalents (tests/unit/ipam/test_lean_imports.py compares them with it).
_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_HOST_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_PATH_CHARS = _HOST_CHARS | frozenset("/~")


class Url:
    """What a caller reads of urllib.parse.urlsplit's answer (the same values)."""

    __slots__ = ("hostname", "path", "port", "scheme")

    def __init__(self, scheme: str, hostname: str, port: int | None, path: str) -> None:
        self.scheme, self.hostname, self.port, self.path = scheme, hostname, port, path


def split_url(url: str) -> Url | SplitResult:
    """urllib.parse.urlsplit(url) for what its answer is read for (scheme, hostname, port, path). The
    plain forms (http(s)://host[:port][/path], host a name, an IPv4 or a bracketed IPv6 address) are
    split here; anything else (user info, a query, escapes, an invalid port...) by urlsplit itself, so
    its answers and errors stay exactly urlsplit's."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("http", "https"):
        netloc, slash, path = rest.partition("/")
        if netloc.startswith("["):
            host, close, port = netloc[1:].partition("]")
            plain = bool(close) and port[:1] in ("", ":") and _ipv6(host)
            port = port[1:]
        else:
            host, _, port = netloc.partition(":")
            plain = bool(host) and _HOST_CHARS.issuperset(host)
        path = slash + path
        if plain and _PATH_CHARS.issuperset(path) and (not port or _port(port)):
            return Url(scheme, host.lower(), int(port) if port else None, path)
    from urllib.parse import urlsplit

    return urlsplit(url)


def _ipv6(text: str) -> bool:
    if not text or not frozenset("0123456789abcdefABCDEF:.").issuperset(text):
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _port(text: str) -> bool:
    return text.isascii() and text.isdigit() and int(text) <= 65535


def quote(text: str) -> str:
    """urllib.parse.quote(text, safe=""): a path segment, UTF-8 percent-encoded."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode())


def urlencode(query: dict[str, object]) -> str:
    """urllib.parse.urlencode(query) (quote_plus of each key and value; bytes as they are, anything
    else as its str())."""
    return "&".join(f"{_plus(k)}={_plus(v)}" for k, v in query.items())


def _plus(value: object) -> str:
    data = value if isinstance(value, bytes) else str(value).encode()
    return "".join(chr(b) if b in _UNRESERVED else "+" if b == 0x20 else f"%{b:02X}" for b in data)


def encoded_host(host: str) -> str | bytes:
    """`host` for socket.getaddrinfo (create_connection) and SSLContext.wrap_socket's server_hostname:
    both encode a str with the idna codec, and importing it (encodings.idna, stringprep, unicodedata)
    costs every call. For an ASCII name that codec gives the name's ASCII bytes (after checking its
    labels' lengths, as here), and both take bytes as the name already encoded; any other name goes
    to them as it is."""
    if host.isascii():
        labels = host.split(".")
        if all(0 < len(label) < 64 for label in labels[:-1]) and len(labels[-1]) < 64:
            return host.encode("ascii")
    return host


def connect(host: str, port: int, timeout: float) -> Socket:
    """socket.create_connection((host, port), timeout), the host name resolved without the idna codec
    (encoded_host)."""
    return tls_connect(encoded_host(host), port, timeout)


class Connection:
    """Requests to `base` (scheme://host:port); one thread at a time."""

    def __init__(
        self,
        base: str,
        tls: Context | None = None,
        connect: float = 3.0,
        read: float = 10.0,
        server_name: str = "",
        proxy: str = "",
    ) -> None:
        url = split_url(base)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{base!r} is not an http(s) URL")
        self.scheme, self.host = url.scheme, url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.prefix = url.path.rstrip("/")
        self.tls = tls if tls is not None or url.scheme == "http" else client_context()
        self.connect_timeout, self.read_timeout = connect, read
        self.server_name = server_name
        self.proxy = split_url(proxy) if proxy else None
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        self.authority = host if self.port == default else f"{host}:{self.port}"
        self._sock: Socket | None = None
        self._in: _Reader | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._in = None

    def interrupt(self) -> None:
        """End the connection from another thread: a read waiting on it returns at once (an end of
        file: Closed or BadAnswer), where close() alone would leave it waiting."""
        sock = self._sock
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            return  # not connected any more

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One request; (status, body)."""
        message = _message(method, self._target(path), self.authority, body, headers)
        for attempt in (0, 1):
            reused = self._sock is not None
            sock, reader = self._open()
            try:
                sock.sendall(message)
                status, data, keep = _answer(reader, method)
                if not keep:
                    self.close()
                return status, data
            except (ConnectionResetError, BrokenPipeError):  # Closed included
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

    def stream(self, path: str, headers: dict[str, str]) -> tuple[int, Iterator[bytes]]:
        """A GET whose answer is read as it comes, line by line (a Kubernetes watch: one JSON event a line):
        (status, the body's non-empty lines). Always on a fresh connection, closed once the body ends or
        by the caller's `close()` when it stops reading early (never reused mid-answer). Each read waits
        at most the read timeout (SlowAnswer); the lines of an error answer are its body."""
        self.close()  # a fresh connection: a watch is long, and a request on it is never sent twice
        sock, reader = self._open()
        try:
            sock.sendall(_message("GET", self._target(path), self.authority, None, headers))
            status, _, fields = _head(reader)
        except TimeoutError as e:
            self.close()
            raise SlowAnswer(*e.args) from None
        except BaseException:
            self.close()
            raise
        chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        return status, _lines(self, reader, chunked, fields.get("content-length"))

    def _target(self, path: str) -> str:
        """The request target: the path under the URL's, the absolute URL through a plain http proxy."""
        if self.proxy is not None and self.scheme == "http":
            return f"http://{self.authority}{self.prefix}{path}"
        return self.prefix + path

    def _open(self) -> tuple[Socket, _Reader]:
        if self._sock is not None and self._in is not None:
            return self._sock, self._in
        host, port = self.host, self.port
        if self.proxy is not None:
            host, port = self.proxy.hostname or "", self.proxy.port or 80
        raw = connect(host, port, self.connect_timeout)
        sock = raw
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # the TLS handshake and the proxy's answer are the server's work: the read bound
            raw.settimeout(self.read_timeout)
            if self.proxy is not None and self.scheme == "https":
                _tunnel(raw, self.host, self.port)
            if self.scheme == "https":
                assert self.tls is not None
                sock = wrap(self.tls, raw, encoded_host(self.server_name or self.host))
        except BaseException:
            raw.close()
            raise
        self._sock, self._in = sock, _Reader(sock)
        return sock, self._in


def _message(method: str, target: str, authority: str, body: bytes | None, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", "Accept-Encoding: identity"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _tunnel(sock: Socket, host: str, port: int) -> None:
    """CONNECT through an http proxy; nothing past the proxy's answer is read (the TLS server speaks
    only after our hello)."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("latin-1"))
    head = b""
    while b"\r\n\r\n" not in head:
        part = sock.recv(1)
        if not part:
            raise Closed("the proxy closed the connection")
        head += part
        if len(head) > MAX_LINE:
            raise BadAnswer("the proxy's answer is too long")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or parts[1] != "200":
        raise OSError(f"Tunnel connection failed: {' '.join(parts[1:]) or status_line}")


class _Reader:
    """Buffered reads from a (TLS) socket: lines and exact lengths."""

    def __init__(self, sock: Socket) -> None:
        self.sock, self.buf = sock, bytearray()  # grows in place: a large pool arrives in many reads

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def line(self) -> bytes:
        """One line without its CRLF; b"" when the server closed before sending any byte of it."""
        while (end := self.buf.find(b"\n")) < 0:
            if len(self.buf) > MAX_LINE:
                raise BadAnswer("line too long")
            if not self._fill():
                if self.buf:
                    raise BadAnswer("the answer ended inside a line")
                return b""
        line = bytes(self.buf[:end])
        del self.buf[: end + 1]
        return line.rstrip(b"\r")

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._fill():
                raise BadAnswer(f"the answer ended {n - len(self.buf)} bytes early")
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def rest(self) -> bytes:
        while self._fill():
            pass
        data = bytes(self.buf)
        self.buf.clear()
        return data


def _answer(reader: _Reader, method: str) -> tuple[int, bytes, bool]:
    """(status, body, keep the connection)."""
    status, version, fields = _head(reader)
    conn = fields.get("connection", "").lower()
    keep = "keep-alive" in conn if version == b"HTTP/1.0" else "close" not in conn
    if method == "HEAD" or status in (204, 304):
        return status, b"", keep
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return status, b"".join(_chunks(reader)), keep
    if "content-length" in fields:
        try:
            length = int(fields["content-length"])
        except ValueError:
            raise BadAnswer(f"bad Content-Length {fields['content-length']!r}") from None
        return status, reader.exact(length), keep
    return status, reader.rest(), False


def _fields(reader: _Reader) -> dict[str, str]:
    fields: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        line = reader.line()
        if not line:
            return fields
        name, sep, value = line.decode("latin-1").partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    raise BadAnswer("too many header lines")


def _chunks(reader: _Reader) -> Iterator[bytes]:
    """The chunks of a chunked body, as they come (the trailers after the last are read, to the blank
    line)."""
    while True:
        size_line = reader.line().split(b";", 1)[0].strip()
        try:
            size = int(size_line, 16)
        except ValueError:
            raise BadAnswer(f"bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            _fields(reader)
            return
        yield reader.exact(size)
        reader.exact(2)  # the chunk's CRLF


def describe(e: BaseException) -> str:
    """A short, secret-free reason for a failed request."""
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, SSLCertVerificationError):
        return f"TLS: certificate verify failed: {e.verify_message}"
    if isinstance(e, SSLError):
        return f"TLS: {e.reason or e}"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def _head(reader: _Reader) -> tuple[int, bytes, dict[str, str]]:
    """The answer's status, HTTP version and header fields; an interim answer (100 Continue) is
    followed by the real one."""
    while True:
        line = reader.line()
        if not line:
            raise Closed("the server closed the connection without an answer")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise BadAnswer(f"not an HTTP/1.x status line: {line[:80]!r}")
        status, version, fields = int(parts[1]), parts[0], _fields(reader)
        if not 100 <= status < 200:
            return status, version, fields


def _lines(conn: Connection, reader: _Reader, chunked: bool, length: str | None) -> Iterator[bytes]:
    pending = bytearray()
    try:
        if not chunked:
            body = reader.exact(int(length)) if length and length.isdigit() else reader.rest()
            yield from (line for line in body.splitlines() if line.strip())
            return
        for chunk in _chunks(reader):
            pending += chunk
            while (end := pending.find(b"\n")) >= 0:
                line = bytes(pending[:end])
                del pending[: end + 1]
                if line.strip():
                    yield line
        if pending.strip():
            yield bytes(pending)
    except TimeoutError as e:
        raise SlowAnswer(*e.args) from None
    finally:
        conn.close()
