"""The small stand-ins the plugin's path uses instead of stdlib modules whose import costs every call
(cni.types.fields for re, ipam.httpconn for urllib.parse and the idna codec,
ipam.model's Allocation for typing.NamedTuple): each gives what the module it replaces gives."""

from __future__ import annotations

import hashlib
import pickle
import re
import ssl
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cni.types import fields
from ipam import digest, httpconn
from ipam.model import Allocation

URLISH = st.text(alphabet="htps:/[]abcXYZ019.-_~@?#%: \t\n", max_size=30)


def answer(split: object) -> tuple[object, ...]:
    try:
        port: object = split.port  # type: ignore[attr-defined]
    except ValueError as e:
        port = ("ValueError", str(e))
    return (split.scheme, split.hostname, port, split.path)  # type: ignore[attr-defined]


def same_as_urlsplit(url: str) -> None:
    try:
        want = answer(urlsplit(url))
    except ValueError as e:
        want = ("ValueError", str(e))
    try:
        got = answer(httpconn.split_url(url))
    except ValueError as e:
        got = ("ValueError", str(e))
    assert got == want, url


@given(st.one_of(URLISH, st.builds(lambda a, b: f"https://{a}{b}", URLISH, URLISH)))
@settings(max_examples=2000)
@example("https://127.0.0.1:6443")
@example("https://Kube.Example.COM")
@example("https://[::1]:6443/k8s/clusters/c-1")
@example("https://[FE80::1]:")
@example("http://host:65536")
@example("http://host:0")
@example("http://host:0080/")
@example("https://[::1]x")
@example("https://[127.0.0.1]")
@example("https://[fe80::1%eth0]:1")
@example("https://user@host:1")
@example(" https://host")
@example("https://host:١٢")
def test_split_url_is_urlsplit(url: str) -> None:
    same_as_urlsplit(url)


def _answer(f: Callable[[Any], str], arg: Any) -> str:
    """f(arg), or the name of the encoding error it raised (ours must raise where urllib's does)."""
    try:
        return f(arg)
    except UnicodeEncodeError:
        return "UnicodeEncodeError"


def test_split_url_plain_forms_are_split_without_urlsplit() -> None:
    for url in ("https://198.51.100.1:6443", "https://[2001:db8::1]:443/x", "http://Etcd-0.local"):
        assert isinstance(httpconn.split_url(url), httpconn.Url)
        same_as_urlsplit(url)


@given(st.text())
@example("kube-system")
@example("a b/c+d%é")
def test_quote_is_urllib_quote_safe_nothing(text: str) -> None:
    assert _answer(httpconn.quote, text) == _answer(lambda t: quote(t, safe=""), text)


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=12), st.integers(), st.booleans(),
                                                          st.binary(max_size=8)), max_size=4))
@example({"limit": 500, "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTJ9 +/="})
def test_urlencode_is_urllib_urlencode(query: dict[str, object]) -> None:
    assert _answer(httpconn.urlencode, query) == _answer(urlencode, query)


@given(st.text(alphabet="abcXYZ09.-_:é", max_size=80))
@example("a" * 63 + ".b")
@example("a" * 64)
@example(".a")
@example("a.")
@example("")
@example("münchen.example")
def test_tls_name_encodes_as_ssl_would(host: str) -> None:
    """ssl turns the server name into the same str either way (or fails the same way)."""
    encode = ssl.SSLContext._encode_hostname  # type: ignore[attr-defined]
    try:
        want = encode(None, host)
    except UnicodeError:
        want = "UnicodeError"
    try:
        got = encode(None, httpconn.encoded_host(host))
    except UnicodeError:
        got = "UnicodeError"
    assert got == want


def test_digest_is_hashlib_sha256() -> None:
    for data in (b"", b"abc", bytes(range(256)) * 5):
        assert digest.sha256_hex(data) == hashlib.sha256(data).hexdigest()


def test_allocation_is_the_named_tuple_it_was() -> None:
    a = Allocation("c", "ns/p", "net1")
    assert isinstance(a, tuple)
    assert Allocation._fields == ("container_id", "podref", "ifname", "pod_uid", "network", "node")
    assert Allocation._field_defaults == {"pod_uid": "", "network": "", "node": ""}
    assert a == ("c", "ns/p", "net1", "", "", "") and hash(a) == hash(tuple(a))
    assert repr(a) == (
        "Allocation(container_id='c', podref='ns/p', ifname='net1', pod_uid='', network='', node='')"
    )
    b = a._replace(node="n")
    assert type(b) is Allocation and b.node == "n" and Allocation._make(tuple(b)) == b
    assert pickle.loads(pickle.dumps(b)) == b and type(pickle.loads(pickle.dumps(b))) is Allocation
    assert not hasattr(a, "__dict__")
    assert a.same_attachment(Allocation("c", "", "net1")) and not a.same_attachment(Allocation("c", "", "x"))
    assert a.same_pod_interface(Allocation("d", "ns/p", "net1"))
    c, p, i, *_ = a
    assert (c, p, i) == ("c", "ns/p", "net1")
    match a:
        case Allocation(cid, pod):
            assert (cid, pod) == ("c", "ns/p")


MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}$")


PAIRS = st.lists(st.sampled_from(["0a", "FF", "9g", "a"]), min_size=6, max_size=6)


@given(st.one_of(st.text(alphabet="0aF9g:-\n", min_size=15, max_size=18),
                 PAIRS.flatmap(lambda parts: st.sampled_from([":", "-"]).map(lambda sep: sep.join(parts)))))
@example("00:11:22:33:44:55")
@example("00-11-22-33-44-55")
@example("00:11-22:33:44:55")
@example("00:11:22:33:44:55\n")
@example("\u0660\u0660:11:22:33:44:55")  # Arabic-Indic digits: not hex
def test_mac_check_is_the_pattern(text: str) -> None:
    assert fields._is_mac(text) == bool(MAC_RE.fullmatch(text))


@given(st.text(alphabet="aZ09_.-/ \né", max_size=8))
@example("")
@example("-a")
@example("a\n")
@example("é")
def test_name_check_is_the_pattern(text: str) -> None:
    pattern = re.compile(fields.NAME_PATTERN)
    assert fields.valid_name(text) == bool(pattern.fullmatch(text))
    assert fields.valid_name(text.removesuffix("\n")) == bool(pattern.match(text))  # ipam.config's
