"""`python -m bundler.build [--dist DIR] [--empty] [--force]`: freeze pycni with PyInstaller (onedir) into ONE
multicall bundle and lay out DIR/cni-bin as a ready CNI_PATH directory:

    cni-bin/pycni/            the bundle (executable `pycni` + `_internal/`)
    cni-bin/<plugin>          -> pycni/pycni, one per cni.registry.PLUGINS name
    cni-bin/pycni-install     -> pycni/pycni (the installer, cni.registry.TOOLS)
    cni-bin/pycni.manifest.json  version, build id, locked versions, sha256/size/mode of every bundle file

Locked: before freezing, every distribution of bundler/requirements.lock (the runtime dependencies and
PyInstaller with its own) must be installed at exactly its locked version, and after PyInstaller's
analysis every distribution a collected module belongs to must be in the lock (bundler/pycni.spec);
otherwise the build stops naming them. Reproducible: two builds from the same lock give the same files
(`make check-repro`); PyInstaller runs with PYTHONHASHSEED=0 and SOURCE_DATE_EPOCH set to keep it so.
Cached: DIR/cni-bin.inputs holds a digest of everything the bundle is made from (first-party sources,
pyproject.toml, the lock, the installed locked versions, the interpreter, the PYCNI_* build knobs) and
the sha256 of the system libraries it collected; with both unchanged and an intact DIR/cni-bin nothing
is rebuilt (`--force` rebuilds anyway).

`--empty` freezes an empty program with the same options into DIR/empty (the benchmark's floor)."""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from bundler import freeze as freeze_options
from bundler import fsutil, lock, manifest
from cni import jsonio
from cni.errors import DecodeError
from cni.registry import PLUGINS, TOOLS

REPO = Path(__file__).resolve().parent.parent
BUNDLE = "pycni"
BUILD_ID_FILE = "pycni-build-id"  # == cni.buildid.BUILD_FILE, inside the bundle's _internal/
INPUTS_SUFFIX = ".inputs"  # DIR/cni-bin.inputs: the input digest of the bundle in DIR/cni-bin
# What the bundle is made from besides the interpreter and the installed distributions.
SOURCE_DIRS = ("cni", "ipam", "bundler")
SOURCE_FILES = ("pyproject.toml",)
DOC_AND_CACHE = (".md", ".pyc")  # under SOURCE_DIRS, never part of the bundle
# The environment knobs bundler/freeze.py reads: each changes what is frozen.
BUILD_KNOBS = ("PYCNI_OPTIMIZE", "PYCNI_NOARCHIVE", "PYCNI_STRIP", "PYCNI_KEEP_HOOKS", "PYCNI_KEEP_CTYPES",
               "PYCNI_EXCLUDE", "PYCNI_IMPORTTIME")
# Fixed, not the clock nor the commit: the .pyc files PyInstaller writes are hash-based with a zeroed
# hash (no timestamp); this pins anything else that would stamp the build time.
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip entry can carry


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def declared_dependencies() -> list[str]:
    """The distribution names pyproject.toml declares for the bundle: runtime dependencies and the build
    extra (PyInstaller)."""
    with open(REPO / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    return lock.requirement_names([*project["dependencies"], *project["optional-dependencies"]["build"]])


def check_locked(lockfile: Path = lock.RUNTIME_LOCK) -> dict[str, lock.Pin]:
    """The lock, after refusing a build whose distributions are not exactly the lock's."""
    try:
        pins = lock.load(lockfile)
    except lock.LockError as e:
        raise SystemExit(f"pycni bundle: {e}") from None
    lock.refuse(lock.check(pins, declared_dependencies()), f"the build environment does not match {lockfile}")
    return pins


def collected_binaries(workpath: Path) -> list[str]:
    """Source paths of the binaries the last freeze into workpath collected (bundler/pycni.spec)."""
    try:
        doc = jsonio.loads((workpath / freeze_options.BINARIES_FILE).read_bytes())
    except (OSError, ValueError, DecodeError):
        return []
    return [str(p) for p in doc] if isinstance(doc, list) else []


def freeze(entry: Path, name: str, distpath: Path, workpath: Path,
           lockfile: Path = lock.RUNTIME_LOCK) -> Path:
    env = {**os.environ, "PYCNI_ENTRY": str(entry), "PYCNI_NAME": name, "PYCNI_LOCK": str(lockfile),
           "PYCNI_BINARIES_OUT": str(workpath / freeze_options.BINARIES_FILE),
           # no set or dict of strings iterated anywhere in PyInstaller or its hooks can order the output
           # differently per run (measured: no difference without it on 3.12, whose marshal sorts
           # frozenset constants; this keeps it so for whatever a new hook or PyInstaller does)
           "PYTHONHASHSEED": "0", "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
           # PyInstaller's cache (processed binaries) of this build's own, not the user's ~/.cache one:
           # two builds at once (two clones' `make test` on one machine) cleaned and rewrote each
           # other's cache index there, and one read it half written
           "PYINSTALLER_CONFIG_DIR": str(workpath / "pyinstaller-cache")}
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
           "--distpath", str(distpath), "--workpath", str(workpath), str(REPO / "bundler" / "pycni.spec")]
    rc = subprocess.run(cmd, check=False, env=env, cwd=REPO).returncode
    if rc:
        raise SystemExit(f"pycni bundle: PyInstaller failed (exit {rc}; its message is above)")
    return distpath / name


def _hash_file(h: hashlib._Hash, path: Path, name: str) -> None:
    st = path.stat()
    h.update(f"{name}\0{st.st_mode & 0o111:o}\0{manifest.sha256(path)}\n".encode())


def inputs_digest(repo: Path, pins: dict[str, lock.Pin], lockfile: Path,
                  environ: dict[str, str] | None = None) -> str:
    """Digest of everything the bundle is made from: the first-party sources (every file under
    SOURCE_DIRS but caches and documentation: content and executable bits, not mtimes), pyproject.toml,
    the lock, the locked distributions as installed, the interpreter (version, executable and libpython)
    and the build knobs. Equal digests: the bundle would come out the same (`make check-repro`)."""
    env = os.environ if environ is None else environ
    h = hashlib.sha256()
    for top in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(repo / top):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fn in sorted(filenames):
                p = Path(dirpath) / fn
                if not fn.endswith(DOC_AND_CACHE) and p.is_file():
                    _hash_file(h, p, str(p.relative_to(repo)))
    for fn in SOURCE_FILES:
        _hash_file(h, repo / fn, fn)
    _hash_file(h, lockfile, "LOCK")
    for name in sorted(pins):
        h.update(f"dist {name}=={lock.installed_version(name)}\n".encode())
    h.update(f"python {sys.version} {sys.implementation.cache_tag}\n".encode())
    for path in interpreter_files():
        _hash_file(h, path, f"python:{path}")
    for knob in BUILD_KNOBS:
        h.update(f"env {knob}={env.get(knob)}\n".encode())
    return h.hexdigest()


def interpreter_files() -> list[Path]:
    """The interpreter's executable and, for a shared build (pyenv's), its libpython: what the bundle
    copies and links."""
    import sysconfig

    out = [Path(sys.executable).resolve()]
    libdir, ldlib = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDLIBRARY")
    if libdir and ldlib and sysconfig.get_config_var("Py_ENABLE_SHARED"):
        lib = Path(libdir) / ldlib
        if lib.is_file():
            out.append(lib.resolve())
    return out


def binaries_digests(paths: list[str]) -> dict[str, str]:
    """sha256 of the shared libraries and extension modules PyInstaller collected, by source path (the
    system's libssl, libsqlite3, ... change with an apt upgrade, not with anything of ours)."""
    out = {}
    for p in sorted(set(paths)):
        try:
            out[p] = manifest.sha256(Path(p))
        except OSError:
            out[p] = "missing"
    return out


def write_stamp(stamp: Path, digest: str, binaries: list[str]) -> None:
    doc = {"inputs": digest, "binaries": binaries_digests(binaries)}
    fsutil.write_atomic(stamp, jsonio.dumps(doc, indent=True) + b"\n", 0o644)


def up_to_date(root: Path, digest: str) -> manifest.Manifest | None:
    """The manifest of root when root was built from `digest`, the libraries it collected are unchanged,
    and it is still intact (every file's sha256 and every entry)."""
    stamp = root.with_name(root.name + INPUTS_SUFFIX)
    try:
        doc = jsonio.loads(stamp.read_bytes(), str(stamp))
        if not isinstance(doc, dict) or doc.get("inputs") != digest:
            return None
        binaries = doc.get("binaries")
        if not isinstance(binaries, dict) or binaries_digests(list(binaries)) != binaries:
            return None
        m = manifest.load(root / manifest.FILENAME)
    except (OSError, ValueError, DecodeError):  # no stamp, a damaged one, one of an older format
        return None
    entries_ok = all(os.path.islink(root / e) and os.readlink(root / e) == m.executable
                     for e in (*m.plugins, *m.tools))
    return m if entries_ok and not manifest.problems(root, m) else None


def layout(root: Path, ver: str, locked: dict[str, str] | None = None) -> manifest.Manifest:
    """Entries, build id and manifest for the bundle already frozen into root/BUNDLE."""
    internal = root / BUNDLE / "_internal"
    (internal / BUILD_ID_FILE).unlink(missing_ok=True)
    digest = manifest.tree_digest(manifest.scan(root, BUNDLE))
    build = f"{ver}-{digest[:12]}"
    (internal / BUILD_ID_FILE).write_text(build + "\n")
    (internal / BUILD_ID_FILE).chmod(0o644)
    m = manifest.Manifest(name="pycni", version=ver, build=build, bundle=BUNDLE,
                          executable=f"{BUNDLE}/{BUNDLE}", plugins=tuple(sorted(PLUGINS)),
                          tools=tuple(sorted(TOOLS)), files=manifest.scan(root, BUNDLE),
                          locked=dict(locked or {}), python=sys.version.split()[0])
    for entry in (*m.plugins, *m.tools):
        link = root / entry
        link.unlink(missing_ok=True)
        link.symlink_to(m.executable)
    (root / manifest.FILENAME).write_bytes(jsonio.dumps(m.to_dict(), indent=True) + b"\n")
    return m


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bundler.build", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dist", type=Path, default=REPO / "dist")
    ap.add_argument("--empty", action="store_true", help="freeze the empty program (start-up floor)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the inputs did not change")
    ap.add_argument("--work", type=Path, default=REPO / "build" / "pyinstaller",
                    help="PyInstaller's workpath")
    args = ap.parse_args(argv)
    dist: Path = args.dist.resolve()
    work: Path = args.work.resolve()
    pins = check_locked()
    if args.empty:
        out = freeze(REPO / "bundler" / "empty_entry.py", "empty", dist / "empty-bundle", work)
        print(f"built {out}")
        return 0
    root = dist / "cni-bin"
    stamp = root.with_name(root.name + INPUTS_SUFFIX)
    digest = inputs_digest(REPO, pins, lock.RUNTIME_LOCK)
    if not args.force and (m := up_to_date(root, digest)) is not None:
        print(f"{root} is up to date (build {m.build}; inputs {digest[:12]}; --force rebuilds)")
        return 0
    stamp.unlink(missing_ok=True)  # an interrupted build must never look up to date
    shutil.rmtree(root, ignore_errors=True)
    freeze(REPO / "bundler" / "entry.py", BUNDLE, root, work)
    m = layout(root, version(), {name: pin.version for name, pin in pins.items()})
    write_stamp(stamp, digest, collected_binaries(work))
    print(f"built {root} (build {m.build}; inputs {digest[:12]}; "
          f"entries: {', '.join((*m.plugins, *m.tools))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
