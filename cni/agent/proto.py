"""The agent's protocol: a request line on the agent's FIFO, the request in a memfd, the answers on a
pipe, all reached through /proc. Stdlib `os` and `struct` only: the shim imports this module on every
plugin call, and `socket` alone (with the `enum` and `selectors` it imports) cost more than the rest of
a served call's own start-up (docs/benchmarks.md, "The attach cycle").

A frame is a 4-byte big-endian length, one kind byte, then the payload.

    shim                                                  agent
    memfd: REQUEST fields (version, build, plugin,
           bundle, umask), ENV "K=V" items, STDIN
    pipe (r, w)
    FIFO: "pycni3 PID W INODE-OF-W MEMFD PODNS\\n"  ──>   opens /proc/PID/fd/W for writing (the claim)
                                                          and checks it is the pipe INODE-OF-W; reads
                                                          the request from /proc/PID/fd/MEMFD; opens
                                                          /proc/PID/ns/net, /proc/PID/fd/2, /proc/PID/cwd
                                                          (and /proc/PID/fd/PODNS); checks that W is
                                                          still that pipe (the caller was there all along)
                                         r  <──  READY, or REFUSED(reason): not executed, ever
    closes w
                                         r  <──  ANSWER: exit code, NUL, stdout
                                                 (or REFUSED: not executed)

PODNS is CNI_NETNS opened by the shim (-1 when it could not be: the agent then looks the path up and
reports what it finds, as a plugin process would). The request line is shorter than PIPE_BUF, so
concurrent shims' lines never interleave; the FIFO holds no descriptor, so an agent that never reads
it (stopped, hung) holds nothing of its callers.

Who may run a request in-process (never twice): the shim waits for the agent's first frame at most
PYCNI_AGENT_TIMEOUT seconds; then it closes `w` and reads on. End of file then means no agent ever
opened the pipe, and none can any more (W is gone from /proc/PID/fd): the shim runs the call itself.
A frame means an agent claimed it meanwhile, and the exchange goes on. After READY the shim closes `w`,
so the end of file comes when the agent is done with the pipe: without an ANSWER, the agent may have
applied part of the request and the shim answers code 11 instead of running it (cni.agent.client)."""

from __future__ import annotations

import os
import struct

VERSION = b"3"
LINE = b"pycni3"  # the first word of a request line
REQUEST, ENV, STDIN, READY, REFUSED, ANSWER = b"Q", b"E", b"I", b"R", b"N", b"A"
KINDS = frozenset((REQUEST, ENV, STDIN, READY, REFUSED, ANSWER))
MAX_FRAME = 16 << 20  # a network configuration is kilobytes; anything near this is not ours
MAX_LINE = 128  # a request line: six short fields (far below PIPE_BUF, 4096 on Linux)
_HEAD = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol, or went away mid-frame."""


class Closed(ProtocolError):
    """The peer closed its end at a frame boundary."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown frame kind {kind!r}")
    if len(payload) + 1 > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEAD.pack(len(payload) + 1) + kind + payload


def send(fd: int, kind: bytes, payload: bytes = b"") -> None:
    """One frame, whole, on a pipe or file (a pipe's reader may take it in pieces)."""
    write_all(fd, frame(kind, payload))


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fields(*items: bytes) -> bytes:
    for item in items:
        if b"\0" in item:
            raise ValueError("a field may not contain NUL")
    return b"\0".join(items)


def split_fields(payload: bytes, count: int) -> list[bytes]:
    items = payload.split(b"\0")
    if len(items) != count:
        raise ProtocolError(f"expected {count} fields, got {len(items)}")
    return items


def encode_env(env: dict[bytes, bytes]) -> bytes:
    return b"\0".join(k + b"=" + v for k, v in env.items() if b"\0" not in k + v and b"=" not in k)


def decode_env(payload: bytes) -> dict[str, str]:
    """The environment as os.environ would show it (undecodable bytes as surrogates)."""
    env: dict[str, str] = {}
    for item in payload.split(b"\0") if payload else ():
        key, sep, value = item.partition(b"=")
        if not sep or not key:
            raise ProtocolError("malformed environment item")
        env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def lock_path(fifo: str) -> str:
    """The agent's lock file next to its FIFO: held (flock) by the agent serving it, holding its pid and
    the inode of its pid namespace ("PID PIDNS\\n")."""
    return fifo + ".lock"


def request_line(pid: int, w: int, inode: int, memfd: int, podns: int) -> bytes:
    return b"%s %d %d %d %d %d\n" % (LINE, pid, w, inode, memfd, podns)


def parse_line(line: bytes) -> tuple[int, int, int, int, int]:
    """(pid, w, inode of w, memfd, pod netns fd or -1) of a request line (without its newline)."""
    words = line.split(b" ")
    if len(words) != 6 or words[0] != LINE:
        raise ProtocolError(f"not a request line: {line[:MAX_LINE]!r}")
    try:
        pid, w, inode, memfd, podns = (int(x) for x in words[1:])
    except ValueError:
        raise ProtocolError(f"not a request line: {line[:MAX_LINE]!r}") from None
    if pid <= 0 or w < 0 or memfd < 0 or inode <= 0 or podns < -1:
        raise ProtocolError(f"not a request line: {line[:MAX_LINE]!r}")
    return pid, w, inode, memfd, podns


class Reader:
    """Frames from one file descriptor (a pipe, a memfd), read with os.read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _fill(self) -> bool:
        data = os.read(self.fd, 1 << 16)
        self.buf += data
        return bool(data)

    def read(self) -> tuple[bytes, bytes]:
        """The next (kind, payload). Closed at a clean end of file, ProtocolError otherwise."""
        while len(self.buf) < _HEAD.size or len(self.buf) < _HEAD.size + self._length():
            if not self._fill():
                if self.buf:
                    raise ProtocolError("closed mid-frame")
                raise Closed("closed")
        size = self._length()
        kind, payload = bytes(self.buf[4:5]), bytes(self.buf[5 : _HEAD.size + size])
        del self.buf[: _HEAD.size + size]
        if kind not in KINDS:
            raise ProtocolError(f"unknown frame kind {kind!r}")
        return kind, payload

    def _length(self) -> int:
        size = int(_HEAD.unpack_from(self.buf)[0])
        if size < 1 or size > MAX_FRAME:
            raise ProtocolError(f"bad frame length {size}")
        return size

    def expect(self, *kinds: bytes) -> tuple[bytes, bytes]:
        kind, payload = self.read()
        if kind not in kinds:
            raise ProtocolError(f"expected {b'/'.join(kinds)!r}, got {kind!r}")
        return kind, payload
