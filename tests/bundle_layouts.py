"""cni-bin layouts for installer tests: a fake one (Debian's Go `loopback` plugin stands in for the
bundle executable: a real ELF that answers VERSION), variants of a layout with another version, the frozen
one (PYCNI_PLUGIN_DIR), and directory snapshots to compare before/after."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from bundler import build
from bundler.cli import Options, options, parse

FAKE_EXE = Path("/usr/lib/cni/loopback")


def fake_bundle(root: Path) -> None:
    """A stand-in for what PyInstaller leaves in a dist directory (bundler.build.layout's input)."""
    (root / build.BUNDLE / "_internal").mkdir(parents=True)
    (root / build.BUNDLE / build.BUNDLE).write_bytes(b"\x7fELF fake")
    (root / build.BUNDLE / build.BUNDLE).chmod(0o755)
    (root / build.BUNDLE / "_internal" / "a.pyc").write_bytes(b"a")


def fake_layout(root: Path, version: str = "0.0.1") -> Path:
    """A cni-bin layout whose bundle executable is a copy of a small real ELF."""
    internal = root / build.BUNDLE / "_internal"
    internal.mkdir(parents=True)
    shutil.copy2(FAKE_EXE, root / build.BUNDLE / build.BUNDLE)
    (internal / "lib.dat").write_bytes(os.urandom(64 << 10))
    (internal / "pkg").mkdir()
    (internal / "pkg" / "mod.pyc").write_bytes(b"\x00" * 1000)
    build.layout(root, version)
    return root


def variant(src: Path, dst: Path, version: str) -> Path:
    """The same layout as another build (a different version gives a different build id)."""
    shutil.copytree(src, dst, symlinks=True)
    build.layout(dst, version)
    return dst


def opts(bin_dir: Path, conf_dir: Path, source: Path, *extra: str) -> Options:
    argv = ["--cni-bin-dir", str(bin_dir), "--cni-conf-dir", str(conf_dir), "--source", str(source),
            "--node-name", "node-a", "--grace", "0", "--ipam-datastore", "local", *extra]
    return options(parse(argv))


def snapshot(root: Path) -> dict[str, tuple[str, ...]]:
    """Every entry under root: type, mode and content digest or link target (inode-independent)."""
    out: dict[str, tuple[str, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", oct(st.st_mode & 0o7777))
            else:
                out[rel] = ("file", oct(st.st_mode & 0o7777), hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def version_call(entry: Path) -> subprocess.CompletedProcess[bytes]:
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run([str(entry)], env=env, capture_output=True, check=False, timeout=60)
