"""A real etcd (Debian's /usr/bin/etcd) for tests: 127.0.0.1, free ports, a temp data dir, stopped at the
end. Variants: TLS (a CA, a server certificate for 127.0.0.1 and a client certificate made with
openssl; client certificates required) and auth (root user, user `ipam` with a role limited to the
store's prefix). `stop()`/`start()` keep the data dir and ports, for outage tests.

`shared()` is one plain etcd per test process (started on first use, stopped at exit): the contract
suite gives every test its own key prefix on it instead of starting one per test."""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio

ETCD = os.environ.get("PYCNI_ETCD", "/usr/bin/etcd")
USER, PASSWORD = "ipam", "s3cret-Pa55word-for-tests"
ROOT_PASSWORD = "root-Pa55word-for-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_etcd() -> None:
    if not os.access(ETCD, os.X_OK):
        pytest.skip(f"{ETCD} not installed (Debian package etcd-server; `make deps`)")


@dataclass(frozen=True)
class Certs:
    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_certs(directory: Path, cn: str = "pycni-test") -> Certs:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={cn}-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for who in ("server", "client"):
        # no CN on the client: with auth on, etcd's gateway refuses client certificates that name a user
        subject = f"/CN={cn}-server" if who == "server" else f"/O={cn}-client"
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
            "-keyout", f"{who}.key", "-out", f"{who}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{who}.ext", "-out", f"{who}.crt")  # fmt: skip
    for p in d.iterdir():
        p.chmod(0o600)
    return Certs(*(str(d / n) for n in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")))


@dataclass
class Etcd:
    """One single-member etcd. `url` is the client endpoint."""

    data_dir: Path
    certs: Certs | None = None
    auth: bool = False
    extra: tuple[str, ...] = ()
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.certs else 'http'}://127.0.0.1:{self.client_port}"

    def ipam(self) -> dict[str, Any]:
        """The ipam keys that point a plugin at this etcd (with its credentials)."""
        out: dict[str, Any] = {"etcd_host": self.url}
        if self.certs:
            c = self.certs
            out |= {"etcd_ca_cert_file": c.ca, "etcd_cert_file": c.client_cert, "etcd_key_file": c.client_key}
        if self.auth:
            out |= {"etcd_username": USER, "etcd_password": PASSWORD}
        return out

    def start(self, timeout: float = 30.0) -> None:
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD, "--name", "pycni-test", "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"pycni-test={peer}", "--initial-cluster-state", "new",
            "--max-request-bytes", str(64 << 20), "--log-level", "warn", "--logger", "zap",
        ]  # fmt: skip
        if self.certs:
            c = self.certs
            args += ["--cert-file", c.server_cert, "--key-file", c.server_key,
                     "--trusted-ca-file", c.ca, "--client-cert-auth"]  # fmt: skip
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen([*args, *self.extra], stdout=log, stderr=log, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {(self.data_dir / 'etcd.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError, http.client.HTTPException, RuntimeError):
                self.post("maintenance/status", {}, auth=False)
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not answer: {(self.data_dir / 'etcd.log').read_text()[-2000:]}")
            time.sleep(0.05)
        if self.auth and not (self.data_dir / "auth-done").exists():
            self._enable_auth()
            (self.data_dir / "auth-done").write_text("")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: etcd stops mid-operation."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    # ---- admin requests (the tests' own, not the store's code) ----------------------------------------

    def _ssl(self) -> ssl.SSLContext:
        assert self.certs is not None
        ctx = ssl.create_default_context(cafile=self.certs.ca)
        ctx.load_cert_chain(self.certs.client_cert, self.certs.client_key)
        return ctx

    def post(self, method: str, body: dict[str, Any], auth: bool = True, token: str = "") -> dict[str, Any]:
        conn: http.client.HTTPConnection
        if self.certs:
            conn = http.client.HTTPSConnection("127.0.0.1", self.client_port, timeout=5, context=self._ssl())
        else:
            conn = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=5)
        if auth and self.auth and not token and (self.data_dir / "auth-done").exists():
            token = self.post("auth/authenticate", {"name": "root", "password": ROOT_PASSWORD}, auth=False)[
                "token"
            ]
        try:
            conn.request(
                "POST", f"/v3/{method}", jsonio.dumps(body), {"Authorization": token} if token else {}
            )
            resp = conn.getresponse()
            answer: dict[str, Any] = jsonio.loads(resp.read())
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"etcd {method}: {answer}")
        return answer

    def _enable_auth(self, prefix: bytes = b"/pycni/") -> None:
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        steps = [
            ("auth/user/add", {"name": "root", "password": ROOT_PASSWORD}),
            ("auth/user/grant", {"user": "root", "role": "root"}),
            ("auth/user/add", {"name": USER, "password": PASSWORD}),
            ("auth/role/add", {"name": "pycni-ipam"}),
            ("auth/role/grant", {"name": "pycni-ipam", "perm": {"permType": "READWRITE", "key": _b64(prefix),
                                                                 "range_end": _b64(end)}}),
            ("auth/user/grant", {"user": USER, "role": "pycni-ipam"}),
            ("auth/enable", {}),
        ]  # fmt: skip
        for method, body in steps:
            self.post(method, body, auth=False)

    def keys(self, prefix: bytes = b"/") -> dict[bytes, bytes]:
        """Every key under `prefix` (as root) with its value."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        kvs = self.post("kv/range", {"key": _b64(prefix), "range_end": _b64(end)}).get("kvs") or []
        return {base64.b64decode(kv["key"]): base64.b64decode(kv.get("value", "")) for kv in kvs}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _data_parent() -> str | None:
    """tmpfs when there is one: etcd fsyncs every write, and the tests measure our code, not the disk."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@contextlib.contextmanager
def running(certs_dir: Path | None = None, auth: bool = False, on_disk: bool = False) -> Iterator[Etcd]:
    """A started etcd, stopped and its data dir removed afterwards. `certs_dir`: TLS with certificates
    made there."""
    require_etcd()
    data = Path(tempfile.mkdtemp(prefix="pycni-etcd-", dir=None if on_disk else _data_parent()))
    certs = make_certs(certs_dir) if certs_dir is not None else None
    etcd = Etcd(data, certs, auth)
    try:
        etcd.start()
        yield etcd
    finally:
        etcd.stop()
        shutil.rmtree(data, ignore_errors=True)


_shared: list[Etcd] = []


def shared() -> Etcd:
    """One plain etcd for this test process (stopped at exit); give each user its own key prefix."""
    if not _shared:
        require_etcd()
        data = Path(tempfile.mkdtemp(prefix="pycni-etcd-", dir=_data_parent()))
        etcd = Etcd(data)
        etcd.start()
        _shared.append(etcd)

        def stop() -> None:
            etcd.stop()
            shutil.rmtree(data, ignore_errors=True)

        atexit.register(stop)
    if _shared[0].proc is None or _shared[0].proc.poll() is not None:
        _shared[0].start()
    return _shared[0]


# ---- the store suites' entries (tests/contract/factories.py, tests/concurrency/stores.py) --------------


class EtcdFactory:
    """Handles onto the shared etcd under one fresh prefix; `unreachable()` points at a closed port."""

    def __init__(self, etcd: Etcd) -> None:
        import uuid

        self.etcd, self.prefix = etcd, f"/pycni/test-{uuid.uuid4().hex[:12]}/"

    def open(self) -> Any:
        from ipam.store.etcd import EtcdStore
        from ipam.store.etcdgw import Gateway, parse_endpoints

        return EtcdStore(Gateway(parse_endpoints(self.etcd.url, False)), self.prefix)

    def unreachable(self) -> Any:
        from ipam.store.etcd import EtcdStore
        from ipam.store.etcdgw import Gateway, parse_endpoints

        return EtcdStore(Gateway(parse_endpoints(f"127.0.0.1:{free_port()}", False)), self.prefix)


def etcd_factory(tmp: Path) -> EtcdFactory:
    return EtcdFactory(shared())


def store_config(etcd: Etcd, tmp: Path) -> Any:
    from ipam.config import store_config

    return store_config({**etcd.ipam(), "local_db": str(tmp / "state" / "whereabouts.db")})


@contextlib.contextmanager
def etcd_target(tmp: Path) -> Iterator[Any]:
    """A concurrency-suite Target on an etcd of its own (the suite stops nothing, but runs long)."""
    from ipam.store.etcd import open_store
    from tests.concurrency.stores import Target

    with running() as etcd:
        ipam = {**etcd.ipam(), "local_db": str(tmp / "state" / "whereabouts.db")}
        yield Target(ipam, lambda: open_store(store_config(etcd, tmp)))
