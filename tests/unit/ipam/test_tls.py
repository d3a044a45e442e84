"""ipam.tls (the ssl module's default client context and wrap_socket) through ipam.httpconn against local
TLS servers on 127.0.0.1: the right and a wrong CA, name and IP SAN; a missing server hostname refused;
SNI sent; a kubeconfig's insecure-skip-tls-verify honoured (and refused without it); client
certificates required by the server; a server that closes without close_notify. Certificates are made
with the openssl CLI (tests/etcdutil.make_certs)."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from cni import jsonio
from ipam import httpconn, kubeapi, tls
from ipam.store import etcdgw
from tests import etcdutil
from tests.unit.ipam.test_httpconn import Requests, Server, answer, serve, server_tls, servers, start

__all__ = ["servers"]  # the fixture, used by name


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> etcdutil.Certs:
    return etcdutil.make_certs(Path(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> etcdutil.Certs:
    """Another CA, with the same names on its server certificate."""
    return etcdutil.make_certs(Path(tmp_path_factory.mktemp("other")), cn="pycni-other")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed server certificate for another name (what insecure-skip-tls-verify is for)."""
    d = Path(tmp_path_factory.mktemp("self"))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=wrong.example", "-addext", "subjectAltName=DNS:wrong.example",
                    "-keyout", "k.pem", "-out", "c.pem"], cwd=d, check=True, capture_output=True)  # fmt: skip
    return str(d / "c.pem"), str(d / "k.pem")


def recording_sni(ctx: ssl.SSLContext) -> list[str | None]:
    """The server names the server's handshakes received (None: no SNI)."""
    names: list[str | None] = []

    def callback(_sock: ssl.SSLObject | ssl.SSLSocket, name: str | None, _ctx: ssl.SSLContext) -> None:
        names.append(name)

    ctx.sni_callback = callback
    return names


def test_client_context_is_the_default_context(certs: etcdutil.Certs) -> None:
    for ctx in (tls.client_context(), tls.client_context(cafile=certs.ca)):
        assert ctx.check_hostname is True and ctx.verify_mode == ssl.CERT_REQUIRED
        assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2 and ctx.protocol == ssl.PROTOCOL_TLS_CLIENT
        assert ctx.verify_flags == ssl.create_default_context().verify_flags
        assert ctx.options == ssl.create_default_context().options
    pem = Path(certs.ca).read_text()
    loaded = [c["subject"] for c in tls.client_context(cadata=pem).get_ca_certs()]
    assert loaded == [((("commonName", "pycni-test-ca"),),)]
    assert tls.client_context(cafile=certs.ca).get_ca_certs() == tls.client_context(cadata=pem).get_ca_certs()


def test_a_bad_ca_fails_as_ssl_does(tmp_path: Path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with pytest.raises(ssl.SSLError):
        tls.client_context(cafile=str(bogus))
    with pytest.raises(FileNotFoundError):
        tls.client_context(cafile=str(tmp_path / "missing.pem"))


def test_handshake_checks_ca_name_and_ip_san(
    servers: list[Server], certs: etcdutil.Certs, other_ca: etcdutil.Certs
) -> None:
    s = start(servers, serve(answer(b"ok")), serve(answer(b"ok")), serve(), serve(), serve(), serve(),
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
    for wrong in (tls.client_context(), tls.client_context(cafile=other_ca.ca)):  # system CAs; another CA
        unknown = httpconn.Connection(f"https://localhost:{s.port}", tls=wrong)
        with pytest.raises(ssl.SSLCertVerificationError) as e:
            unknown.request("GET", "/", None, {})
        assert "unable to get local issuer certificate" in httpconn.describe(e.value)
    assert s.requests.seen[0][0] == "GET / HTTP/1.1" and len(s.requests.seen) == 2  # only the good ones


def test_a_missing_server_hostname_is_refused(servers: list[Server], certs: etcdutil.Certs) -> None:
    """No name, no handshake: nothing is sent, the socket is closed (never a TLS session whose
    certificate was checked against no name)."""
    seen: list[bytes] = []
    peeked = threading.Event()

    def peek(conn: socket.socket, _reqs: Requests) -> None:
        seen.append(conn.recv(1))  # b"": the client closed without a ClientHello
        peeked.set()

    s = start(servers, peek)
    sock = tls.connect(b"127.0.0.1", s.port, 5.0)
    for empty in ("", b""):
        with pytest.raises(ValueError, match="no server hostname"):
            tls.wrap(tls.client_context(cafile=certs.ca), sock, empty)
        assert sock.fileno() == -1
    assert peeked.wait(60)  # the server read the connection (closing it first would drop it unread)
    s.close()
    assert seen == [b""]


def test_sni_is_the_server_name(servers: list[Server], certs: etcdutil.Certs) -> None:
    server = server_tls(certs)
    names = recording_sni(server)
    s = start(servers, serve(answer(b"a")), serve(answer(b"b")), serve(answer(b"c")), tls=server)
    ctx = tls.client_context(cafile=certs.ca)
    for url, override in ((f"https://localhost:{s.port}", ""), (f"https://127.0.0.1:{s.port}", "localhost"),
                          (f"https://127.0.0.1:{s.port}", "")):  # fmt: skip
        c = httpconn.Connection(url, tls=ctx, server_name=override)
        assert c.request("GET", "/", None, {})[0] == 200
        c.close()
    assert names == ["localhost", "localhost", None]  # an address is never sent as SNI (RFC 6066)


def kubeconfig(tmp_path: Path, port: int, **cluster: object) -> kubeapi.KubeConfig:
    path = tmp_path / "kubeconfig"
    path.write_bytes(jsonio.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"https://127.0.0.1:{port}", **cluster}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))  # fmt: skip
    return kubeapi.load_kubeconfig(str(path))


def test_insecure_skip_tls_verify(
    servers: list[Server], self_signed: tuple[str, str], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A self-signed certificate for another name: accepted with the kubeconfig's
    insecure-skip-tls-verify (and logged), refused without it (on the name and on the issuer)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(*self_signed)
    names = recording_sni(server)
    s = start(servers, serve(answer(b"insecure ok")), serve(), serve(), tls=server)
    conf = kubeconfig(tmp_path, s.port, **{"insecure-skip-tls-verify": True, "tls-server-name": "kube.test"})
    assert conf.insecure
    ctx = kubeapi.tls_context(conf, None, None)
    warned = "insecure-skip-tls-verify: the server's TLS certificate and name are NOT checked"
    assert warned in capfd.readouterr().err
    c = httpconn.Connection(conf.server, tls=ctx, server_name=conf.tls_server_name)
    assert c.request("GET", "/", None, {}) == (200, b"insecure ok")
    assert names == ["kube.test"]  # the name is still sent
    strict = kubeconfig(tmp_path, s.port, **{"certificate-authority": self_signed[0]})
    assert not strict.insecure
    for ctx in (kubeapi.tls_context(strict, None, None), tls.client_context()):  # its own CA; system CAs
        refused = httpconn.Connection(strict.server, tls=ctx)
        with pytest.raises(ssl.SSLCertVerificationError):
            refused.request("GET", "/", None, {})
    assert len(s.requests.seen) == 1


def test_client_certificates(servers: list[Server], certs: etcdutil.Certs) -> None:
    """A server that requires a client certificate from its CA: etcd's TLS settings with the client
    certificate pass, without it the server refuses the handshake (and never sees a request)."""
    server = server_tls(certs)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(certs.ca)
    peers: list[object] = []

    def who(conn: socket.socket, reqs: Requests) -> None:
        assert isinstance(conn, ssl.SSLSocket)
        peers.append(conn.getpeercert()["subject"])
        serve(answer(b"hello client"))(conn, reqs)

    s = start(servers, who, who, tls=server)
    with_cert = etcdgw.tls_context(certs.ca, certs.client_cert, certs.client_key)
    c = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=with_cert)
    assert c.request("GET", "/", None, {}) == (200, b"hello client")
    c.close()
    without = httpconn.Connection(f"https://127.0.0.1:{s.port}", tls=etcdgw.tls_context(certs.ca, "", ""))
    with pytest.raises(OSError) as e:  # TLS 1.3: the server's alert arrives at the client's first read
        without.request("GET", "/", None, {})
    assert isinstance(e.value, ssl.SSLError | ConnectionResetError), e.value
    assert peers == [((("organizationName", "pycni-test-client"),),)] and len(s.requests.seen) == 1


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
