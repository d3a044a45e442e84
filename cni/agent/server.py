"""The node-local agent: serves CNI calls from the shim (cni.agent.client) over a unix socket, by
calling the same `cni.skel.run` a plugin process calls, with the netlink codec, the plugin modules and
the IPAM modules imported once (`warm`: what the agent's main hands it; this module imports no IPAM).

Each connection gets its own thread, and the request runs on that thread in the caller's context:
its environment (passed, never os.environ), its network namespace (setns on this thread only), its
cwd and umask (after unshare(CLONE_FS), which gives the thread its own), and its stderr (the fd itself,
passed with SCM_RIGHTS; cni.log writes there for this thread's context only). The thread ends with the
request, so no namespace or directory change outlives it.

Security: the socket is 0600 in a 0700 directory and every peer is checked with SO_PEERCRED (root
only): a request names namespaces and files the agent acts on as root."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cni import metrics
from cni.agent import proto

READ_TIMEOUT = 5.0  # to read a request once connected
GO_TIMEOUT = 5.0  # from READY to GO


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
    if reader.fds or not umask.isdigit():
        raise proto.ProtocolError("a request carries a umask, and no descriptor before GO")
    return Job(plugin.decode(), build.decode(), os.fsdecode(bundle), int(umask) & 0o777,
               proto.decode_env(env), stdin)


def read_go(reader: proto.Reader, job: Job) -> None:
    """GO and the caller's descriptors with it (netns, stderr, cwd, the pod's namespace when the caller
    opened it) into `job.fds`."""
    reader.expect(proto.GO)
    if len(reader.fds) not in (3, 4):
        raise proto.ProtocolError("GO carries three descriptors (netns, stderr, cwd) and the pod's "
                                  "namespace when the caller opened it")
    job.fds = list(reader.fds)


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


def execute(job: Job) -> tuple[int, bytes]:
    """Run the request as its plugin process would: skel.run with the request's env and stdin."""
    from cni import delegate, log, netns, skel

    log.use_stderr(job.fds[1])
    delegate.CALLER_BUNDLE.set(job.bundle or None)
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
    def __init__(self, path: str, build: str, max_inflight: int = 128, allowed_uids: tuple[int, ...] = (0,)):
        self.path = path
        self.build = build
        self.max_inflight = max_inflight
        self.allowed_uids = allowed_uids
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.inflight = 0
        self.served = 0
        self.stopped_at = 0.0  # when serve() stopped accepting (monotonic): the stop's budget starts
        self.threads: set[threading.Thread] = set()
        self.listener: socket.socket | None = None
        self.lockfd = -1
        self.ident: tuple[int, int] | None = None

    # ---- socket ---------------------------------------------------------------------------------

    def bind(self) -> None:
        """Directory 0700, one agent per socket (flock), socket 0600 put in place by rename."""
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, mode=0o700, exist_ok=True)
        st = os.stat(parent)
        if st.st_uid != os.geteuid():
            raise OSError(0, f"{parent} belongs to uid {st.st_uid}, not to this agent")
        os.chmod(parent, 0o700)
        self.lockfd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self.lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OSError(0, f"another agent serves {self.path}") from None
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(128)
        os.rename(tmp, self.path)
        st = os.stat(self.path)
        self.ident = (st.st_dev, st.st_ino)
        sock.settimeout(0.2)
        self.listener = sock

    def close(self) -> None:
        """Remove the socket (if it is still ours) so that new calls go in-process at once."""
        if self.listener is not None:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self.ident and stat.S_ISSOCK(st.st_mode):
                    os.unlink(self.path)
            self.listener.close()
            self.listener = None
        if self.lockfd >= 0:
            os.close(self.lockfd)
            self.lockfd = -1

    # ---- serving --------------------------------------------------------------------------------

    def serve(self, grace: float = 30.0) -> None:
        """Accept until stop(); then let the requests in flight finish (up to `grace` seconds)."""
        assert self.listener is not None
        say(f"serving {self.path} (build {self.build}, up to {self.max_inflight} requests at once)")
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError as e:
                say(f"accept: {e}")
                time.sleep(0.05)
                continue
            t = threading.Thread(target=self._connection, args=(conn,), daemon=True)
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

    def _refuse(self, conn: socket.socket, reason: str, why: str) -> None:
        metrics.sink().refused(reason)
        proto.send(conn, proto.REFUSED, why.encode())

    def _connection(self, conn: socket.socket) -> None:
        reader = proto.Reader(conn)
        try:
            self._exchange(conn, reader)
        except (OSError, proto.ProtocolError) as e:
            if not isinstance(e, proto.Closed):
                say(f"connection dropped: {e}")
        finally:
            reader.close_fds()
            conn.close()
            with self.lock:
                self.threads.discard(threading.current_thread())

    def _exchange(self, conn: socket.socket, reader: proto.Reader) -> None:
        uid = proto.peer_uid(conn)
        if uid not in self.allowed_uids:
            say(f"refused a caller with uid {uid}")
            self._refuse(conn, "uid", "only root may use the agent")
            return
        conn.settimeout(READ_TIMEOUT)
        job = read_job(reader)
        refusal = self._admit(job)
        if refusal is not None:
            self._refuse(conn, *refusal)
            return
        try:
            self._run(conn, reader, job)
        finally:
            with self.lock:
                self.inflight -= 1
                metrics.sink().inflight(self.inflight)

    def _run(self, conn: socket.socket, reader: proto.Reader, job: Job) -> None:
        proto.send(conn, proto.READY)
        conn.settimeout(GO_TIMEOUT)
        try:
            read_go(reader, job)
        except TimeoutError:
            self._refuse(conn, "go", "no GO in time")
            return
        try:
            enter_caller(job)
        except OSError as e:  # nothing executed yet: the shim runs it in-process
            self._refuse(conn, "context", f"cannot enter the caller's context: {e.strerror}")
            return
        conn.settimeout(None)
        started = time.monotonic()
        rc, out = execute(job)
        command = job.env.get("CNI_COMMAND", "")
        proto.send(conn, proto.ANSWER, str(rc).encode() + b"\0" + out)
        took = time.monotonic() - started
        with self.lock:
            self.served += 1
        metrics.sink().attach(job.plugin, command, took, error_code(rc, out))
        say(f"served {job.plugin} {command} rc={rc} in {took * 1000:.1f} ms")


def warm(modules: Iterable[str] = (), hooks: Iterable[Callable[[], None]] = ()) -> None:
    """Import what requests need once, here, rather than concurrently in the first requests: the
    protocol core and the netlink modules, and `modules`; then run `hooks`. The server knows only the
    CNI side: the agent's composition root (cni.agent.main) passes the plugins, the IPAM and its stores
    (cni.registry's lists) and the IPAM's own start-up (ipam.store.handles.keep_warm)."""
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
