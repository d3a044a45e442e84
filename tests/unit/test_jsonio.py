"""cni.jsonio on the standard library's json keeps what orjson enforced: no NaN/Infinity, valid UTF-8
text only (no lone surrogates), errors as DecodeError (code 6) never as a traceback; compact UTF-8 out."""

from __future__ import annotations

import json

import pytest

from cni import jsonio
from cni.errors import DecodeError


@pytest.mark.parametrize("data", [
    b"NaN", b"[Infinity]", b'{"mtu": -Infinity}', b"{", b'{"a":1} x', b"\xff\xfe", b'"\\ud800"',
    b'{"\\udc00": 1}', b"\xef\xbb\xbf{}", b"[" * 5000 + b"]" * 5000, b"9" * 5000, b"",
])
def test_refused_as_decode_errors(data: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        jsonio.loads(data, "stdin")
    assert info.value.code == 6 and info.value.msg == "stdin: malformed JSON"


def test_accepted() -> None:
    assert jsonio.loads(b' {"name": "caf\\u00e9", "x": [1, 2.5, null, true]} ') == {
        "name": "café", "x": [1, 2.5, None, True]}
    assert jsonio.loads('"\\ud83d\\ude00"') == "\U0001f600"  # a surrogate pair is one character
    assert jsonio.loads(bytearray(b"[1]")) == [1]


def test_dumps_compact_utf8_and_indented() -> None:
    assert jsonio.dumps({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'.encode()
    assert jsonio.dumps({"a": 1}, indent=True) == b'{\n  "a": 1\n}'
    with pytest.raises(ValueError):
        jsonio.dumps(float("nan"))


def test_dumps_a_lone_surrogate_as_an_escape() -> None:
    out = jsonio.dumps({"k": "\ud800"})
    assert out == b'{"k":"\\ud800"}' and json.loads(out) == {"k": "\ud800"}
