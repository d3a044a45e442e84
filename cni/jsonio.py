"""The one place JSON is read and written (the standard library's json, C accelerated).

Not orjson: importing orjson imports dataclasses (and with it inspect, ast, dis, tokenize), uuid,
datetime and json itself on every frozen plugin call, to parse a few hundred bytes of config.
What orjson gave for free is kept here: NaN and Infinity are refused, and so is anything that is not
valid UTF-8; output is compact UTF-8 (or 2-space indented).

The json package itself only when needed (indented output, an error to report): importing it imports
`re` and compiles its patterns, ~3 ms of every plugin call. A plugin call's documents go through the
same C scanner and encoder (_json) that json.JSONDecoder and json.JSONEncoder drive, with the same
settings, so the answers are theirs; anything that fails is redone by json itself, so the errors are
json's too."""

from __future__ import annotations

import _json

from cni.errors import DecodeError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE
_SURROGATE_HIGH_DIGIT = frozenset("89abcdefABCDEF")  # \\uD800-\\uDFFF: D, then one of these


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Decoding:
    """What _json.make_scanner reads of a json.JSONDecoder: JSONDecoder(parse_constant=_refuse)'s."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_refuse)


_SCAN = _json.make_scanner(_Decoding())  # type: ignore[arg-type]  # (a context duck-typed, as json's)


def _stdlib_decoder() -> Any:
    import json  # the one place (make lint: import-linter's contract)

    return json.JSONDecoder(parse_constant=_refuse)


def _decode(text: str) -> Any:
    """json.JSONDecoder(parse_constant=_refuse).decode(text)."""
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        obj, end = _SCAN(text, start)
    except StopIteration:  # no value at `start`: json's own error ("Expecting value")
        return _stdlib_decoder().decode(text)
    if end != len(text.rstrip(_WHITESPACE)):  # json's "Extra data"
        return _stdlib_decoder().decode(text)
    return obj


def loads(data: bytes | str, what: str = "stdin") -> Any:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray | memoryview) else data
        obj = _decode(text)
        if _surrogate_escape(text):
            _no_lone_surrogates(obj)  # "\ud800" escapes decode to str that is no Unicode text
        return obj
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeError are ValueErrors
        raise DecodeError(f"{what}: malformed JSON", str(e)[:200]) from None


def _surrogate_escape(text: str) -> bool:
    """Whether `text` holds an escape of a surrogate (the pattern \\u[dD][89a-fA-F])."""
    i = text.find("\\u")
    while i >= 0:
        if text[i + 2 : i + 3] in ("d", "D") and text[i + 3 : i + 4] in _SURROGATE_HIGH_DIGIT:
            return True
        i = text.find("\\u", i + 2)
    return False


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


def _unencodable(o: Any) -> Any:
    raise TypeError  # redone by json.JSONEncoder, for its message


def _compact(obj: Any) -> str:
    """json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(obj): its C
    encoder, with a fresh circular-reference memo per call as json's."""
    encode = _json.make_encoder({}, _unencodable, _json.encode_basestring, None, ":", ",", False, False,
                                False)  # fmt: skip
    return "".join(encode(obj, 0))


def dumps(obj: Any, indent: bool = False) -> bytes:
    if not indent:
        try:
            text = _compact(obj)
        except (TypeError, ValueError, RecursionError):
            pass  # json.JSONEncoder's own error, below
        else:
            try:
                return text.encode("utf-8")
            except UnicodeEncodeError:
                pass  # a lone surrogate in a str we were given: below
    import json  # the one place (make lint: import-linter's contract)

    layout: dict[str, Any] = {"indent": 2} if indent else {"separators": (",", ":")}
    try:
        return json.JSONEncoder(ensure_ascii=False, allow_nan=False, **layout).encode(obj).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in a str we were given: escape it, stay valid JSON
        return json.dumps(obj, indent=2 if indent else None, separators=None if indent else (",", ":"),
                          allow_nan=False).encode()
