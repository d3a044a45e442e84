"""A plain-HTTP front for the real kube-apiserver that applies a request and then withholds its answer, as
a loaded server does when it answers past the client's read timeout (the test's own; on loopback only).

`StallProxy(server)` listens on 127.0.0.1 (http) and forwards every request to the real server (https,
its CA) with the client's own headers (its token): the code under test reaches the server through a
kubeconfig `kubeconfig()` writes, a copy of a tenant's with the proxy as the server. `stall(match, meanwhile)`
arms one fault: the next request `match(method, path)` accepts is forwarded and its answer received
(the server applied it), `meanwhile()` runs (what the rest of the cluster does while the client waits),
and the answer is never sent: the connection stays silent until the client gives up and closes it.
Requests that arrive after the stalled one (the client's retry, on a new connection) wait until its
answer was received and `meanwhile` ran, so the order is the same however fast each side is.
`stalled` is set once the answer is withheld (`status`: the server's); `hung_up` counts the clients
that closed a stalled connection without an answer; `errors`: what `meanwhile` raised."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.kubeup import KubeServer

# not copied either way: the connection's own, and those the proxy's answer sets itself
HOPS = {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "date", "server"}
WAIT = 60.0  # a bound against a hang: the stalled request's answer, a client's hang-up


class StallProxy:
    def __init__(self, server: KubeServer) -> None:
        self.upstream = urlsplit(server.url)
        self.tls = ssl.create_default_context(cafile=server.ca_file)
        self.lock = threading.Lock()
        self.armed: tuple[Callable[[str, str], bool], Callable[[], None]] | None = None
        self.applied: threading.Event | None = None  # once a request is stalled: set once it is applied
        self.stalled = threading.Event()
        self.status = 0  # the server's answer to the stalled request (withheld)
        self.hung_up = 0
        self.errors: list[BaseException] = []  # raised by `meanwhile`: the test's to report
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # (the base's signature)
                pass

            def _any(self) -> None:
                proxy._serve(self)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def kubeconfig(self, of: Path, path: Path) -> Path:
        """A copy of kubeconfig `of` (its user, its namespace) whose server is this proxy."""
        doc = json.loads(of.read_text())
        for cluster in doc["clusters"]:
            cluster["cluster"] = {"server": self.url}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # (it names the token file)
        with os.fdopen(fd, "w") as fh:
            json.dump(doc, fh, indent=1)
        return path

    def stall(self, match: Callable[[str, str], bool], meanwhile: Callable[[], None] = lambda: None) -> None:
        with self.lock:
            self.armed, self.applied = (match, meanwhile), None
            self.stalled.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        with self.lock:
            armed, applied = self.armed, self.applied
            mine = armed is not None and armed[0](h.command, h.path)
            if mine:
                self.armed, self.applied = None, threading.Event()
                applied = self.applied
        if applied is not None and not mine:  # after the stalled request: once it is applied
            assert applied.wait(WAIT), "the stalled request was never answered by the server"
        status, headers, data = self._forward(h, body)
        if mine:
            assert armed is not None and applied is not None
            self.status = status
            try:
                armed[1]()
            except BaseException as e:
                self.errors.append(e)
                raise
            finally:
                applied.set()
            self._withhold(h)
            return
        h.send_response(status)
        for k, v in headers:
            if k.lower() not in HOPS:
                h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _forward(
        self, h: BaseHTTPRequestHandler, body: bytes | None
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPSConnection(self.upstream.hostname or "127.0.0.1", self.upstream.port,
                                           context=self.tls, timeout=WAIT)  # fmt: skip
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in HOPS}
            conn.request(h.command, h.path, body, headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    def _withhold(self, h: BaseHTTPRequestHandler) -> None:
        """No answer: wait for the client to close the connection (its read timeout), then drop it."""
        self.stalled.set()
        sock: socket.socket = h.connection
        sock.settimeout(WAIT)
        try:
            if sock.recv(1) == b"":
                with self.lock:
                    self.hung_up += 1
        except OSError:
            pass
        h.close_connection = True
