"""A 401 while the token file still holds the refused token: the client waits (bounded) for the file to
change, then tries again. On a node, the installer's copy of its pod's bound token stops working when the
pod is deleted (a DaemonSet rollout), until the next installer pod writes its own: the cluster suite's
upgrade test saw DELs fail with 401 in that window (FailedKillPod) before this wait existed."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ipam import kubeapi

OLD, NEW = "PYCNI-SECRET-old", "PYCNI-SECRET-new"


class Api(http.server.BaseHTTPRequestHandler):
    refused = threading.Event()  # set (per test) when the old token has been refused once

    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == f"Bearer {NEW}"
        if not ok:
            type(self).refused.set()
        body = json.dumps({"kind": "Status", "items": []} if ok else
                          {"kind": "Status", "reason": "Unauthorized", "message": "Unauthorized"}).encode()
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Api.refused = threading.Event()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def client(server: str, token: Path) -> kubeapi.Client:
    return kubeapi.Client(kubeapi.KubeConfig(path="test", server=server, token_file=str(token)))


def test_a_token_written_after_the_401_is_awaited_and_used(server: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(OLD)
    c = client(server, token)

    def installer() -> None:  # the next installer pod: writes its token once the old one was refused
        Api.refused.wait(timeout=60)
        (tmp_path / "token.new").write_text(NEW)
        (tmp_path / "token.new").replace(token)

    writer = threading.Thread(target=installer)
    writer.start()
    try:
        assert c.request("GET", "/apis/x") == {"kind": "Status", "items": []}
    finally:
        writer.join()
        c.close()
    assert Api.refused.is_set()  # the first answer was a 401: the second request carried the new token


def test_an_unchanged_token_file_fails_after_the_bounded_wait(server: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(OLD)
    c = client(server, token)
    c.token_wait = 0.5
    try:
        with pytest.raises(kubeapi.ApiError, match="401") as e:
            c.request("GET", "/apis/x")
        assert OLD not in str(e.value)
    finally:
        c.close()
