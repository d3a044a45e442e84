"""The etcd gateway client's pure parts (no etcd needed): endpoints, key ranges, the token cache, and
what importing the store costs. The store against a real etcd: tests/contract (factory "etcd",
test_etcd.py)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cni.errors import Code, ConfigError
from ipam.store.etcdgw import Endpoint, TokenCache, parse_endpoints, prefix_end
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO


@pytest.mark.parametrize(
    ("text", "tls", "expected"),
    [
        ("127.0.0.1:2379", False, ["http://127.0.0.1:2379"]),
        ("127.0.0.1", True, ["https://127.0.0.1:2379"]),
        ("http://a:1, https://b:2,,", False, ["http://a:1", "https://b:2"]),
        ("[2001:db8::1]:4001", False, ["http://[2001:db8::1]:4001"]),
        ("https://etcd.example:2379/", False, ["https://etcd.example:2379"]),
    ],
)
def test_endpoints(text: str, tls: bool, expected: list[str]) -> None:
    assert [str(e) for e in parse_endpoints(text, tls)] == expected


@pytest.mark.parametrize("text", ["", " , ", "ftp://a:1", "a:notaport", "http://a:1/v3/kv", "a:99999"])
def test_bad_endpoints_name_the_field(text: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_endpoints(text, False)
    assert e.value.code == Code.INVALID_CONFIG and e.value.msg.startswith("ipam.etcd_host:")


def test_prefix_end() -> None:
    assert prefix_end(b"/pycni/") == b"/pycni0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


def test_endpoint_is_plain_data() -> None:
    assert Endpoint("http", "h", 1) == parse_endpoints("h:1", False)[0]


def test_token_cache_is_private_atomic_and_keyed_by_credentials(tmp_path: Path) -> None:
    cache = TokenCache(str(tmp_path / "state"), ["http://h:1", "user", "pw"])
    assert cache.read() is None
    cache.write("tok-1")
    [path] = (tmp_path / "state").iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "pw" not in path.name and "user" not in path.name
    assert cache.read() == "tok-1"
    assert TokenCache(str(tmp_path / "state"), ["http://h:1", "user", "other"]).read() is None
    cache.forget("someone-else's")
    assert cache.read() == "tok-1"
    cache.forget("tok-1")
    assert cache.read() is None


def test_token_cache_ignores_files_others_could_read_or_plant(tmp_path: Path) -> None:
    cache = TokenCache(str(tmp_path), ["e", "u", "p"])
    cache.write("tok")
    path = tmp_path / cache.name
    path.chmod(0o644)
    assert cache.read() is None
    path.unlink()
    victim = tmp_path / "victim"
    victim.write_text("secret-of-someone")
    path.symlink_to(victim)
    assert cache.read() is None
    cache.write("tok2")
    assert victim.read_text() == "secret-of-someone" and not path.is_symlink() and cache.read() == "tok2"


def test_token_cache_in_an_unusable_directory_is_skipped(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = TokenCache(str(blocker / "state"), ["e", "u", "p"])
    cache.write("tok")  # logs at debug level, never fails the call
    assert cache.read() is None


def test_importing_the_store_is_cheap() -> None:
    """No grpc, no protobuf: the etcd store is ipam.httpconn (socket and ssl through ipam.tls) and base64."""
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import ipam.store.etcd"],
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        check=True,
    )
    mods = [line.rsplit("|", 1)[1].strip() for line in p.stderr.decode().splitlines() if "|" in line]
    assert "ipam.httpconn" in mods and "ipam.tls" in mods and "ssl" in mods
    heavy = ("http", "email", "grpc", "google", "etcd3", "kubernetes", "pyroute2")
    assert not [m for m in mods if m.split(".")[0] in heavy]
