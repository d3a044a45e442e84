"""The node-local agent: serves CNI calls from the shim (cni.agent.client) through its FIFO
(cni.agent.proto), by calling the same `cni.skel.run` a plugin process calls, with the netlink codec,
the plugin modules and the IPAM modules imported once (`warm`: what the agent's main hands it; this
module imports no IPAM).

Each request gets its own thread, and the request runs on that thread in the caller's context:
its environment (passed, never os.environ), its network namespace (setns on this thread only), its
cwd and umask (after unshare(CLONE_FS), which gives the thread its own), and its stderr (reopened from
/proc/<pid>/fd/2; cni.log writes there for this thread's context only). The thread ends with the
request, so no namespace or directory change outlives it.

Security: the FIFO is 0600 in a 0700 directory and every caller is checked (its uid in
/proc/<pid>/status: root only): a request names namespaces and files the agent acts on as root. The
agent reaches its callers' descriptors through /proc, so it runs in the host's pid namespace (the
DaemonSet's hostPID)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cni import metrics
from cni.agent import proto
from cni.delegate import Bound

POLL = 0.2  # seconds between looks at `stopping` while no request comes
# Seconds an IPAM the agent execs may run (cni.delegate.Bound; --ipam-timeout): the kubelet gives
# RunPodSandbox, whose CNI ADDs these are, twice its --runtime-request-timeout (2 min by default), and
# kills nothing itself; by then the runtime has given up on the call and killed the shim.
IPAM_TIMEOUT = 240.0


@dataclass
class Job:
    plugin: str
    build: str
    bundle: str
    umask: int
    env: dict[str, str]
    stdin: bytes
    fds: list[int] = field(default_factory=list)  # netns, stderr, cwd of the caller[, CNI_NETNS opened]


def say(msg: str) -> None:
    """The agent's own log line (its stderr), independent of any request's log settings."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    with contextlib.suppress(OSError):
        os.write(2, f"{stamp}Z pycni-agent[{os.getpid()}]: {msg}\n".encode(errors="replace"))


def read_job(reader: proto.Reader) -> Job:
    _, head = reader.expect(proto.REQUEST)
    version, build, plugin, bundle, umask = proto.split_fields(head, 5)
    if version != proto.VERSION:
        raise proto.ProtocolError(f"protocol version {version!r} (this agent speaks {proto.VERSION!r})")
    _, env = reader.expect(proto.ENV)
    _, stdin = reader.expect(proto.STDIN)
    if not umask.isdigit():
        raise proto.ProtocolError("a request carries a umask")
    return Job(plugin.decode(), build.decode(), os.fsdecode(bundle), int(umask) & 0o777,
               proto.decode_env(env), stdin)


def request_of(pid: int, memfd: int) -> Job:
    """The request the caller wrote into its memfd (read from offset 0 through /proc)."""
    fd = os.open(f"/proc/{pid}/fd/{memfd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_job(proto.Reader(fd))
    finally:
        os.close(fd)


def caller_fds(pid: int, podns: int) -> list[int]:
    """The caller's network namespace, stderr (appending: a log file it was given is never
    overwritten), cwd, and the pod's namespace it opened (CNI_NETNS), reopened through /proc."""
    base = f"/proc/{pid}"
    paths = [(f"{base}/ns/net", os.O_RDONLY), (f"{base}/fd/2", os.O_WRONLY | os.O_APPEND | os.O_NOCTTY),
             (f"{base}/cwd", os.O_RDONLY | os.O_DIRECTORY)]
    if podns >= 0:
        paths.append((f"{base}/fd/{podns}", os.O_RDONLY | os.O_NONBLOCK))
    fds: list[int] = []
    try:
        for path, flags in paths:
            fds.append(os.open(path, flags | os.O_CLOEXEC))
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _the_pipe(st: os.stat_result, inode: int) -> bool:
    return st.st_ino == inode and stat.S_ISFIFO(st.st_mode)


def same_pipe(pid: int, w: int, inode: int) -> bool:
    """Whether descriptor `w` of process `pid` is (still) the pipe `inode`: the caller that wrote the
    request line is alive, so everything opened through /proc/<pid> before this check was its own."""
    try:
        return _the_pipe(os.stat(f"/proc/{pid}/fd/{w}"), inode)
    except OSError:
        return False


@dataclass
class Claim:
    """A request taken from the FIFO: its caller's answer pipe opened here, and what its line named."""

    pipe: int
    pid: int
    w: int
    inode: int
    memfd: int
    podns: int  # the caller's descriptor of CNI_NETNS, or -1

    def caller_there(self) -> bool:
        return same_pipe(self.pid, self.w, self.inode)


def claim_request(line: bytes) -> Claim | None:
    """Take the request of a line from the FIFO, or None: not a request line, or its shim withdrew it or
    is gone (its pipe is no longer at /proc/<pid>/fd/<w>), so that nobody may ever execute it."""
    try:
        pid, w, inode, memfd, podns = proto.parse_line(line)
    except proto.ProtocolError as e:
        say(str(e))
        return None
    gone = f"request of pid {pid} withdrawn, or its caller gone"
    # looked at before it is opened: opening whatever another process holds there could act on it
    if not same_pipe(pid, w, inode):
        say(gone)
        return None
    try:  # not blocking: a FIFO with no reader would hold this thread
        pipe = os.open(f"/proc/{pid}/fd/{w}", os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        say(f"{gone}: {e.strerror or e}")
        return None
    if not _the_pipe(os.fstat(pipe), inode):  # it changed between the look and the open
        os.close(pipe)
        say(gone)
        return None
    os.set_blocking(pipe, True)
    return Claim(pipe, pid, w, inode, memfd, podns)


def caller_uid(pid: int) -> int:
    """The effective uid of process `pid` (from /proc/<pid>/status: the owner of /proc/<pid> is root for
    a process that is not dumpable, one that changed its uid say)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        for line in f:
            if line.startswith(b"Uid:"):
                return int(line.split()[2])
    raise OSError(0, f"no Uid line in /proc/{pid}/status")


def enter_caller(job: Job) -> None:
    """Take on the caller's namespace, cwd and umask on this thread (OSError: not possible)."""
    from cni import netns

    netns_fd, _, cwd_fd = job.fds[:3]
    if not netns.is_netns_fd(netns_fd):
        raise OSError(0, "the namespace descriptor is no network namespace")
    os.unshare(os.CLONE_FS)
    os.fchdir(cwd_fd)
    os.umask(job.umask)
    os.setns(netns_fd, netns.CLONE_NEWNET)


def error_code(rc: int, out: bytes) -> int:
    """The CNI code of an answer: 0 for success, the error object's code, else 999."""
    if rc == 0:
        return 0
    from cni import jsonio
    from cni.errors import DecodeError

    try:
        code = jsonio.loads(out).get("code")
    except (DecodeError, AttributeError):
        code = None
    return code if isinstance(code, int) else 999


def execute(job: Job, bound: Bound | None = None) -> tuple[int, bytes]:
    """Run the request as its plugin process would: skel.run with the request's env and stdin; an IPAM
    it execs is bounded by `bound` (its caller's end, a time limit)."""
    from cni import delegate, log, netns, skel

    log.use_stderr(job.fds[1])
    delegate.CALLER_BUNDLE.set(job.bundle or None)
    delegate.BOUND.set(bound)
    pod = job.env.get("CNI_NETNS", "")
    if pod and len(job.fds) == 4 and netns.is_netns_fd(job.fds[3]):
        netns.GIVEN.set((pod, job.fds[3]))  # this thread's context only
    out = io.BytesIO()
    try:
        rc = skel.run(job.plugin, job.env, io.BytesIO(job.stdin), out)
    finally:
        log.close_file()
    return rc, out.getvalue()


class Agent:
    def __init__(self, path: str, build: str, max_inflight: int = 128, allowed_uids: tuple[int, ...] = (0,),
                 ipam_timeout: float = IPAM_TIMEOUT):
        self.path = path
        self.build = build
        self.max_inflight = max_inflight
        self.ipam_timeout = ipam_timeout
        self.allowed_uids = allowed_uids
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.inflight = 0
        self.served = 0
        self.stopped_at = 0.0  # when serve() stopped taking requests (monotonic): the stop's budget starts
        self.threads: set[threading.Thread] = set()
        self.fifo = -1
        self.lines = bytearray()  # read from the FIFO, not yet a whole line
        self.lockfd = -1
        self.ident: tuple[int, int] | None = None

    # ---- the FIFO -------------------------------------------------------------------------------

    def bind(self) -> None:
        """Directory 0700, one agent per FIFO (flock on the lock file, which holds its pid and pid
        namespace for the shims' checks), FIFO 0600 put in place by rename."""
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        st = os.stat(parent)
        if st.st_uid != os.geteuid():
            raise OSError(0, f"{parent} belongs to uid {st.st_uid}, not to this agent")
        os.chmod(parent, 0o700)
        self.lockfd = os.open(proto.lock_path(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(0, f"another agent serves {self.path}") from None
        os.ftruncate(self.lockfd, 0)
        pidns = os.stat("/proc/self/ns/pid").st_ino  # a shim in another one is not found by its pid
        os.pwrite(self.lockfd, f"{os.getpid()} {pidns}\n".encode(), 0)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.mkfifo(tmp, 0o600)
        os.chmod(tmp, 0o600)
        # read and write: the FIFO never reads as closed while no shim has it open
        fd = os.open(tmp, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        os.rename(tmp, self.path)
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)
        self.fifo = fd

    def close(self) -> None:
        """Remove the FIFO (if it is still ours) so that new calls go in-process at once, and refuse
        the requests already in it, whose shims then run them in-process without waiting."""
        if self.fifo >= 0:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self.ident and stat.S_ISFIFO(st.st_mode):
                    os.unlink(self.path)
            for line in self._read_lines():
                self._turn_away(line)
            os.close(self.fifo)
            self.fifo = -1
        if self.lockfd >= 0:
            os.close(self.lockfd)
            self.lockfd = -1

    def _read_lines(self) -> list[bytes]:
        """The whole request lines the FIFO holds now (a line is written in one piece)."""
        while True:
            try:
                data = os.read(self.fifo, 1 << 16)
            except BlockingIOError:
                break
            if not data:
                break
            self.lines += data
        *lines, rest = bytes(self.lines).split(b"\n")
        if len(rest) > proto.MAX_LINE:
            say(f"dropped {len(rest)} bytes of no request line from the FIFO")
            rest = b""
        self.lines[:] = rest
        return lines

    # ---- serving --------------------------------------------------------------------------------

    def serve(self, grace: float = 30.0) -> None:
        """Take requests until stop(); then let the requests in flight finish (up to `grace` seconds)."""
        assert self.fifo >= 0
        say(f"serving {self.path} (build {self.build}, up to {self.max_inflight} requests at once)")
        while not self.stopping.is_set():
            if not select.select([self.fifo], [], [], POLL)[0]:
                continue
            for line in self._read_lines():
                t = threading.Thread(target=self._request, args=(line,), daemon=True)
                with self.lock:
                    self.threads.add(t)
                t.start()
        self.stopped_at = time.monotonic()
        self.close()
        deadline = self.stopped_at + grace
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))
        say(f"stopped after {self.served} requests")

    def stop(self) -> None:
        self.stopping.set()

    def _admit(self, job: Job) -> tuple[str, str] | None:
        """None when admitted, else (reason for the metrics, what the shim is told)."""
        with self.lock:
            if self.stopping.is_set():
                return "stopping", "the agent is stopping"
            if job.build != self.build:
                return "build", f"build {job.build} != agent build {self.build}"
            if self.inflight >= self.max_inflight:
                return "busy", f"busy ({self.inflight} requests in flight)"
            self.inflight += 1
            metrics.sink().inflight(self.inflight)
            return None

    def _refuse(self, pipe: int, reason: str, why: str) -> None:
        metrics.sink().refused(reason)
        proto.send(pipe, proto.REFUSED, why.encode())

    def _turn_away(self, line: bytes) -> None:
        claim = claim_request(line)
        if claim is not None:
            with contextlib.suppress(OSError):
                self._refuse(claim.pipe, "stopping", "the agent is stopping")
            os.close(claim.pipe)

    def _request(self, line: bytes) -> None:
        claim = claim_request(line)
        try:
            if claim is not None:
                self._exchange(claim)
        except (OSError, proto.ProtocolError) as e:
            say(f"request dropped: {e}")
        finally:
            if claim is not None:
                os.close(claim.pipe)
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _exchange(self, claim: Claim) -> None:
        uid = caller_uid(claim.pid)
        if uid not in self.allowed_uids:
            say(f"refused a caller with uid {uid}")
            self._refuse(claim.pipe, "uid", "only root may use the agent")
            return
        try:
            job = request_of(claim.pid, claim.memfd)
        except proto.ProtocolError as e:  # another protocol version, say: the shim runs it in-process
            self._refuse(claim.pipe, "protocol", f"malformed request: {e}")
            return
        refusal = self._admit(job)
        if refusal is not None:
            self._refuse(claim.pipe, *refusal)
            return
        try:
            self._run(claim, job)
        finally:
            with self.lock:
                self.inflight -= 1
                metrics.sink().inflight(self.inflight)

    def _run(self, claim: Claim, job: Job) -> None:
        try:
            job.fds = caller_fds(claim.pid, claim.podns)
        except OSError as e:  # nothing executed yet: the shim runs it in-process
            self._refuse(claim.pipe, "context", f"cannot open the caller's context: {e.strerror or e}")
            return
        try:
            if not claim.caller_there():
                say(f"request of pid {claim.pid}: its caller went away")
                return
            proto.send(claim.pipe, proto.READY)
            try:
                enter_caller(job)
            except OSError as e:  # nothing executed yet: the shim runs it in-process
                self._refuse(claim.pipe, "context", f"cannot enter the caller's context: {e.strerror}")
                return
            started = time.monotonic()
            # an IPAM it execs ends with the caller: the shim's end of `pipe` closed (killed by the
            # runtime's timeout, say), or after ipam_timeout; this thread and its slot with it
            bound = Bound(claim.pipe, self.ipam_timeout)
            rc, out = execute(job, bound)
            command = job.env.get("CNI_COMMAND", "")
            if bound.gone:
                say(f"request of pid {claim.pid}: {job.plugin} {command}: the caller went away; the IPAM "
                    f"it exec'd was killed after {time.monotonic() - started:.1f} s")
                return
            proto.send(claim.pipe, proto.ANSWER, str(rc).encode() + b"\0" + out)
            took = time.monotonic() - started
            with self.lock:
                self.served += 1
            metrics.sink().attach(job.plugin, command, took, error_code(rc, out))
            say(f"served {job.plugin} {command} rc={rc} in {took * 1000:.1f} ms")
        finally:
            for fd in job.fds:
                os.close(fd)


def warm(modules: Iterable[str] = (), hooks: Iterable[Callable[[], None]] = ()) -> None:
    """Import what requests need once, here, rather than concurrently in the first requests: the
    protocol core and the netlink modules, and `modules`; then run `hooks`. The server knows only the
    CNI side: the agent's composition root (cni.agent.main) passes the plugins, the IPAM and its stores
    (cni.registry's lists) and the IPAM's own start-up (ipam.store.handles.keep_warm, ipam.batch.install)."""
    import importlib

    from cni import log

    log.debug("warming up")  # also opens every long-lived file logging needs, before any request

    for name in (*modules, "cni.skel", "cni.delegate", "cni.netlink.links", "cni.netlink.addrs",
                 "cni.netlink.routes", "cni.netlink.vfinfo", "cni.types.result", "subprocess"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for hook in hooks:
        hook()

    from cni.netlink import addrs, links, routes
    from cni.netlink.socket import opened

    with contextlib.suppress(OSError), opened(None) as nl:
        links.dump(nl)
        addrs.dump(nl)
        routes.dump(nl)
