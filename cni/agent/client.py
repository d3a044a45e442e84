"""The shim: hand one CNI call to the node-local agent, or say it was not taken so the caller runs it
in-process. Imports stdlib only: it runs on every plugin call.

`serve` returns None ("run it yourself") only when the agent certainly did not execute the request:
no socket, connect refused or timed out, the agent refused, or the connection broke before GO was
sent. After GO a broken connection is reported as code 11 (try again later) and never re-run here: the
agent may have applied part of the request. The runtime retries ADD after cleaning up with DEL, and DEL
is idempotent, so a code-11 answer is always safe to retry.

Settings (environment): PYCNI_AGENT=off disables the agent; PYCNI_AGENT_SOCKET names the socket
(default /run/pycni/agent.sock); PYCNI_AGENT_TIMEOUT the seconds to wait for the agent to take the
request (READY) before running it in-process (default 2)."""

from __future__ import annotations

import os
import socket

from cni.agent import proto

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every shim call
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_SOCKET = "/run/pycni/agent.sock"
SOCKET_ENV, SWITCH_ENV, TIMEOUT_ENV = "PYCNI_AGENT_SOCKET", "PYCNI_AGENT", "PYCNI_AGENT_TIMEOUT"
CONNECT_TIMEOUT = 0.25  # a live agent accepts at once; a full backlog means "busy": run in-process
READY_TIMEOUT = 2.0  # from the request sent to READY/REFUSED (the agent answers before executing)


def socket_path(env: Mapping[str, str]) -> str | None:
    if env.get(SWITCH_ENV, "").lower() in ("off", "0", "false", "no"):
        return None
    return env.get(SOCKET_ENV) or DEFAULT_SOCKET


def ready_timeout(env: Mapping[str, str]) -> float:
    """PYCNI_AGENT_TIMEOUT when it is a number of seconds in (0, 300], else READY_TIMEOUT."""
    try:
        seconds = float(env.get(TIMEOUT_ENV, ""))
    except ValueError:
        return READY_TIMEOUT
    return seconds if 0 < seconds <= 300 else READY_TIMEOUT


class Unreachable(Exception):
    """The agent did not take the request (it was not executed there)."""


class Lost(Exception):
    """The connection broke after GO: the request may have been executed."""


def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(path)
        pid, owner = proto.peer(sock)
        if owner not in (0, os.geteuid()):  # only root (or, in tests, ourselves) may answer for us
            raise Unreachable(f"agent socket {path} is served by uid {owner}")
        if proto.stopped(pid):  # it would never say READY: do not wait for it
            raise Unreachable(f"agent socket {path}: the agent (pid {pid}) is stopped")
    except OSError as e:
        sock.close()
        raise Unreachable(f"agent socket {path}: {e.strerror or e}") from None
    except Unreachable:
        sock.close()
        raise
    return sock


def _request_fds() -> tuple[int, ...]:
    """The caller's namespace, stderr and cwd, then CNI_NETNS opened here when it can be: the agent runs
    in a mount namespace of its own, where a pod namespace the runtime mounted after the agent started
    is not visible without mount propagation (cni.netns.GIVEN). Not openable here: the agent looks the
    path up itself and reports what it finds (gone, not a namespace), as a plugin process would."""
    fds = (
        os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC),
        2,
        os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC),
    )
    pod = os.environ.get("CNI_NETNS")
    if pod:
        try:  # O_NONBLOCK: a FIFO named as CNI_NETNS must not block the call
            return (*fds, os.open(pod, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK))
        except OSError:
            pass
    return fds


def exchange(path: str, plugin: str, build: str, bundle: str, stdin: bytes) -> tuple[int, bytes]:
    """(exit code, stdout) from the agent; Unreachable or Lost otherwise."""
    sock = _connect(path)
    try:
        fds = _request_fds()
    except OSError as e:
        sock.close()
        raise Unreachable(f"cannot pass the caller's namespace and cwd: {e.strerror}") from None
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        head = proto.fields(proto.VERSION, build.encode(), plugin.encode(), os.fsencode(bundle),
                            str(umask).encode())
        reader = proto.Reader(sock)
        try:
            sock.settimeout(ready_timeout(os.environ))
            proto.send(sock, proto.REQUEST, head)  # no descriptor before READY (cni.agent.proto)
            proto.send(sock, proto.ENV, proto.encode_env(dict(os.environb)))
            proto.send(sock, proto.STDIN, stdin)
            kind, payload = reader.expect(proto.READY, proto.REFUSED)
            if kind == proto.REFUSED:
                raise Unreachable(f"agent refused: {payload.decode(errors='replace')}")
            proto.send(sock, proto.GO, b"", fds)
        except (OSError, proto.ProtocolError) as e:
            raise Unreachable(_refusal(reader) or f"agent: {e}") from None
        return _answer(sock, reader)
    finally:
        for fd in (fds[0], *fds[2:]):
            os.close(fd)
        sock.close()


def _refusal(reader: proto.Reader) -> str:
    """The agent's refusal, if it sent one before closing (our send then fails with a broken pipe)."""
    try:
        kind, payload = reader.expect(proto.REFUSED)
    except (OSError, proto.ProtocolError):
        return ""
    return f"agent refused: {payload.decode(errors='replace')}" if kind == proto.REFUSED else ""


def _answer(sock: socket.socket, reader: proto.Reader) -> tuple[int, bytes]:
    sock.settimeout(None)  # executing: as long as the plugin takes (the runtime has its own timeout)
    try:
        kind, payload = reader.expect(proto.ANSWER, proto.REFUSED)
    except (OSError, proto.ProtocolError) as e:
        raise Lost(str(e)) from None
    if kind == proto.REFUSED:
        raise Unreachable(f"agent refused: {payload.decode(errors='replace')}")
    code, sep, out = payload.partition(b"\0")
    if not sep or not code.isdigit():
        raise Lost("malformed answer")
    return int(code), out


def lost_error(stdin: bytes, why: str) -> bytes:
    """The error object (code 11) for a request the agent took and did not answer."""
    from cni import jsonio, spec
    from cni.errors import DecodeError

    try:
        version = jsonio.loads(stdin).get("cniVersion") or spec.DEFAULT
    except (DecodeError, AttributeError):
        version = spec.LATEST
    if version not in spec.SUPPORTED:
        version = spec.LATEST
    msg = "the pycni agent stopped while executing the request; it may be partly applied: try again"
    return jsonio.dumps({"cniVersion": version, "code": 11, "msg": msg, "details": why}) + b"\n"
