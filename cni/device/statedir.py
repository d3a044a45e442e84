"""A state directory for device plugins: small files written atomically (temp file in the same
directory, fsync, rename, fsync of the directory), mode 0600 in 0700 directories, and opened
relative to directory fds with O_NOFOLLOW, so a symlink planted in the tree is refused, never
followed. Per-device locks are flock()s on files under locks/."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from collections.abc import Iterator

from cni.errors import CniError, Code, TryAgainError

DEFAULT_DIR = "/var/lib/cni/pycni/devices"
LOCK_TIMEOUT = 60.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StateError(CniError):
    """The state directory cannot be used."""

    code = Code.IO_FAILURE


class StateDir:
    def __init__(self, top: str) -> None:
        self.top = top

    def _fail(self, what: str, e: OSError) -> StateError:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            return StateError(f"state dir {self.top}: {what} is a symlink or not a directory; refusing")
        return StateError(f"state dir {self.top}: {what}: {e.strerror}")

    @contextlib.contextmanager
    def subdir(self, sub: str) -> Iterator[int]:
        """An fd on <top>/<sub>, both created 0700 when missing; neither may be a symlink."""
        try:
            os.makedirs(os.path.dirname(self.top.rstrip("/")) or "/", exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.top, 0o700)
            top = os.open(self.top, _DIR_FLAGS)
        except OSError as e:
            raise self._fail(self.top, e) from None
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(sub, 0o700, dir_fd=top)
            fd = os.open(sub, _DIR_FLAGS, dir_fd=top)
        except OSError as e:
            raise self._fail(sub, e) from None
        finally:
            os.close(top)
        try:
            yield fd
        finally:
            os.close(fd)

    def write(self, sub: str, name: str, data: bytes) -> None:
        with self.subdir(sub) as d:
            tmp = f".{name}.{secrets.token_hex(4)}.tmp"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=d)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.rename(tmp, name, src_dir_fd=d, dst_dir_fd=d)
                os.fsync(d)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=d)
                raise self._fail(f"{sub}/{name}", e) from None

    def read(self, sub: str, name: str) -> bytes | None:
        with self.subdir(sub) as d:
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
            except FileNotFoundError:
                return None
            except OSError as e:
                raise self._fail(f"{sub}/{name}", e) from None
            with os.fdopen(fd, "rb") as fh:
                return fh.read()

    def remove(self, sub: str, name: str) -> bool:
        with self.subdir(sub) as d:
            try:
                os.unlink(name, dir_fd=d)
            except FileNotFoundError:
                return False
            os.fsync(d)
            return True

    def rename(self, sub: str, name: str, new: str) -> None:
        with self.subdir(sub) as d:
            os.rename(name, new, src_dir_fd=d, dst_dir_fd=d)

    def names(self, sub: str) -> list[str]:
        with self.subdir(sub) as d:
            return sorted(n for n in os.listdir(d) if not n.startswith("."))

    @contextlib.contextmanager
    def lock(self, name: str, what: str, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
        """Hold an exclusive flock on locks/<name>; TryAgainError (code 11) after `timeout`.

        The file is removed when the lock is released, so no lock file outlives the operation. A
        waiter that then gets the lock on the removed file sees that the name no longer leads to its
        file and starts again on the current one, so two holders can never coexist."""
        deadline = time.monotonic() + timeout
        with self.subdir("locks") as d:
            while True:
                try:
                    fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d)
                except OSError as e:
                    raise self._fail(f"locks/{name}", e) from None
                try:
                    _acquire(fd, what, max(deadline - time.monotonic(), 0.0))
                    if _same_file(fd, name, d):
                        break
                except BaseException:
                    os.close(fd)
                    raise
                os.close(fd)  # removed (or replaced) while we waited: take the current one
            try:
                yield
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=d)
                os.close(fd)  # closing drops the lock


def _same_file(fd: int, name: str, dir_fd: int) -> bool:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _acquire(fd: int, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise TryAgainError(f"{what} is locked by another operation for {timeout:.0f}s") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
