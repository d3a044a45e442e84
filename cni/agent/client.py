"""The shim: hand one CNI call to the node-local agent, or say it was not taken so the caller runs it
in-process. Imports stdlib `os` and `select` only (and cni.agent.proto): it runs on every plugin call.

`exchange` raises Unreachable ("run it yourself") only when the agent certainly did not execute the
request: no FIFO or nobody reading it, a stopped agent, the agent refused, or no agent claimed the
request before the shim withdrew it (cni.agent.proto). After READY, an end of file without an answer is
Lost, reported as code 11 (try again later) and never re-run here: the agent may have applied part of
the request. The runtime retries ADD after cleaning up with DEL, and DEL is idempotent, so a code-11
answer is always safe to retry.

Settings (environment): PYCNI_AGENT=off disables the agent; PYCNI_AGENT_FIFO names its FIFO (default
/run/pycni/agent.fifo); PYCNI_AGENT_TIMEOUT the seconds to wait for the agent to take the request
(READY) before running it in-process (default 2)."""

from __future__ import annotations

import os
import select

from cni import procs
from cni.agent import proto

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every shim call
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULT_FIFO = "/run/pycni/agent.fifo"
FIFO_ENV, SWITCH_ENV, TIMEOUT_ENV = "PYCNI_AGENT_FIFO", "PYCNI_AGENT", "PYCNI_AGENT_TIMEOUT"
READY_TIMEOUT = 2.0  # from the request line written to READY/REFUSED (the agent answers before executing)


def fifo_path(env: Mapping[str, str]) -> str | None:
    if env.get(SWITCH_ENV, "").lower() in ("off", "0", "false", "no"):
        return None
    return env.get(FIFO_ENV) or DEFAULT_FIFO


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
    """The agent took the request and went away without answering: it may have been executed."""


def _open_fifo(path: str) -> int:
    """The agent's FIFO, opened for writing without waiting: ENXIO when nobody reads it (no agent)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise Unreachable(f"agent FIFO {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o010000:  # stat.S_IFIFO (no stat module on the shim path)
            raise Unreachable(f"agent FIFO {path}: not a FIFO")
        if st.st_uid not in (0, os.geteuid()):  # only root (or, in tests, ourselves) may answer for us
            raise Unreachable(f"agent FIFO {path} belongs to uid {st.st_uid}")
        pid, pidns = _agent(path)
        if pidns and pidns != os.stat("/proc/self/ns/pid").st_ino:  # it could not find us by our pid
            raise Unreachable(f"agent FIFO {path}: the agent (pid {pid}) is in another pid namespace")
        if procs.stopped(pid):  # it would never say READY: do not wait for it
            raise Unreachable(f"agent FIFO {path}: the agent (pid {pid}) is stopped")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _agent(path: str) -> tuple[int, int]:
    """(pid, pid namespace inode) of the agent, from its lock file; 0 for what it does not say."""
    try:
        with open(proto.lock_path(path), "rb") as f:
            words = f.read(64).split()
    except OSError:
        return 0, 0
    pid, pidns = (int(w) if w.isdigit() else 0 for w in (*words, b"", b"")[:2])
    return pid, pidns


def _request(plugin: str, build: str, bundle: str, stdin: bytes) -> int:
    """The request's frames in a memfd (any size, written before anyone reads it)."""
    umask = os.umask(0o022)
    os.umask(umask)
    head = proto.fields(proto.VERSION, build.encode(), plugin.encode(), os.fsencode(bundle),
                        str(umask).encode())
    data = (proto.frame(proto.REQUEST, head) + proto.frame(proto.ENV, proto.encode_env(dict(os.environb)))
            + proto.frame(proto.STDIN, stdin))
    fd = os.memfd_create("pycni-request", os.MFD_CLOEXEC)
    try:
        proto.write_all(fd, data)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _pod_netns() -> int:
    """CNI_NETNS opened here when it can be: the agent runs in a mount namespace of its own, where a pod
    namespace the runtime mounted after the agent started is not visible without mount propagation
    (cni.netns.GIVEN). Not openable here (-1): the agent looks the path up itself and reports what it
    finds (gone, not a namespace), as a plugin process would."""
    pod = os.environ.get("CNI_NETNS")
    if pod:
        try:  # O_NONBLOCK: a FIFO named as CNI_NETNS must not block the call
            return os.open(pod, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            pass
    return -1


def exchange(path: str, plugin: str, build: str, bundle: str, stdin: bytes) -> tuple[int, bytes]:
    """(exit code, stdout) from the agent; Unreachable or Lost otherwise."""
    fifo = _open_fifo(path)
    opened = [fifo]
    try:
        try:
            memfd = _request(plugin, build, bundle, stdin)
            opened.append(memfd)
            r, w = os.pipe()  # close-on-exec
            opened += (r, w)
            podns = _pod_netns()
            if podns >= 0:
                opened.append(podns)
            line = proto.request_line(os.getpid(), w, os.fstat(w).st_ino, memfd, podns)
            os.write(fifo, line)  # whole or not at all (shorter than PIPE_BUF)
        except OSError as e:  # EAGAIN: a full FIFO, the agent is not reading; EPIPE: it went away
            raise Unreachable(f"agent FIFO {path}: {e.strerror or e}") from None
        os.close(fifo)
        opened.remove(fifo)
        reader = proto.Reader(r)
        kind, payload = _first(reader, r, w, opened, ready_timeout(os.environ))
        if kind == proto.REFUSED:
            raise Unreachable(f"agent refused: {payload.decode(errors='replace')}")
        return _answer(reader, w, opened)
    finally:
        for fd in opened:
            os.close(fd)


def readable(fd: int, timeout: float) -> bool:
    """Whether `fd` has something to read (or its end of file) within `timeout` seconds."""
    return bool(select.select([fd], [], [], timeout)[0])


def _withdraw(w: int, opened: list[int]) -> None:
    os.close(w)
    opened.remove(w)


def _first(reader: proto.Reader, r: int, w: int, opened: list[int], timeout: float) -> tuple[bytes, bytes]:
    """The agent's first frame (READY or REFUSED). Not in `timeout` seconds: withdraw the request (close
    `w`); then end of file says no agent claimed it, or ever will (Unreachable), and a frame that one
    did meanwhile."""
    if not readable(r, timeout):
        _withdraw(w, opened)
    try:
        return reader.expect(proto.READY, proto.REFUSED)
    except proto.Closed:
        raise Unreachable("no agent took the request in time") from None
    except (OSError, proto.ProtocolError) as e:  # garbled before READY: never executed, by the protocol
        raise Unreachable(f"agent: {e}") from None


def _answer(reader: proto.Reader, w: int, opened: list[int]) -> tuple[int, bytes]:
    if w in opened:
        _withdraw(w, opened)  # from now on the end of file comes when the agent is done with the pipe
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
