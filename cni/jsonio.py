"""The one place JSON is read and written: the standard library's json (its C scanner and encoder for
these settings), the only importer of json (an import-linter contract).

What a CNI plugin must hold to, beyond json's defaults: NaN and Infinity are refused, and so is anything
that is not valid UTF-8 (bytes that do not decode, a lone surrogate escape); output is compact UTF-8
(or 2-space indented). Not orjson: measured frozen on the plugin path, it cost more than json
(docs/benchmarks.md, "Public modules")."""

from __future__ import annotations

import json

from cni.errors import DecodeError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

HEX_8_TO_F = frozenset("89abcdefABCDEF")


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_INDENTED = json.JSONEncoder(ensure_ascii=False, indent=2, allow_nan=False)


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
        obj = _DECODER.decode(text)
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
        return (_INDENTED if indent else _COMPACT).encode(obj).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a str we were given: escape it, stay valid JSON
        return json.dumps(obj, indent=2 if indent else None, separators=None if indent else (",", ":"),
                          allow_nan=False).encode()
