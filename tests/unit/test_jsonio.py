"""cni.jsonio on the standard library's json keeps what orjson enforced: no NaN/Infinity, valid UTF-8
text only (no lone surrogates), errors as DecodeError (code 6) never as a traceback; compact UTF-8 out."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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


# jsonio drives json's C scanner and encoder itself (importing json costs each call ~3 ms, with re):
# its answers and its errors must be json's, for any input.
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
JSON_TEXT = st.one_of(
    st.text(alphabet=' \t\n\r{}[]":,.-+eE0123456789abcnulltrufsNIy\\ud8é', max_size=40),
    VALUES.map(lambda o: json.dumps(o, indent=1)),
)


def outcome(f: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", f()
    except (ValueError, TypeError, RecursionError) as e:
        return type(e).__name__, str(e)


@given(JSON_TEXT)
@settings(max_examples=1500)
@example(" [1] \n")
@example("[1] x")
@example("")
@example("  ")
@example("NaN")
def test_decode_is_json_decoders(text: str) -> None:
    want = outcome(lambda: json.JSONDecoder(parse_constant=jsonio._refuse).decode(text))
    got = outcome(lambda: jsonio._decode(text))
    assert got == want, text  # (no NaN to compare: parse_constant refuses it)


@given(JSON_TEXT)
@example("\\ud800")
@example("\\uD9")
@example("\\u")
@example("\\\\ud800")
@example("x\\uda")
def test_surrogate_escape_is_the_pattern(text: str) -> None:
    assert jsonio._surrogate_escape(text) == bool(re.search(r"\\u[dD][89a-fA-F]", text))


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none(), st.floats()),
                        inner, max_size=3) | st.tuples(inner),
                    max_leaves=8))  # fmt: skip
@settings(max_examples=1500)
@example({"k": "\ud800"})
@example({"s": {1, 2}})
@example({(1,): 1})
@example("\u2028 é \x00")
def test_dumps_is_json_encoders(obj: Any) -> None:
    def stdlib() -> bytes:
        try:
            encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            return encoder.encode(obj).encode()
        except UnicodeEncodeError:
            return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()

    assert outcome(lambda: jsonio.dumps(obj)) == outcome(stdlib)


def test_dumps_keeps_no_circular_memo_across_calls() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        jsonio.dumps(loop)
    shared = [1]
    assert jsonio.dumps([shared, shared]) == b"[[1],[1]]"
