"""The PyInstaller options of the bundle, in one place (read by bundler/pycni.spec).

Start-up cost is what a CNI plugin pays on every call, so each choice here is measured
(tests/bench/startup.py):
- onedir, never onefile: onefile extracts the whole bundle to a temp dir on every call.
- no UPX: decompressing libpython on every exec costs more than the disk it saves.
- strip: the pyenv libpython carries debug info (docs/benchmarks.md); fewer pages to map and to ship.
- runtime hooks dropped: PyInstaller adds pyi_rth_inspect (imports inspect and zipfile and lists
  base_library.zip on every call), pyi_rth_pkgutil and pyi_rth_multiprocessing whenever those modules
  are anywhere in the import graph. pycni never needs what they patch (no source lookup, no pkgutil
  module iteration over the frozen tree, no multiprocessing).
- noarchive: modules as plain .pyc files under _internal/ instead of the zlib-compressed PYZ inside the
  executable (no decompression, no TOC unmarshal per call).
- optimize 0: -O would strip asserts, and the frozen plugin must behave exactly like `python -m cni`;
  level 1 or 2 measured within the noise.
- the bootloader's second execve (it sets LD_LIBRARY_PATH and re-executes itself in onedir mode) costs
  little (docs/benchmarks.md); dropping it needs a self-built bootloader and patched ELF files, so it stays
  (bundler/README.md).
- hidden imports are cni.registry.LAZY_MODULES: the plugin/tool modules the dispatcher imports by name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bundler import lock

OPTIMIZE = int(os.environ.get("PYCNI_OPTIMIZE", "0"))
NOARCHIVE = os.environ.get("PYCNI_NOARCHIVE", "1") == "1"
STRIP = os.environ.get("PYCNI_STRIP", "1") == "1"
DROP_HOOKS = os.environ.get("PYCNI_KEEP_HOOKS", "0") != "1"

# Runtime hooks run at EVERY start of every entry. pyi_rth_setuptools (collected whenever setuptools is
# in the graph) imports setuptools on every call. None of these is needed: pycni never imports inspect's
# source helpers, pkgutil's frozen iterators, multiprocessing or setuptools at run time.
RUNTIME_HOOKS_DROPPED = (
    "pyi_rth_inspect", "pyi_rth_pkgutil", "pyi_rth_multiprocessing", "pyi_rth_setuptools",
)
RUNTIME_HOOKS_ALLOWED: tuple[str, ...] = ()

# Never imported on any pycni path but pulled into the graph by the stdlib: size only, no start-up cost.
# (pyroute2, a test dependency, is not excluded here: no first-party module imports it, and if one did,
# check_locked would refuse the build, pyroute2 being absent from the runtime lock.)
EXCLUDES: list[str] = [
    "tkinter", "unittest", "pydoc", "doctest", "lib2to3", "idlelib", "ensurepip", "venv", "xmlrpc",
    # PyInstaller's bootstrap imports ctypes at every start when it is collected; no pycni path
    # uses it. A merged module that does fails the frozen test pass with ImportError: drop it here then.
    *(["ctypes"] if os.environ.get("PYCNI_KEEP_CTYPES") != "1" else []),
    *os.environ.get("PYCNI_EXCLUDE", "").split(),
]


FIRST_PARTY = ("cni", "ipam", "bundler")


def hidden_imports(entry: str) -> list[str]:
    """cni.registry.LAZY_MODULES, plus every first-party module as a safety net for a module imported by
    name that someone forgot to declare (third-party imports inside those modules are found by the scan)."""
    if os.path.basename(entry) != "entry.py":
        return []
    from cni.registry import LAZY_MODULES

    return [*LAZY_MODULES, *(m for m in first_party_modules() if m not in LAZY_MODULES)]


def first_party_modules() -> list[str]:
    """Every module under the first-party packages, from the file tree (namespace packages included:
    pkgutil would not descend into a directory without __init__.py)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    for pkg in FIRST_PARTY:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d.isidentifier() and not d.startswith("__"))
            modules = sorted(f[:-3] for f in filenames if f.endswith(".py") and f != "__init__.py")
            if not modules and "__init__.py" not in filenames:
                continue  # data only (bundler/manifests)
            rel = os.path.relpath(dirpath, root).replace(os.sep, ".")
            out += [rel, *(f"{rel}.{m}" for m in modules)]
    return out


def check_collected(pure: Any, datas: Any, wanted: list[str]) -> None:
    """Fail the build (not a node, later) when a declared module was not collected. With noarchive the
    modules are collected as .pyc data files instead of PYZ entries."""
    have = {entry[0] for entry in pure}
    for entry in datas:
        name = str(entry[0])
        if name.endswith(".pyc"):
            have.add(name[: -len(".pyc")].removesuffix("/__init__").replace("/", "."))
    have |= {m.rsplit(".", i)[0] for m in list(have) for i in range(1, m.count(".") + 1)}  # namespace pkgs
    missing = sorted(set(wanted) - have)
    if missing:
        raise SystemExit(f"pycni bundle: modules not collected: {', '.join(missing)}")


def top_level_names(*tocs: Any) -> set[str]:
    """The top-level import names of everything collected: module names of PYZ entries, first path parts
    of files (noarchive .pyc data, extension modules, package data)."""
    out = set()
    for toc in tocs:
        for entry in toc:
            name = str(entry[0])
            kind = entry[2] if len(entry) > 2 else ""
            if kind not in ("PYMODULE", "PYSOURCE"):
                name = name.split("/", 1)[0]
            out.add(name.split(".", 1)[0])
    return out


def check_locked(*tocs: Any, lockfile: str | None = None) -> None:
    """Refuse to freeze a module of a distribution the lock does not pin (one that is merely installed
    here: a dev tool, a leftover), naming the distribution and the modules that pulled it in."""
    path = Path(lockfile or os.environ.get("PYCNI_LOCK") or lock.RUNTIME_LOCK)
    try:
        pins = lock.load(path)
    except lock.LockError as e:
        raise SystemExit(f"pycni bundle: {e}") from None
    unlocked = lock.unlocked_distributions(top_level_names(*tocs), pins)
    lock.refuse([f"{dist}: not in the lock, but its modules {', '.join(mods)} would be frozen"
                 for dist, mods in sorted(unlocked.items())], f"unlocked distributions ({path})")


BINARIES_FILE = "pycni-binaries.json"


def record_binaries(binaries: Any) -> None:
    """Write the source paths of the collected binaries where bundler.build asked (PYCNI_BINARIES_OUT):
    its rebuild check re-hashes them, so a library upgraded on the build machine rebuilds the bundle."""
    out = os.environ.get("PYCNI_BINARIES_OUT")
    if out:
        from cni import jsonio

        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = f"{out}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(jsonio.dumps(sorted({str(entry[1]) for entry in binaries})))
        os.replace(tmp, out)


def drop_runtime_hooks(scripts: Any) -> Any:
    """Drop the runtime hooks we measured and do not need; refuse to build with one nobody reviewed (a
    new dependency's hook silently costs every CNI call its start-up time)."""
    if not DROP_HOOKS:
        return scripts
    kept = [s for s in scripts if s[0] not in RUNTIME_HOOKS_DROPPED]
    unknown = [s[0] for s in kept if s[0].startswith("pyi_rth_") and s[0] not in RUNTIME_HOOKS_ALLOWED]
    if unknown:
        raise SystemExit(
            f"pycni bundle: runtime hooks {', '.join(unknown)} would run at every start: measure them and "
            "list them in bundler/freeze.py RUNTIME_HOOKS_DROPPED or RUNTIME_HOOKS_ALLOWED"
        )
    return kept


def python_options() -> list[tuple[str, None, str]]:
    """Interpreter options baked into the bootloader; PYCNI_IMPORTTIME=1 for start-up profiling."""
    return [("X importtime", None, "OPTION")] if os.environ.get("PYCNI_IMPORTTIME") == "1" else []
