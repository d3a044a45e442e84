"""The one place JSON is read and written (the standard library's json, C accelerated).

Not orjson: importing orjson imports dataclasses (and with it inspect, ast, dis, tokenize), uuid,
datetime and json itself on every frozen plugin call, to parse a few hundred bytes of config.
What orjson gave for free is kept here: NaN and Infinity are refused, and so is anything that is not
valid UTF-8; output is compact UTF-8 (or 2-space indented).

The common case runs json's own C scanner and encoder (`_json`, what json.JSONDecoder and
json.JSONEncoder run for these settings) without importing the json package: json.decoder compiles
regular expressions at import, and `re` with json add to every plugin call's imports (figures:
docs/benchmarks.md). Whatever the C path does not accept (malformed input, a constant,
indented output, a lone surrogate) goes to json itself, imported then, so every answer and every error
message is exactly json's (tests/unit/test_jsonio.py compares them)."""

from __future__ import annotations

import _json

from cni.errors import DecodeError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE's characters
HEX_8_TO_F = frozenset("89abcdefABCDEF")


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Settings:
    """What json.JSONDecoder(parse_constant=_refuse) hands its C scanner (c_make_scanner reads these)."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = staticmethod(_refuse)


def _not_serializable(o: Any) -> Any:
    """json.JSONEncoder.default."""
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


_SCAN = _json.make_scanner(_Settings())  # type: ignore[arg-type]  # (typeshed: a scanner context)


def _compact(obj: Any) -> str:
    """json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(obj): the
    C encoder it runs, with its own circular-reference markers (a fresh dict per call, as json's)."""
    if isinstance(obj, str):
        return _json.encode_basestring(obj)
    encode = _json.make_encoder(
        {}, _not_serializable, _json.encode_basestring, None, ":", ",", False, False, False
    )  # markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan
    return "".join(encode(obj, 0))


def _decode(text: str) -> Any:
    """json.JSONDecoder(parse_constant=_refuse).decode(text)."""
    start = len(text) - len(text.lstrip(WHITESPACE))
    try:
        obj, end = _SCAN(text, start)
    except StopIteration:  # no value at `start`: json's own error message
        obj, end = None, -1
    if end < 0 or text[end:].strip(WHITESPACE):
        import json  # the error path (or extra data): json raises its own JSONDecodeError

        return json.JSONDecoder(parse_constant=_refuse).decode(text)
    return obj


def _surrogate_escape(text: str) -> bool:
    r"""Whether `text` holds a \uD800-\uDFFF escape (the regular expression `\\u[dD][89a-fA-F]`)."""
    at = text.find("\\u")
    while at >= 0:
        if text[at + 2 : at + 3] in ("d", "D") and text[at + 3 : at + 4] in HEX_8_TO_F:
            return True
        at = text.find("\\u", at + 2)
    return False


def loads(data: bytes | str, what: str = "stdin") -> Any:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray | memoryview) else data
        obj = _decode(text)
        if _surrogate_escape(text):
            _no_lone_surrogates(obj)  # "\ud800" escapes decode to str that is no Unicode text
        return obj
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeError are ValueErrors
        raise DecodeError(f"{what}: malformed JSON", str(e)[:200]) from None


def _no_lone_surrogates(obj: Any) -> None:
    if isinstance(obj, str):
        obj.encode("utf-8")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            k.encode("utf-8")
            _no_lone_surrogates(v)
    elif isinstance(obj, list):
        for v in obj:
            _no_lone_surrogates(v)


def dumps(obj: Any, indent: bool = False) -> bytes:
    try:
        if indent:
            import json  # indented output is for people (tools, logs): json's Python encoder

            return json.JSONEncoder(ensure_ascii=False, indent=2, allow_nan=False).encode(obj).encode("utf-8")
        return _compact(obj).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a str we were given: escape it, stay valid JSON
        import json

        return json.dumps(obj, indent=2 if indent else None, separators=None if indent else (",", ":"),
                          allow_nan=False).encode()
