"""Netlink attributes (the kernel's nla: type-length-value) and the message they travel in, for the
rtnetlink messages pycni sends and reads: links, addresses, routes and SR-IOV VF lists
(cni.netlink.links, addrs, routes, vfinfo), built and read here.

pyroute2's message classes would add pyroute2.netlink, logging, traceback and fifteen ifinfmsg link-kind
plugin modules to every frozen plugin call (bundler/README.md has the start-up figures) for the
twenty-odd attributes pycni writes and reads. pyroute2 is a test dependency only, the reference of
tests/unit/test_netlink_nla.py and tests/unit/test_vf_encoding.py: every request built with these
modules is compared byte for byte with pyroute2's encoding of the same message, and replies encoded by
pyroute2 are decoded both ways."""

from __future__ import annotations

import ipaddress
import struct

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

NLA_F_NESTED = 0x8000
_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
NLA = struct.Struct("=HH")
NLMSGHDR = struct.Struct("=IHHII")
U8, U16, U32, S32 = struct.Struct("=B"), struct.Struct("=H"), struct.Struct("=I"), struct.Struct("=i")


# ---- building -------------------------------------------------------------------------------------


def attr(kind: int, payload: bytes) -> bytes:
    size = NLA.size + len(payload)
    return NLA.pack(size, kind) + payload + b"\0" * (-size % 4)


def u32(kind: int, value: int) -> bytes:
    return attr(kind, U32.pack(value))


def s32(kind: int, value: int) -> bytes:
    return attr(kind, S32.pack(value))


def asciiz(kind: int, text: str) -> bytes:
    return attr(kind, text.encode() + b"\0")


def mac(kind: int, address: str) -> bytes:
    return attr(kind, bytes.fromhex(address.replace(":", "")))


def ip(kind: int, address: str) -> bytes:
    return attr(kind, ipaddress.ip_address(address).packed)


def nested(kind: int, *attrs: bytes, flags: int = 0) -> bytes:
    return attr(kind | flags, b"".join(attrs))


class Message:
    """One message to send: the family header (ifinfomsg, ifaddrmsg, rtmsg) and its attributes, and how
    to decode each reply (a whole message, nlmsghdr included)."""

    __slots__ = ("attrs", "decode", "header")

    def __init__(self, header: bytes, attrs: bytes, decode: Callable[[bytes], Any]) -> None:
        self.header, self.attrs, self.decode = header, attrs, decode

    def encode(self, msg_type: int, flags: int, seq: int) -> bytes:
        body = self.header + self.attrs
        return NLMSGHDR.pack(NLMSGHDR.size + len(body), msg_type, flags, seq, 0) + body


# ---- reading --------------------------------------------------------------------------------------


def items(data: bytes | None, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(type, payload) of every attribute in `data` from `offset`, in order; a truncated one ends it."""
    if not data:
        return
    end = len(data)
    while offset + NLA.size <= end:
        size, kind = NLA.unpack_from(data, offset)
        if size < NLA.size or offset + size > end:
            return
        yield kind & _TYPE_MASK, bytes(data[offset + NLA.size : offset + size])
        offset += (size + 3) & ~3


def parse(data: bytes | None, offset: int = 0) -> dict[int, bytes]:
    """type -> payload (the last one of a type wins, as in the kernel's nla_parse)."""
    return dict(items(data, offset))


def text(payload: bytes | None) -> str:
    return payload.split(b"\0", 1)[0].decode(errors="replace") if payload is not None else ""


def uint(payload: bytes | None) -> int | None:
    """An unsigned integer attribute of 1, 2 or 4 bytes (None if absent or malformed)."""
    if payload is None:
        return None
    for fmt in (U32, U16, U8):
        if len(payload) == fmt.size:
            return int(fmt.unpack(payload)[0])
    return None


def sint(payload: bytes | None) -> int | None:
    return int(S32.unpack(payload)[0]) if payload is not None and len(payload) == S32.size else None


def hwaddr(payload: bytes | None) -> str:
    return ":".join(f"{b:02x}" for b in payload) if payload else ""


def address(payload: bytes | None) -> str | None:
    if payload is None or len(payload) not in (4, 16):
        return None
    return str(ipaddress.ip_address(payload))
