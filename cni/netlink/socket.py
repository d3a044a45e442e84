"""A synchronous rtnetlink socket: send one request, collect the replies, raise kernel errors with
the kernel's own extended-ack message."""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from cni import netns
from cni.errors import KernelError
from cni.netlink import nla

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_MULTI, NLM_F_ACK = 0x1, 0x2, 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE, NLM_F_APPEND = 0x100, 0x200, 0x400, 0x800
NLM_F_CAPPED, NLM_F_ACK_TLVS = 0x100, 0x200
SOL_NETLINK, NETLINK_EXT_ACK, NETLINK_CAP_ACK = 270, 11, 10
_HDR = struct.Struct("=IHHII")


class NetlinkError(KernelError):
    """The kernel refused a request; `errno` is kept for callers that expect some failures."""

    def __init__(self, op: str, err: int, kernel_msg: str = "") -> None:
        self.errno = err
        text = os.strerror(err) + (f" ({kernel_msg})" if kernel_msg else "")
        super().__init__(f"{op}: {text}")


class Netlink:
    """One NETLINK_ROUTE socket, bound to the namespace it was opened in."""

    def __init__(self) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE
        )
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        for opt in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
            with suppress(OSError):
                self.sock.setsockopt(SOL_NETLINK, opt, 1)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def request(self, msg: nla.Message, msg_type: int, flags: int, op: str) -> list[Any]:
        """Send `msg` and return its replies, each decoded by the request's own decoder."""
        self.seq += 1
        self.sock.send(msg.encode(msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, self.seq))
        return list(self._replies(msg.decode, op))

    def _replies(self, decode: Callable[[bytes], Any], op: str) -> Iterator[Any]:
        while True:
            buf = self.sock.recv(1 << 20)
            offset = 0
            while offset + _HDR.size <= len(buf):
                length, typ, flags, seq, _pid = _HDR.unpack_from(buf, offset)
                if length < _HDR.size:
                    return
                chunk = buf[offset : offset + length]
                offset += (length + 3) & ~3
                if seq != self.seq:
                    continue
                if typ == NLMSG_DONE:
                    return
                if typ == NLMSG_ERROR:
                    code = -struct.unpack_from("=i", chunk, _HDR.size)[0]
                    if code:
                        raise NetlinkError(op, code, _ext_ack_message(chunk, flags))
                    return  # the ACK
                yield decode(chunk)


def _ext_ack_message(chunk: bytes, flags: int) -> str:
    """NLMSGERR_ATTR_MSG from an extended ack, if the kernel sent one."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    orig_len = _HDR.unpack_from(chunk, _HDR.size + 4)[0]
    offset = _HDR.size + 4 + (_HDR.size if flags & NLM_F_CAPPED else (orig_len + 3) & ~3)
    while offset + 4 <= len(chunk):
        nla_len, nla_type = struct.unpack_from("=HH", chunk, offset)
        if nla_len < 4:
            break
        if nla_type == 1:
            return chunk[offset + 4 : offset + nla_len].split(b"\0", 1)[0].decode(errors="replace")
        offset += (nla_len + 3) & ~3
    return ""


@contextmanager
def opened(ns_fd: int | None = None) -> Iterator[Netlink]:
    """A socket in namespace `ns_fd` (None: the current one). The thread returns home at once; the
    socket stays bound to the namespace it was created in."""
    with netns.entered(ns_fd):
        nl = Netlink()
    try:
        yield nl
    finally:
        nl.close()


def ignore(err: NetlinkError, *codes: int) -> bool:
    return err.errno in codes


ENODEV, EEXIST, ENOENT, ESRCH, EADDRNOTAVAIL, EINVAL = (
    errno.ENODEV,
    errno.EEXIST,
    errno.ENOENT,
    errno.ESRCH,
    errno.EADDRNOTAVAIL,
    errno.EINVAL,
)
