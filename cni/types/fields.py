"""Typed reads from a decoded JSON object; every error names the exact field and the bad value."""

from __future__ import annotations

import ipaddress

from cni.errors import ConfigError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Checked without `re` (importing it and compiling a pattern cost every plugin call: docs/benchmarks.md); the
# patterns are what messages show. MAC: ^[0-9a-fA-F]{2}([:-])[0-9a-fA-F]{2}(\1[0-9a-fA-F]{2}){4}$
NAME_PATTERN = r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$"
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_NAME_CHARS = _ALNUM | frozenset("_.-")
_HEX = frozenset("0123456789abcdefABCDEF")
_TYPES = {str: "a string", int: "an integer", bool: "a boolean", dict: "an object", list: "a list"}


def valid_name(text: str) -> bool:
    """NAME_PATTERN matches the whole of `text` (re.fullmatch)."""
    return bool(text) and text[0] in _ALNUM and _NAME_CHARS.issuperset(text)


def _is_mac(text: str) -> bool:
    """Six pairs of hex digits, all separated by ':' or all by '-' (the MAC pattern, fullmatch)."""
    if len(text) != 17 or text[2] not in (":", "-"):
        return False
    return all(c == text[2] if i % 3 == 2 else c in _HEX for i, c in enumerate(text))


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    text = repr(value) if not isinstance(value, str) else f'"{value}"'
    return text if len(text) <= 80 else text[:77] + "..."


def secret(path: str) -> bool:
    """A credential field (etcd_password, a token...): its value never goes into a message."""
    from cni.log import SECRET_WORDS

    last = path.rsplit(".", 1)[-1].lower()
    return any(w in last for w in SECRET_WORDS)


def typed(value: Any, kind: type, path: str) -> Any:
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        got = f"a {type(value).__name__} (value not shown)" if secret(path) else show(value)
        raise ConfigError(f"{path}: must be {_TYPES[kind]}, got {got}")
    return value


def opt(d: dict[str, Any], key: str, kind: type, path: str, default: Any = None) -> Any:
    """d[key] checked against `kind`; `default` when the key is absent or null."""
    value = d.get(key)
    if value is None:
        return default
    return typed(value, kind, join(path, key))


def req(d: dict[str, Any], key: str, kind: type, path: str) -> Any:
    value = d.get(key)
    if value is None or value == "":
        raise ConfigError(f"{join(path, key)}: required")
    return typed(value, kind, join(path, key))


def int_range(d: dict[str, Any], key: str, path: str, lo: int, hi: int, default: int | None = None) -> Any:
    value = opt(d, key, int, path, default)
    if value is not None and not lo <= value <= hi:
        raise ConfigError(f"{join(path, key)}: {value} out of range [{lo}, {hi}]")
    return value


def choice(d: dict[str, Any], key: str, path: str, choices: tuple[str, ...], default: str) -> str:
    value = opt(d, key, str, path, default) or default
    if value not in choices:
        raise ConfigError(
            f'{join(path, key)}: unknown value "{value}" (expected one of {", ".join(choices)})'
        )
    return str(value)


def mac(value: Any, path: str) -> str:
    """A unicast MAC in lower-case colon form."""
    typed(value, str, path)
    if not _is_mac(value):
        raise ConfigError(f"{path}: not a MAC address: {show(value)}")
    text = str(value).lower().replace("-", ":")
    if int(text[:2], 16) & 1:
        raise ConfigError(f"{path}: {text} is a multicast MAC address")
    if text == "00:00:00:00:00:00":
        raise ConfigError(f"{path}: {text} is all zeros, not a usable MAC address")
    return text


def ip(value: Any, path: str) -> IPAddress:
    typed(value, str, path)
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        raise ConfigError(f"{path}: not an IP address: {show(value)}") from None


def cidr(value: Any, path: str) -> IPInterface:
    """An address with prefix ('198.51.100.7/24'), host bits allowed."""
    typed(value, str, path)
    if "/" not in value:
        raise ConfigError(f"{path}: not a CIDR (address/prefix): {show(value)}")
    try:
        return ipaddress.ip_interface(value)
    except ValueError:
        raise ConfigError(f"{path}: not a CIDR (address/prefix): {show(value)}") from None


def network(value: Any, path: str) -> IPNetwork:
    """A subnet ('198.51.100.0/24'); host bits are cleared."""
    return cidr(value, path).network


def name(value: Any, path: str) -> str:
    typed(value, str, path)
    if not valid_name(value):
        raise ConfigError(f"{path}: invalid characters in {show(value)} (allowed: {NAME_PATTERN})")
    return str(value)
