"""`python -m bundler.repro [--keep]` (`make check-repro`): build the bundle twice from the same lock, each
in a fresh process with its own dist and PyInstaller work directory under one temp dir, the second from a
copy of the sources at another path, and compare the two cni-bin trees file by file (the .pyc files, the
executable with its embedded archive, the libraries, the manifest and build id). Exit 1 naming every file
that differs. Two full builds, so not part of the test suite
(tests/unit/test_bundle_lock.py covers the comparison itself)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bundler import build, manifest

PYTHON_SUFFIXES = (".pyc", ".py", ".zip")


def compare(a: Path, b: Path) -> list[str]:
    """Differences between two built cni-bin trees: files only in one, files whose content or mode
    differs, entries pointing elsewhere. Python files (.pyc, .py, .zip) are listed first."""
    fa, fb = manifest.scan(a, build.BUNDLE), manifest.scan(b, build.BUNDLE)
    out = [f"{n}: only in {a}" for n in sorted(fa.keys() - fb.keys())]
    out += [f"{n}: only in {b}" for n in sorted(fb.keys() - fa.keys())]
    changed = sorted((n for n in fa.keys() & fb.keys() if fa[n] != fb[n]),
                     key=lambda n: (not n.endswith(PYTHON_SUFFIXES), n))
    out += [f"{n}: differs" for n in changed]
    for name in sorted({p.name for p in (*a.iterdir(), *b.iterdir()) if p.is_symlink()}):
        la, lb = (os.readlink(d / name) if (d / name).is_symlink() else None for d in (a, b))
        if la != lb:
            out.append(f"{name}: entry {la} vs {lb}")
    ma, mb = (d / manifest.FILENAME for d in (a, b))
    if (ma.read_bytes() if ma.exists() else b"") != (mb.read_bytes() if mb.exists() else b""):
        out.append(f"{manifest.FILENAME}: differs")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bundler.repro", description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep", action="store_true", help="keep the two builds (their path is printed)")
    ap.add_argument("--dir", type=Path, help="an empty directory to build in (default: a new temp dir)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="pycni-repro-", dir=args.dir))
    try:
        copy = tmp / "src"
        for top in build.SOURCE_DIRS:
            shutil.copytree(build.REPO / top, copy / top, ignore=shutil.ignore_patterns("__pycache__"))
        for fn in build.SOURCE_FILES:
            shutil.copy2(build.REPO / fn, copy / fn)
        roots = []
        for i, src in ((1, build.REPO), (2, copy)):
            dist = tmp / f"dist{i}"
            # cwd first on sys.path: the copy's modules (and its REPO) are the ones built
            subprocess.run([sys.executable, "-m", "bundler.build", "--force", "--dist", str(dist),
                            "--work", str(tmp / f"work{i}")], check=True, cwd=src)
            roots.append(dist / "cni-bin")
        diffs = compare(*roots)
        n = len(manifest.scan(roots[0], build.BUNDLE))
        if diffs:
            print(f"NOT reproducible: {len(diffs)} of {n} files differ:\n  " + "\n  ".join(diffs))
            return 1
        m = manifest.load(roots[0] / manifest.FILENAME)
        pyc = sum(1 for f in manifest.scan(roots[0], build.BUNDLE) if f.endswith(".pyc"))
        print(f"reproducible: two builds, {n} files ({pyc} .pyc) identical, same build id {m.build}")
        return 0
    finally:
        if args.keep:
            print(f"builds kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
