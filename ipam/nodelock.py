"""One writer per pool per node: a flock on a node-local file around each read-modify-write of a pool in a
cluster store (Kubernetes, etcd).

Concurrent plugin processes on one node then queue briefly instead of racing through the
API server with compare-and-swap (where every lost race costs the server a full read and a full write
of the pool). Correctness never depends on it: the compare-and-swap still decides, and a node whose lock
directory cannot be used (read-only, missing permissions) simply runs without it. The lock is held only
for one attempt (read, reservations, write), never during a backoff, and is released by the kernel when
a process dies holding it.

Waiting is bounded the way conflicts are (ipam.retry): waiting behind writers that make progress is fine
for up to LIMIT, but a holder that makes no progress for PATIENCE (hung: 60 s, longer than one
attempt of a live holder on an overloaded API server) ends the wait with code 11.
Progress is a counter in the lock file that every holder increments. A plugin process (main thread)
blocks in flock and is woken by the kernel the moment the lock is free, with a timer to look at the
counter; other threads (the agent's, where only one thread per pool and process ever waits) poll.

A holder that is stopped (SIGSTOP, a debugger: state T or t in /proc/<pid>/stat, the pid the kernel
lists for the lock in /proc/locks) is not waited for at all: the waiter runs without the lock
(`held` yields None, as when the lock directory cannot be used), logged with the holder's pid. A frozen
agent would otherwise hold a pool's lock for good, and every in-process call of the node on that pool
would end with code 11 after PATIENCE, retried by the runtime into the same wait (issue 28). The
compare-and-swap still decides between the two writers, as between nodes: a commit the resumed holder
decided on a view that writer changed fails its guards (Conflict) and is retried on the pool as stored.

The holder's claims: a holder notes each reservation it is about to claim after the counter (`Held.note`)
and the lock's release takes the notes off again, so notes found when the lock is taken (`Held.left`)
are those of a holder that died holding it (SIGKILL between its reservation and its pool write): the
new holder frees what they name (ipam.reservations) and the release writes back only what is still left.

Files: `<dir>/<sha256(store, node, pool)[:32]>.lock`, 0600, 8 bytes (the counter) and the notes of a
holder that died (normally none), created once per pool and left in place (a file that is unlinked while
others wait on it would split the queue); deleting them while nothing runs is harmless (a dead holder's
reservation is then left to DEL, GC and the reconciler: docs/ipam.md). `dir` is `pool-locks/` beside the
local database (`local_db`, default /var/lib/cni/pycni), a node-local directory the agent mounts too.
The node name is part of the key so that simulated nodes sharing one machine (benchmarks, tests) do not
queue behind each other."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from cni import log
from cni.errors import TryAgainError
from ipam.digest import sha256_hex

# seconds without any holder making progress before a waiter gives up: longer than one attempt of a
# live holder can take on an overloaded API server (a few requests, each up to its 10 s read timeout)
PATIENCE = 60.0
LIMIT = 120.0  # absolute bound on one wait (upstream whereabouts' ADD limit)
POLL = (0.001, 0.02)  # first and longest sleep between tries when polling, seconds
LOOK = 1.0  # seconds between looks at the counter and the holder's state while waiting
NOTES_MAX = 1 << 16  # bytes of notes read when the lock is taken (a batch of the agent notes at most 128)


class _NoProgress(Exception):
    pass


class _Stopped(Exception):
    """The holder is a stopped process (its pid: args[0])."""


def holder(fd: int) -> int:
    """The pid /proc/locks lists as holding the flock on `fd`'s file, in this pid namespace (0: not
    listed, or a process this namespace does not see)."""
    st = os.fstat(fd)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks", "rb") as f:
            lines = f.read().decode("ascii", "replace").splitlines()
    except OSError:
        return 0
    for line in lines:
        # "N: FLOCK  ADVISORY  WRITE <pid> <maj>:<min>:<inode> 0 EOF"; a waiter's line has "->" after N:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == key and fields[4].isdigit():
            return int(fields[4])
    return 0


def _check_holder(fd: int) -> None:
    """Raise _Stopped when the lock's holder is a stopped process."""
    from cni.procs import stopped  # on contention only

    pid = holder(fd)
    if stopped(pid):
        raise _Stopped(pid)


def path_for(directory: str, identity: str, node: str, pool: str) -> str:
    digest = sha256_hex("\0".join((identity, node, pool)).encode())[:32]
    return os.path.join(directory, f"{digest}.lock")


def _counter(data: bytes) -> int:
    """The lock file's counter: its first 8 bytes (`data` read from offset 0)."""
    return int.from_bytes(data[:8].ljust(8, b"\0"), "little")


class Held:
    """The lock while it is held: its file descriptor and the counter's value this holder wrote (the
    agent knows from it whether another holder wrote the pool since its own last write:
    ipam.agentreads.Memory); `left`: the notes of a holder that died holding it (the module docstring),
    those the new holder has not dealt with yet."""

    def __init__(self, fd: int, path: str = "", count: int = 0, left: list[bytes] | None = None) -> None:
        self.fd, self.path, self.count = fd, path, count
        self.left: list[bytes] = left or []
        self._found = bool(self.left)  # notes were found when the lock was taken
        self._end = 0  # where this holder's next note goes (0: none noted yet)

    def note(self, line: bytes) -> None:
        """Note `line` (one line, no newline) until the lock is released (it is also taken off when this
        process dies holding it: it stays in the file for the next holder)."""
        if not self._end:
            self._end = 8 + sum(len(x) + 1 for x in self.left)
        data = line + b"\n"
        os.pwrite(self.fd, data, self._end)
        self._end += len(data)

    def leave(self, line: bytes) -> None:
        """Leave `line` for the next holder, as if a holder had died with it noted (its release keeps it)."""
        self.left.append(line)
        self._found = True

    def release(self) -> None:
        """The file as the lock's release leaves it: the counter and what is still `left`."""
        if not self._end and not self._found:
            return
        rest = b"".join(x + b"\n" for x in self.left)
        if rest:
            os.pwrite(self.fd, rest, 8)
        os.ftruncate(self.fd, 8 + len(rest))


def _notes(data: bytes) -> list[bytes]:
    return [line for line in data.split(b"\n") if line]


@contextlib.contextmanager
def held(path: str, patience: float = PATIENCE, limit: float = LIMIT) -> Iterator[Held | None]:
    """Hold the lock at `path` for the body; without it (None, logged) when the file cannot be opened."""
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:
        log.debug("node lock %s unavailable (%s): running without it", path, e.strerror)
        yield None
        return
    frozen = 0
    try:
        try:
            _block(fd, patience, limit)  # or _poll, off the main thread
        except _NoProgress:
            pid = holder(fd)
            by = f"by pid {pid} " if pid else ""
            raise TryAgainError(
                f"node lock {path}: held {by}without progress for {patience:g}s"
            ) from None
        except _Stopped as e:
            frozen = int(e.args[0])
        if frozen:
            os.close(fd)
            fd = -1
            log.warning("node lock %s: held by pid %d, which is stopped: running without it", path, frozen)
            yield None
            return
        data = os.pread(fd, 8 + NOTES_MAX, 0)  # the counter and a dead holder's notes: one read
        count = (_counter(data) + 1) % 2**63
        os.pwrite(fd, count.to_bytes(8, "little"), 0)
        lock = Held(fd, path, count, _notes(data[8:]))
        try:
            yield lock
        finally:
            try:
                lock.release()
            except OSError as e:  # (a file open for writing: not seen) the next holder finds the notes
                log.warning("node lock %s: notes not taken off (%s)", path, e.strerror)
    finally:
        if fd >= 0:
            os.close(fd)  # releases the lock


def _progress(fd: int, seen: list[int], since: list[float], start: float, patience: float,
              limit: float) -> None:
    """Raise _NoProgress unless the counter moved within `patience` (and `limit` is not past)."""
    now = time.monotonic()
    value = _counter(os.pread(fd, 8, 0))
    if value != seen[0]:
        seen[0], since[0] = value, now
    if now - since[0] >= patience or now - start >= limit:
        raise _NoProgress()


def _poll(fd: int, patience: float, limit: float) -> None:
    start = looked = time.monotonic()
    seen, since = [_counter(os.pread(fd, 8, 0))], [start]
    pause = POLL[0]
    first = True
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            _progress(fd, seen, since, start, patience, limit)
            if first or time.monotonic() - looked >= LOOK:
                first, looked = False, time.monotonic()
                _check_holder(fd)
            time.sleep(pause)
            pause = min(pause * 2, POLL[1])


def _block(fd: int, patience: float, limit: float) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    _check_holder(fd)
    import signal

    start = time.monotonic()
    seen, since = [_counter(os.pread(fd, 8, 0))], [start]

    def look(signum: int, frame: object) -> None:  # a wake-up in flock: raise to stop waiting
        _progress(fd, seen, since, start, patience, limit)
        _check_holder(fd)

    check = min(LOOK, patience / 4)
    try:
        previous = signal.signal(signal.SIGALRM, look)
    except ValueError:  # not the main thread (the agent's request threads): only it handles signals
        _poll(fd, patience, limit)
        return
    signal.setitimer(signal.ITIMER_REAL, check, check)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # restarted after each look() that returns (PEP 475)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
