"""cni.jsonio on the standard library's json keeps what orjson enforced: no NaN/Infinity, valid UTF-8
text only (no lone surrogates), errors as DecodeError (code 6) never as a traceback; compact UTF-8 out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni import jsonio
from cni.errors import DecodeError

REPO = Path(__file__).resolve().parents[2]


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


# jsonio answers exactly as json.JSONDecoder with jsonio's settings: results, and json's own error
# messages (in the DecodeError's details).
DOCUMENTS = [
    '{}', ' [] ', '\t\n{"a": {"b": [1, -2.5e3, 1E-2, 0, true, false, null]}}\r\n', '"x"', '12', '-0', '1.0',
    '{"k": "caf\\u00e9 \\"q\\" \\\\ \\/ \\b\\f\\n\\r\\t"}', '"\\ud83d\\ude00"', '[1, [2, [3, {"d": {}}]]]',
    '{"a": 1, "a": 2}', '"é ☃ \U0001f600"', '[' * 50 + ']' * 50,
    # refused, each with json's own message
    '', ' ', '{', '[1,]', '{"a" 1}', "{'a': 1}", '[1] [2]', '{"a":1} x', 'nul', 'NaN', '[-Infinity]',
    '"\x01"',
    '"abc', '01', '[1 2]', '{"a":1,}', '"\\x"', '"\\u12"', '\ufeff{}', '[1]\x00',
]


@pytest.mark.parametrize("text", DOCUMENTS)
def test_loads_answers_as_json(text: str) -> None:
    reference = json.JSONDecoder(parse_constant=jsonio._refuse)
    try:
        expected: object = reference.decode(text)
    except ValueError as e:
        expected = str(e)
    try:
        got: object = jsonio.loads(text)
    except DecodeError as e:
        got = e.details
    assert got == expected


VALUES = [
    {}, [], "", "é\"\\\n\x00", 0, -1, 2**70, 1.5, -0.0, 1e300, True, None, {"a": [1, {"b": None}], "c": "d"},
    {1: "int key", 2.5: "float key", False: "bool key", None: "none key"}, (1, 2), [[[]]],
]


@pytest.mark.parametrize("value", VALUES)
def test_dumps_encodes_as_json(value: object) -> None:
    reference = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert jsonio.dumps(value) == reference.encode(value).encode()


def test_dumps_errors_are_jsons_and_leave_nothing_behind() -> None:
    reference = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    loop: list[object] = []
    loop.append(loop)
    for bad in ({"a": [1, object()]}, [float("inf")], loop, {(1, 2): 3}):
        with pytest.raises((TypeError, ValueError)) as ours:
            jsonio.dumps(bad)
        with pytest.raises((TypeError, ValueError)) as theirs:
            reference.encode(bad)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))
    # a failed encoding leaves no circular-reference marker behind: the same objects encode afterwards
    inner = [1]
    with pytest.raises(TypeError):
        jsonio.dumps({"x": inner, "y": object()})
    assert jsonio.dumps({"x": inner}) == b'{"x":[1]}'
