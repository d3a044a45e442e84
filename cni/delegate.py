"""Run an IPAM: exec the binary named by ipam.type from CNI_PATH with the same config and env, or,
when that binary is this very bundle and the IPAM is one of ours, call it in-process."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from contextvars import ContextVar

from cni import log
from cni.errors import CniError, Code, ConfigError, DecodeError, TryAgainError
from cni.types.netconf import Request
from cni.types.result import Result, narrowed, parse
from cni.types.valueclass import replace

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

ETXTBSY_TRIES = 5
# The frozen bundle this request came through (None: from source). In a plugin process that is
# sys.executable; the agent sets the calling shim's own executable for each request.
CALLER_BUNDLE: ContextVar[str | None] = ContextVar(
    "pycni_caller_bundle", default=sys.executable if getattr(sys, "frozen", False) else None
)


class Bound:
    """What bounds an IPAM exec'd for one caller of the agent (cni.agent.server sets it per request; a
    plugin process has none: the runtime's timeout kills the plugin). `watch` polls POLLERR once the
    caller's end of the call is closed (the agent's write end of the caller's answer pipe: its only
    reader is the shim, so the shim is gone), `limit` is the seconds one exec may take. The child runs
    in a process group of its own; either event kills that group (SIGKILL), reaps the child and fails
    the call with code 11. Once the caller is gone (`gone`), no other IPAM is started for it (the
    rollback's DEL of a failed ADD: the runtime's DEL follows)."""

    __slots__ = ("gone", "limit", "watch")

    def __init__(self, watch: int, limit: float) -> None:
        self.watch, self.limit, self.gone = watch, limit, False


BOUND: ContextVar[Bound | None] = ContextVar("pycni_ipam_bound", default=None)


class Killed(TryAgainError):
    """An IPAM the agent exec'd was killed: its caller went away, or it ran past the agent's limit."""


def find(kind: str, path: tuple[str, ...]) -> str:
    """The executable `kind` in the absolute directories of CNI_PATH."""
    if not kind or "/" in kind or kind in (".", ".."):
        raise ConfigError(f'ipam.type: invalid plugin name "{kind}"')
    for directory in path:
        if not os.path.isabs(directory):
            log.warning("CNI_PATH entry %r ignored: not absolute", directory)
            continue
        candidate = os.path.join(directory, kind)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(f'ipam.type: plugin "{kind}" not found in CNI_PATH {list(path)}')


def _in_process_module(kind: str, binary: str) -> str | None:
    """Our own IPAM runs in-process when CNI_PATH resolves to this frozen bundle, also under the name
    `pycni-install --prefix` gave it (`pycni-whereabouts`)."""
    from cni.registry import IN_PROCESS_IPAM, resolve

    module = IN_PROCESS_IPAM.get(kind) or IN_PROCESS_IPAM.get(resolve(kind) or "")
    bundle = CALLER_BUNDLE.get()
    if module is None or bundle is None:
        return None
    return module if os.path.realpath(binary) == os.path.realpath(bundle) else None


# What the PyInstaller bootloader adds to the environment of a frozen plugin (or of the shim whose
# environment the agent runs a request with): never passed on to an IPAM we exec.
BOOTLOADER_ENV = ("_PYI_ARCHIVE_FILE", "_PYI_PARENT_PROCESS_LEVEL", "_PYI_APPLICATION_HOME_DIR",
                  "_PYI_LINUX_PROCESS_NAME", "_PYI_SPLASH_IPC", "LD_LIBRARY_PATH_ORIG")


def runtime_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the runtime gave the plugin. In onedir mode the bootloader prepends the bundle's
    _internal to LD_LIBRARY_PATH (keeping the runtime's value in LD_LIBRARY_PATH_ORIG): an exec'd IPAM
    linked against the system's libssl or libsqlite3 would otherwise load ours."""
    out = dict(env)
    if not any(k in out for k in BOOTLOADER_ENV[:2]):
        return out
    original = out.get("LD_LIBRARY_PATH_ORIG")
    for key in BOOTLOADER_ENV:
        out.pop(key, None)
    if original is None:
        out.pop("LD_LIBRARY_PATH", None)
    else:
        out["LD_LIBRARY_PATH"] = original
    return out


def _exec(binary: str, req: Request, command: str) -> bytes:
    env = runtime_env(req.env)
    env["CNI_COMMAND"] = command
    bound = BOUND.get()
    for attempt in range(ETXTBSY_TRIES):
        try:
            rc, out, err = run(binary, req.stdin, env, bound)
            break
        except OSError as e:
            if e.errno != errno.ETXTBSY or attempt == ETXTBSY_TRIES - 1:
                raise CniError(f"exec {binary}: {e.strerror}") from None
            time.sleep(0.2 * (attempt + 1))
    if err:
        log.raw(err)
    if rc != 0:
        raise _delegate_error(binary, out, err)
    return out


def run(binary: str, stdin: bytes, env: dict[str, str], bound: Bound | None = None
        ) -> tuple[int, bytes, bytes]:  # fmt: skip
    """subprocess.run([binary], input=stdin, env=env, capture_output=True), without importing
    subprocess (it imports signal, selectors, threading and locale on every call): posix_spawn
    (vfork-fast, thread-safe in the agent, inherits the calling thread's netns and cwd) and a poll loop.
    Returns (exit code, stdout, stderr); OSError when the binary cannot be executed. With `bound` (the
    agent), the child leads a process group of its own and is killed with it, reaped, and Killed raised
    when its caller goes away or bound.limit seconds pass before it exited (Bound)."""
    import select
    import signal

    name = os.path.basename(binary)
    if bound is not None and bound.gone:
        raise Killed(f"{name} not started: {GONE}")
    fds = [*os.pipe(), *os.pipe(), *os.pipe()]  # stdin r/w, stdout r/w, stderr r/w
    if min(fds) < 3:  # our own stdio was closed (a plugin process; never the agent, whose stdio is its
        # log): dup2 onto it could clobber another pipe end
        for fd in fds:
            os.close(fd)
        import subprocess

        proc = subprocess.run([binary], input=stdin, env=env, capture_output=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr
    child, mine = (fds[0], fds[3], fds[5]), [fds[1], fds[2], fds[4]]
    try:
        _no_inherited_descriptors()
        actions = [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(child)]
        # as subprocess's restore_signals: Python ignores SIGPIPE and SIGXFSZ, an exec'd Go plugin must not
        default = (signal.SIGPIPE, signal.SIGXFSZ)
        if bound is None:
            pid = os.posix_spawn(binary, [binary], env, file_actions=actions, setsigdef=default)
        else:  # a process group of its own, killed whole
            pid = os.posix_spawn(binary, [binary], env, file_actions=actions, setsigdef=default, setpgroup=0)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for fd in child:
        os.close(fd)
    waiting = None if bound is None else _Waiting(select, bound, name)
    status: int | None = None
    try:
        out, err = _pump(select, mine, stdin, waiting)
        if waiting is not None:
            status = waiting.exit_of(pid)
    except BaseException:  # as subprocess.run: the child does not outlive a failed call
        _kill(pid, signal.SIGKILL)
        raise
    finally:
        for fd in mine:
            if fd >= 0:
                os.close(fd)
        if status is None:
            status = os.waitpid(pid, 0)[1]
    return os.waitstatus_to_exitcode(status), out, err


GONE = "the caller went away (the runtime gave up on the call)"


class _Waiting:
    """The waits of one bounded exec (Bound): each poll also watches the caller's end, and all of them
    together end bound.limit seconds after the start."""

    def __init__(self, select: Any, bound: Bound, name: str) -> None:
        self.select, self.bound, self.name = select, bound, name
        self.deadline = time.monotonic() + bound.limit

    def poll(self, poller: Any) -> list[tuple[int, int]]:
        """poller.poll(), with the caller's end registered in `poller` (Killed: gone, or too late)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Killed(f"{self.name} killed: no answer within {self.bound.limit:g} s")
        events: list[tuple[int, int]] = poller.poll(int(left * 1000) + 1)
        if any(fd == self.bound.watch for fd, _ in events):
            self.bound.gone = True
            raise Killed(f"{self.name} killed: {GONE}")
        return events

    def watching(self) -> Any:
        poller = self.select.poll()
        poller.register(self.bound.watch, 0)  # only what is always reported: the reader's end is closed
        return poller

    def exit_of(self, pid: int) -> int:
        """The child's wait status once it exited. Its output ended: it is exiting, or it closed stdout
        and stderr and runs on; the latter is waited for through a pidfd, bounded as the rest."""
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        fd = os.pidfd_open(pid)
        try:
            poller = self.watching()
            poller.register(fd, self.select.POLLIN)  # readable once the child exited
            while not self.poll(poller):
                pass
        finally:
            os.close(fd)
        return os.waitpid(pid, 0)[1]


def _kill(pid: int, sig: int) -> None:
    """Signal the child, and the process group it leads if it has one (the agent's children do; one
    could also have made its own): with it whatever the child started there. No other group can have
    the child's pid as its id while the child is not reaped."""
    with contextlib.suppress(OSError):
        os.kill(pid, sig)
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)


def _no_inherited_descriptors() -> None:
    """Only stdin, stdout and stderr reach the IPAM (what subprocess's close_fds does in the child;
    Python 3.12's posix_spawn cannot close descriptors there): mark every other one close-on-exec.
    Safe in the agent's threads too: nothing of ours is meant to be inherited, and posix_spawn's dup2
    onto 0-2 clears the flag on the copy only."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                if os.get_inheritable(fd):
                    os.set_inheritable(fd, False)


def _pump(select: Any, mine: list[int], stdin: bytes, waiting: _Waiting | None = None) -> tuple[bytes, bytes]:
    """Write `stdin` to mine[0] and read mine[1] and mine[2] to EOF, all at once (no pipe can fill up
    and block the child). A closed fd is set to -1 in `mine`. `waiting`: bounded (Bound)."""
    w_in, r_out, r_err = mine
    chunks: dict[int, list[bytes]] = {r_out: [], r_err: []}
    poller = select.poll() if waiting is None else waiting.watching()
    if stdin:
        os.set_blocking(w_in, False)
        poller.register(w_in, select.POLLOUT)
    else:
        os.close(w_in)
        mine[0] = -1
    for fd in (r_out, r_err):
        poller.register(fd, select.POLLIN)
    view, open_readers = memoryview(stdin), 2
    while open_readers:
        for fd, _ in poller.poll() if waiting is None else waiting.poll(poller):
            if fd == w_in:
                try:
                    view = view[os.write(w_in, view):]
                except BrokenPipeError:  # the child does not read its stdin: fine, as for subprocess
                    view = view[:0]
                if not view:
                    poller.unregister(w_in)
                    os.close(w_in)
                    mine[0] = -1
                continue
            data = os.read(fd, 65536)
            if data:
                chunks[fd].append(data)
            else:
                poller.unregister(fd)
                open_readers -= 1
    return b"".join(chunks[r_out]), b"".join(chunks[r_err])


def _delegate_error(binary: str, stdout: bytes, stderr: bytes) -> CniError:
    """The delegate's own error object, code kept, message prefixed with who said it."""
    from cni import jsonio

    name = os.path.basename(binary)
    try:
        obj: Any = jsonio.loads(stdout, "delegate output")
        code, msg = int(obj["code"]), str(obj.get("msg", ""))
        return CniError(f"{name}: {msg}", str(obj.get("details", "")), code=code)
    except (CniError, KeyError, TypeError, ValueError):
        text = (stdout.strip() or stderr).decode(errors="replace").strip()[:500]
        return CniError(f"{name} failed: {text or 'no output'}")


def call(req: Request, command: str) -> Result | None:
    """Run the IPAM for `command`; its result on ADD. An IPAM of ours in this bundle runs in this
    process: its Result is handed over as the request's version carries it, never printed and parsed."""
    ipam = req.ipam()
    assert ipam is not None
    kind = str(ipam["type"])
    binary = find(kind, req.path)
    module = _in_process_module(kind, binary)
    if module is None:
        out = _exec(binary, req, command)
        return _parsed(out, req.version, kind) if command == "ADD" else None
    return log.own_settings(_in_process, module, replace(req, command=command))


def _in_process(module: str, req: Request) -> Result | None:
    """The IPAM `module`'s function for req.command, as skel runs a plugin's (cni.skel.outcome): an ADD
    whose result the request's version cannot carry is undone before failing. Its log settings are its
    own (log.own_settings): those of its config end with it, the plugin's do not apply to it."""
    import importlib

    from cni.skel import outcome

    return outcome(importlib.import_module(module), req, narrowed)


def _parsed(out: bytes, version: str, kind: str) -> Result:
    """An executed IPAM's stdout as a Result; code 1 saying what it printed when that is none."""
    from cni import jsonio

    try:
        raw = jsonio.loads(out, f"ipam {kind} result")
        return parse(raw, version, f"ipam {kind} result")
    except CniError as e:  # what it printed, in short: nothing at all and garbage are different faults
        shown = f": {out[:120]!r}" if out else ""
        details = f"{e.details} ({len(out)} bytes of output{shown})"
        raise DecodeError(f"ipam plugin {kind} returned an invalid result: {e.msg}", details) from None


def add(req: Request) -> Result:
    got = call(req, "ADD")
    assert got is not None
    return got


def delete(req: Request) -> None:
    call(req, "DEL")


def check(req: Request) -> None:
    call(req, "CHECK")


def status(req: Request) -> None:
    call(req, "STATUS")


def gc(req: Request) -> None:
    call(req, "GC")


def require_ips(result: Result, kind: str) -> Result:
    if not result.ips:
        raise CniError(f"ipam plugin {kind} returned no IP addresses", code=Code.INVALID_CONFIG)
    return result
