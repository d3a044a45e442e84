"""The bundle manifest: version, build id and sha256/size/mode of every file of a cni-bin layout.
Written by bundler.build, read and re-verified by bundler.install."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio

FILENAME = "pycni.manifest.json"
CHUNK = 1 << 20


@dataclass(frozen=True)
class FileInfo:
    sha256: str
    size: int
    mode: int

    def to_dict(self) -> dict[str, Any]:
        return {"sha256": self.sha256, "size": self.size, "mode": self.mode}


@dataclass(frozen=True)
class Manifest:
    name: str
    version: str
    build: str
    bundle: str  # directory of the onedir bundle, relative to the layout root
    executable: str  # relative to the layout root
    plugins: tuple[str, ...]  # CNI plugin entries (linked into a host bin dir)
    tools: tuple[str, ...]  # other entries of the image (the installer)
    files: dict[str, FileInfo]
    # what it was built from: {distribution: version} of bundler/requirements.lock (runtime and build,
    # PyInstaller included; the build refuses any other version) and the interpreter's version. Empty in
    # manifests written before the lock existed.
    locked: dict[str, str] = field(default_factory=dict)
    python: str = ""

    @staticmethod
    def from_dict(d: dict[str, Any], where: str = FILENAME) -> Manifest:
        try:
            files = {str(k): FileInfo(str(v["sha256"]), int(v["size"]), int(v["mode"]))
                     for k, v in d["files"].items()}
            locked = {str(k): str(v) for k, v in d.get("locked", {}).items()}
            return Manifest(str(d["name"]), str(d["version"]), str(d["build"]), str(d["bundle"]),
                            str(d["executable"]), tuple(d["plugins"]), tuple(d["tools"]), files,
                            locked, str(d.get("python", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{where}: invalid manifest ({e!r})") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "build": self.build, "bundle": self.bundle,
                "executable": self.executable, "plugins": list(self.plugins), "tools": list(self.tools),
                "entries": {n: self.executable for n in (*self.plugins, *self.tools)},
                "python": self.python, "locked": dict(sorted(self.locked.items())),
                "files": {k: v.to_dict() for k, v in sorted(self.files.items())}}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_info(path: Path) -> FileInfo:
    st = path.lstat()
    return FileInfo(sha256(path), st.st_size, stat.S_IMODE(st.st_mode))


def scan(root: Path, subdir: str) -> dict[str, FileInfo]:
    """Every regular file under root/subdir, keyed by its path relative to root."""
    out: dict[str, FileInfo] = {}
    for dirpath, dirnames, filenames in os.walk(root / subdir):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if p.is_symlink() or not p.is_file():
                raise ValueError(f"{p}: bundles hold regular files only")
            out[str(p.relative_to(root))] = file_info(p)
    return out


def tree_digest(files: dict[str, FileInfo]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name].sha256}\0{files[name].mode:o}\n".encode())
    return h.hexdigest()


def load(path: Path) -> Manifest:
    return Manifest.from_dict(jsonio.loads(path.read_bytes(), str(path)), str(path))


def problems(root: Path, m: Manifest, *, full: bool = True) -> list[str]:
    """Files of `m` missing, resized, re-moded or (full) with another digest under root."""
    bad = []
    for name, want in sorted(m.files.items()):
        p = root / name
        try:
            st = p.lstat()
        except OSError:
            bad.append(f"{name}: missing")
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size != want.size or stat.S_IMODE(st.st_mode) != want.mode:
            bad.append(f"{name}: size/mode/type differs")
        elif full and sha256(p) != want.sha256:
            bad.append(f"{name}: sha256 differs")
    return bad
