"""ipam.httpconn against scripted servers on 127.0.0.1: the answer framings the API server and etcd use
(Content-Length, chunked, close-delimited), keep-alive and its one reopen, timeouts, TLS with a
server name, and both proxy forms. Each server thread serves the connections a test scripts for it."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ipam import httpconn
from tests import etcdutil

Handler = Callable[[socket.socket, "Requests"], None]


class Requests:
    """What a scripted server received: each request's head (request line and headers) and body."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        self.connections = 0

    def read(self, conn: socket.socket) -> tuple[str, dict[str, str], bytes] | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            part = conn.recv(65536)
            if not part:
                return None
            buf += part
        head, body = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(fields.get("content-length", "0")):
            body += conn.recv(65536)
        self.seen.append((lines[0], fields, body))
        return self.seen[-1]


class Server:
    def __init__(self, handlers: list[Handler], tls: ssl.SSLContext | None = None) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests = Requests()
        self.tls = tls
        self.thread = threading.Thread(target=self._serve, args=(handlers,), daemon=True)
        self.thread.start()

    def _serve(self, handlers: list[Handler]) -> None:
        for handler in handlers:
            conn, _ = self.sock.accept()
            self.requests.connections += 1
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                handler(conn, self.requests)
            except OSError:
                pass
            finally:
                conn.close()

    def close(self) -> None:
        self.sock.close()
        self.thread.join(10)


def answer(body: bytes, extra: str = "", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def serve(*answers: bytes) -> Handler:
    """Answer one request per given answer on this connection, then close it."""

    def handler(conn: socket.socket, reqs: Requests) -> None:
        for a in answers:
            if reqs.read(conn) is None:
                return
            conn.sendall(a)

    return handler


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        s.close()


def start(servers: list[Server], *handlers: Handler, tls: ssl.SSLContext | None = None) -> Server:
    servers.append(Server(list(handlers), tls))
    return servers[-1]


def test_keep_alive_content_length(servers: list[Server]) -> None:
    s = start(servers, serve(answer(b'{"a":1}'), answer(b"", status="404 Not Found")))
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}/prefix/")
    assert c.request("GET", "/x?y=1", None, {"Accept": "application/json"}) == (200, b'{"a":1}')
    assert c.request("POST", "/z", b"body", {}) == (404, b"")
    c.close()
    (line1, head1, _), (line2, head2, body2) = s.requests.seen
    assert line1 == "GET /prefix/x?y=1 HTTP/1.1" and head1["host"] == f"127.0.0.1:{s.port}"
    assert head1["accept"] == "application/json" and "content-length" not in head1
    assert (line2, head2["content-length"], body2) == ("POST /prefix/z HTTP/1.1", "4", b"body")
    assert s.requests.connections == 1


def test_chunked_with_extension_and_trailer(servers: list[Server]) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
    s = start(servers, serve(chunked, answer(b"next")))
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}")
    assert c.request("GET", "/", None, {}) == (200, b"hello 0123456789")
    assert c.request("GET", "/", None, {}) == (200, b"next")  # the connection stayed in step
    assert s.requests.connections == 1


def test_close_delimited_and_connection_close(servers: list[Server]) -> None:
    s = start(servers, serve(b"HTTP/1.1 200 OK\r\n\r\nuntil the end"),
              serve(answer(b"x", "Connection: close\r\n")), serve(answer(b"y")))
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}")
    assert c.request("GET", "/", None, {}) == (200, b"until the end")
    assert c.request("GET", "/", None, {}) == (200, b"x")
    assert c.request("GET", "/", None, {}) == (200, b"y")
    assert s.requests.connections == 3


def test_interim_answer_is_skipped(servers: list[Server]) -> None:
    s = start(servers, serve(b"HTTP/1.1 100 Continue\r\n\r\n" + answer(b"done", status="201 Created")))
    assert httpconn.Connection(f"http://127.0.0.1:{s.port}").request("POST", "/", b"{}", {}) == (201, b"done")


def test_a_kept_alive_connection_the_server_closed_is_reopened_once(servers: list[Server]) -> None:
    s = start(servers, serve(answer(b"1")), serve(answer(b"2")))  # the first connection closes after one
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}")
    assert c.request("GET", "/", None, {}) == (200, b"1")
    assert c.request("PUT", "/w", b"w", {}) == (200, b"2")
    assert [r[0] for r in s.requests.seen] == ["GET / HTTP/1.1", "PUT /w HTTP/1.1"]  # the PUT once


def test_a_fresh_connection_closed_without_an_answer_is_not_resent(servers: list[Server]) -> None:
    def drop(conn: socket.socket, reqs: Requests) -> None:
        reqs.read(conn)

    s = start(servers, drop)
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}")
    with pytest.raises(ConnectionResetError):
        c.request("POST", "/w", b"w", {})
    assert len(s.requests.seen) == 1


def test_no_answer_within_the_read_timeout_is_slow_answer(servers: list[Server]) -> None:
    done = threading.Event()

    def hold(conn: socket.socket, reqs: Requests) -> None:
        reqs.read(conn)
        done.wait(30)

    s = start(servers, hold)
    c = httpconn.Connection(f"http://127.0.0.1:{s.port}", read=0.2)
    try:
        with pytest.raises(httpconn.SlowAnswer):
            c.request("GET", "/", None, {})
    finally:
        done.set()


NOT_HTTP = [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: nine\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"]


@pytest.mark.parametrize("reply", NOT_HTTP)
def test_what_is_not_http_is_bad_answer(servers: list[Server], reply: bytes) -> None:
    def once(conn: socket.socket, reqs: Requests) -> None:
        reqs.read(conn)
        conn.sendall(reply)
        conn.shutdown(socket.SHUT_WR)

    s = start(servers, once)
    with pytest.raises(httpconn.BadAnswer):
        httpconn.Connection(f"http://127.0.0.1:{s.port}").request("GET", "/", None, {})


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> etcdutil.Certs:
    return etcdutil.make_certs(Path(tmp_path_factory.mktemp("certs")))


def server_tls(certs: etcdutil.Certs) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    return ctx


def test_tls_checks_the_server_name(servers: list[Server], certs: etcdutil.Certs) -> None:
    s = start(servers, serve(answer(b"ok")), serve(), tls=server_tls(certs))
    client = ssl.create_default_context(cafile=certs.ca)
    good = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=client, server_name="localhost")
    assert good.request("GET", "/", None, {}) == (200, b"ok")
    bad = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=client, server_name="elsewhere.example")
    with pytest.raises(ssl.SSLCertVerificationError) as e:
        bad.request("GET", "/", None, {})
    assert "elsewhere.example" in httpconn.describe(e.value)


def test_https_through_a_connect_proxy(servers: list[Server], certs: etcdutil.Certs) -> None:
    backend = start(servers, serve(answer(b"tunnelled"), answer(b"again")), tls=server_tls(certs))

    def proxy(conn: socket.socket, reqs: Requests) -> None:
        reqs.read(conn)
        upstream = socket.create_connection(("127.0.0.1", backend.port))
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        pipe = threading.Thread(target=_pump, args=(upstream, conn), daemon=True)
        pipe.start()
        _pump(conn, upstream)
        pipe.join(10)

    p = start(servers, proxy)
    tls = ssl.create_default_context(cafile=certs.ca)
    c = httpconn.Connection(f"https://localhost:{backend.port}", tls=tls, proxy=f"http://127.0.0.1:{p.port}")
    assert c.request("GET", "/a", None, {}) == (200, b"tunnelled")
    assert c.request("GET", "/b", None, {}) == (200, b"again")
    c.close()
    assert p.requests.seen[0][0] == f"CONNECT localhost:{backend.port} HTTP/1.1"
    assert [r[0] for r in backend.requests.seen] == ["GET /a HTTP/1.1", "GET /b HTTP/1.1"]


def test_a_refused_tunnel_says_so(servers: list[Server]) -> None:
    p = start(servers, serve(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"))
    c = httpconn.Connection("https://localhost:1", proxy=f"http://127.0.0.1:{p.port}")
    with pytest.raises(OSError, match="403 Forbidden"):
        c.request("GET", "/", None, {})


def test_plain_http_through_a_proxy_sends_the_absolute_target(servers: list[Server]) -> None:
    p = start(servers, serve(answer(b"via proxy")))
    c = httpconn.Connection("http://api.example:8080/base", proxy=f"http://127.0.0.1:{p.port}")
    assert c.request("GET", "/x", None, {}) == (200, b"via proxy")
    line, head, _ = p.requests.seen[0]
    assert line == "GET http://api.example:8080/base/x HTTP/1.1" and head["host"] == "api.example:8080"


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
