"""Network namespaces: open one by path (never create one by accident), enter it on this thread.

setns() changes only the calling OS thread, so every helper here is thread-safe as long as the
caller stays on one thread between enter and leave (the context manager guarantees it)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from cni.errors import NetnsError, NetnsGoneError

CLONE_NEWNET = 0x40000000


NS_GET_NSTYPE = 0xB703

# The node-local agent serves a request in its own mount namespace, where a pod namespace the runtime
# mounted after the agent started is not visible unless the host's mounts propagate into the agent's
# container (they need not: a node's "/" may be private). The shim opens CNI_NETNS in the caller's mount
# namespace and passes the descriptor; on the request's thread, GIVEN = (that path, the descriptor), and
# opening or stat-ing that path means the descriptor (cni.agent.server.execute sets it).
GIVEN: ContextVar[tuple[str, int] | None] = ContextVar("pycni_given_netns", default=None)


def _given(path: str) -> int | None:
    given = GIVEN.get()
    return given[1] if given is not None and path and given[0] == path else None


def stat(path: str) -> os.stat_result:
    """os.stat(path), for the namespace the caller passed when path is its CNI_NETNS (GIVEN)."""
    fd = _given(path)
    return os.fstat(fd) if fd is not None else os.stat(path)


def ns_type(fd: int) -> int | None:
    """The CLONE_NEW* type of the namespace `fd` refers to (the nsfs NS_GET_NSTYPE ioctl); None when
    it is no namespace at all."""
    import fcntl

    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE)
    except OSError:
        return None


def is_netns_fd(fd: int) -> bool:
    return ns_type(fd) == CLONE_NEWNET


def open_netns(path: str) -> int:
    """An O_RDONLY fd on the namespace at `path`. NetnsGoneError when it does not exist (or is an
    unmounted leftover file), NetnsError when it is something else."""
    given = _given(path)
    if given is not None:
        return os.dup(given)  # checked as a network namespace when it was given
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsGoneError(f"CNI_NETNS {path}: no such network namespace") from None
    except OSError as e:
        raise NetnsError(f"CNI_NETNS {path}: cannot open: {e.strerror}") from None
    kind = ns_type(fd)
    if kind == CLONE_NEWNET:
        return fd
    st = os.fstat(fd)
    os.close(fd)
    if kind is not None:  # e.g. /proc/<pid>/ns/mnt: looks like an empty file, but is a live namespace
        raise NetnsError(f"CNI_NETNS {path}: a namespace, but not a network namespace")
    if os.path.isdir(path):
        raise NetnsError(f"CNI_NETNS {path}: is a directory, not a network namespace")
    if st.st_size == 0 and os.path.isfile(path):
        # the mount point left behind after the namespace was unmounted: the namespace is gone
        raise NetnsGoneError(f"CNI_NETNS {path}: namespace no longer mounted")
    raise NetnsError(f"CNI_NETNS {path}: not a network namespace")


def current() -> int:
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


@contextmanager
def entered(fd: int | None) -> Iterator[None]:
    """Run the body inside the namespace `fd` (None: stay where we are), then come back."""
    if fd is None:
        yield
        return
    home = current()
    try:
        os.setns(fd, CLONE_NEWNET)
        try:
            yield
        finally:
            os.setns(home, CLONE_NEWNET)
    finally:
        os.close(home)


@contextmanager
def opened(path: str) -> Iterator[int]:
    fd = open_netns(path)
    try:
        yield fd
    finally:
        os.close(fd)


def same(fd_a: int, fd_b: int) -> bool:
    a, b = os.fstat(fd_a), os.fstat(fd_b)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextmanager
def temporary() -> Iterator[int]:
    """An anonymous namespace that lives while the yielded fd is open (for collision-free moves).
    Unshares on this thread and returns to the original namespace before yielding."""
    home = current()
    try:
        os.unshare(CLONE_NEWNET)
        fd = current()
        os.setns(home, CLONE_NEWNET)
    except OSError as e:
        os.close(home)
        raise NetnsError(
            f"cannot create a temporary network namespace: {e.strerror}"
        ) from None
    os.close(home)
    try:
        yield fd
    finally:
        os.close(fd)
