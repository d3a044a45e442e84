"""Crash-safe file operations for the installer: temp name in the same directory, fsync, rename, fsync
the directory. Nothing here ever writes into a file that may be executing."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


TMP_MARK = ".pycni-tmp-"


def tmp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}{TMP_MARK}{secrets.token_hex(4)}")


def remove_stale_tmp(directory: Path) -> None:
    """Temp files a crashed writer left in a directory it writes to."""
    for p in directory.glob(f".*{TMP_MARK}*"):
        if not p.is_dir() or p.is_symlink():
            p.unlink(missing_ok=True)


def write_atomic(target: Path, data: bytes, mode: int = 0o600) -> bool:
    """Replace target with data (temp file created with `mode`, fsync, rename). False if already equal."""
    try:  # a symlink at target is replaced, never followed
        same = not target.is_symlink() and target.read_bytes() == data
        if same and (target.stat().st_mode & 0o7777) == mode:
            return False
    except OSError:
        pass
    tmp = tmp_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fchmod(fh.fileno(), mode)  # the umask must not widen or narrow it
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return True


def copy_file(src: Path, dst: Path, mode: int) -> None:
    """Copy into a NEW file (O_EXCL) and fsync it."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out, 1 << 20)
        out.flush()
        os.fchmod(out.fileno(), mode)
        os.fsync(out.fileno())


def symlink_atomic(target: str, link: Path) -> None:
    """Point `link` at `target` by renaming a new symlink over it: there is never a moment without it."""
    tmp = tmp_name(link)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(link.parent)


def remove_tree(path: Path) -> None:
    """Remove a directory tree (rename it aside first, so a half-removed tree is never under its name)."""
    if not path.exists():
        return
    aside = tmp_name(path)
    os.replace(path, aside)
    shutil.rmtree(aside)
    fsync_dir(path.parent)
