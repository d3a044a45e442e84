"""The agent's protocol: length-prefixed frames on a unix stream socket, stdlib only (the shim
imports this module on every plugin call).

A frame is a 4-byte big-endian length, one kind byte, then the payload. One exchange per connection:

    shim                                             agent
    REQUEST  fields: version, build, plugin, bundle, umask ──>
    ENV      "K=V" items (os.environb), NUL-joined ──>
    STDIN    the network configuration        ──>
                                               <──  READY, or REFUSED(reason): not executed, ever
    GO       + SCM_RIGHTS [netns, stderr, cwd(, pod netns)] ──>
                                               <──  ANSWER: exit code, NUL, stdout
                                                    (or REFUSED: GO came too late, not executed)

The agent executes only after it has read GO, and says REFUSED only for a request it will never
execute. So the shim may run a request in-process exactly when it has not sent GO or got REFUSED;
once GO is sent, a lost connection means "maybe executed" and the shim reports code 11 instead of
running it a second time (cni.agent.client).

The caller's descriptors travel with GO, never before READY: a descriptor in flight is held by the
receiving socket until the agent reads it, and a connection waiting in the backlog of an agent that
does not accept (stopped: SIGSTOP, a frozen container) is never read. A shim that gave up on such an
agent and ran the call in-process would otherwise leave its stderr open there, and the runtime, which
reads the plugin's output until end of file, would wait for the agent, not for the plugin (issue 28);
the namespace descriptors would keep a pod's namespace, and the devices in it, alive."""

from __future__ import annotations

# struct, not array, for descriptor lists: array registers with collections.abc, which imports
# collections (on the shim path of every call).
import os
import socket
import struct

VERSION = b"2"
REQUEST, ENV, STDIN, READY, REFUSED, GO, ANSWER = b"Q", b"E", b"I", b"R", b"N", b"G", b"A"
KINDS = frozenset((REQUEST, ENV, STDIN, READY, REFUSED, GO, ANSWER))
MAX_FRAME = 16 << 20  # a network configuration is kilobytes; anything near this is not ours
MAX_FDS = 4  # netns, stderr, cwd of the caller, and the pod's namespace (CNI_NETNS) when it opened it
_HEAD = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol, or went away mid-frame."""


class Closed(ProtocolError):
    """The peer closed the connection at a frame boundary."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown frame kind {kind!r}")
    if len(payload) + 1 > MAX_FRAME:
        raise ValueError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEAD.pack(len(payload) + 1) + kind + payload


def send(sock: socket.socket, kind: bytes, payload: bytes = b"", fds: tuple[int, ...] = ()) -> None:
    data = frame(kind, payload)
    if fds:
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        sent = sock.sendmsg([data], rights)
        data = data[sent:]
    if data:
        sock.sendall(data)


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


class Reader:
    """Frames from one socket; file descriptors passed with SCM_RIGHTS are collected in `fds` (the
    owner closes them)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.fds: list[int] = []

    def _fill(self) -> bool:
        space = socket.CMSG_SPACE(MAX_FDS * 4)
        # close-on-exec: a request's descriptors must never reach a process the request execs
        data, ancdata, flags, _ = self.sock.recvmsg(1 << 16, space, socket.MSG_CMSG_CLOEXEC)
        for level, typ, cdata in ancdata:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                count = len(cdata) // 4
                self.fds.extend(struct.unpack(f"{count}i", cdata[: count * 4]))
        if flags & socket.MSG_CTRUNC:
            raise ProtocolError("too many file descriptors")
        self.buf += data
        return bool(data)

    def read(self) -> tuple[bytes, bytes]:
        """The next (kind, payload). Closed at a clean end of stream, ProtocolError otherwise."""
        while len(self.buf) < _HEAD.size or len(self.buf) < _HEAD.size + self._length():
            if not self._fill():
                if self.buf:
                    raise ProtocolError("connection closed mid-frame")
                raise Closed("connection closed")
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

    def close_fds(self) -> None:
        for fd in self.fds:
            try:  # noqa: SIM105 (no contextlib on the shim path)
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED: pid, uid, gid as the kernel saw them at
    connect/listen time)."""
    return peer(sock)[1]


def peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end (SO_PEERCRED; pid 0: not in this pid namespace)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return int(pid), int(uid)


def stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (SIGSTOP, a tracer: state T or t in /proc/<pid>/stat): it makes
    no progress until it is resumed. False when it cannot be told (gone, not visible)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    end = stat.rfind(b")")  # the state is the field after "(comm)", which may hold anything
    return stat[end + 2 : end + 3] in (b"T", b"t")
