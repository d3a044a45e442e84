"""The one place JSON is read and written (orjson)."""

from __future__ import annotations

from typing import Any

import orjson

from cni.errors import DecodeError


def loads(data: bytes | str, what: str = "stdin") -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise DecodeError(f"{what}: malformed JSON", str(e)) from None


def dumps(obj: Any, indent: bool = False) -> bytes:
    opts = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(obj, option=opts)
