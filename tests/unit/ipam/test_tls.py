"""ipam.tls: `_ssl` and `_socket` used directly must configure and check exactly what the ssl module
would (ssl.create_default_context, SSLContext.wrap_socket): every setting of the context compared, and
handshakes against a local TLS server (the right CA and name, a wrong name, an unknown CA, a server
that closes without close_notify)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from ipam import httpconn, tls
from tests import etcdutil
from tests.unit.ipam.test_httpconn import Requests, Server, answer, serve, server_tls, servers, start

__all__ = ["servers"]  # the fixture, used by name

SETTINGS = ("check_hostname", "verify_mode", "options", "verify_flags", "minimum_version",
            "maximum_version", "protocol", "security_level", "post_handshake_auth", "num_tickets",
            "keylog_filename")  # fmt: skip
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> etcdutil.Certs:
    return etcdutil.make_certs(Path(tmp_path_factory.mktemp("certs")))


def same_settings(ours: tls.Context, theirs: ssl.SSLContext) -> None:
    for name in SETTINGS:
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.get_ciphers() == theirs.get_ciphers()
    assert ours.cert_store_stats() == theirs.cert_store_stats()
    assert ours.get_ca_certs() == theirs.get_ca_certs()


def test_client_context_is_ssls_default_context(certs: etcdutil.Certs) -> None:
    same_settings(tls.client_context(), ssl.create_default_context())
    same_settings(tls.client_context(cafile=certs.ca), ssl.create_default_context(cafile=certs.ca))
    pem = Path(certs.ca).read_text()
    same_settings(tls.client_context(cadata=pem), ssl.create_default_context(cadata=pem))
    assert tls.client_context(cafile=certs.ca).check_hostname is True
    assert tls.client_context(cafile=certs.ca).verify_mode == ssl.CERT_REQUIRED
    assert tls.client_context().minimum_version == ssl.TLSVersion.TLSv1_2


def test_a_bad_ca_fails_as_ssl_does(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ssl.SSLError):
        tls.client_context(cafile=str(bogus))
    with pytest.raises(FileNotFoundError):
        tls.client_context(cafile=str(tmp_path / "missing.pem"))


def test_handshake_checks_ca_and_name(servers: list[Server], certs: etcdutil.Certs) -> None:
    s = start(servers, serve(answer(b"ok")), serve(answer(b"ok")), serve(), serve(), serve(),
              tls=server_tls(certs))  # fmt: skip
    ctx = tls.client_context(cafile=certs.ca)
    for name in ("localhost", "127.0.0.1"):  # the certificate's names: DNS:localhost, IP:127.0.0.1
        good = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=ctx, server_name=name)
        assert good.request("GET", "/", None, {}) == (200, b"ok")
        good.close()
    # X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH
    for name, code in (("elsewhere.example", 62), ("198.51.100.7", 64)):
        bad = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=ctx, server_name=name)
        with pytest.raises(ssl.SSLCertVerificationError) as e:
            bad.request("GET", "/", None, {})
        assert e.value.verify_code == code and name in httpconn.describe(e.value)
    unknown = httpconn.Connection(f"https://localhost:{s.port}", tls=tls.client_context())  # system CAs
    with pytest.raises(ssl.SSLCertVerificationError) as e:
        unknown.request("GET", "/", None, {})
    assert "unable to get local issuer certificate" in httpconn.describe(e.value)


def test_a_close_delimited_answer_without_close_notify(servers: list[Server], certs: etcdutil.Certs) -> None:
    """The server closes the TCP connection without a TLS close_notify after an answer that ends at
    close: the body is what came before (ssl's suppress_ragged_eofs), not an error."""

    def ragged(conn: socket.socket, reqs: Requests) -> None:
        reqs.read(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
        raw = conn.detach() if isinstance(conn, ssl.SSLSocket) else conn.fileno()
        socket.socket(fileno=raw).close()  # the TCP connection only: no close_notify

    s = start(servers, ragged, tls=server_tls(certs))
    c = httpconn.Connection(f"https://localhost:{s.port}", tls=tls.client_context(cafile=certs.ca))
    assert c.request("GET", "/", None, {}) == (200, b"until the end")


def test_tls_path_imports_neither_ssl_nor_socket() -> None:
    code = ("import sys; from ipam import kubeapi, httpconn; "
            "gone = {'ssl', 'socket', 'selectors', 'base64', 're', 'json', 'enum'}; "
            "print(sorted(gone & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.stdout.strip() == "[]", out.stderr
