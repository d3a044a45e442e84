"""`python -m bundler.build [--dist DIR] [--empty]`: freeze pycni with PyInstaller (onedir) into ONE
multicall bundle and lay out DIR/cni-bin as a ready CNI_PATH directory:

    cni-bin/pycni/            the bundle (executable `pycni` + `_internal/`)
    cni-bin/<plugin>          -> pycni/pycni, one per cni.registry.PLUGINS name
    cni-bin/pycni-install     -> pycni/pycni (the installer, cni.registry.TOOLS)
    cni-bin/pycni.manifest.json  version, build id, sha256/size/mode of every bundle file

`--empty` freezes an empty program with the same options into DIR/empty (the benchmark's floor)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from bundler import manifest
from cni import jsonio
from cni.registry import PLUGINS, TOOLS

REPO = Path(__file__).resolve().parent.parent
BUNDLE = "pycni"
BUILD_ID_FILE = "pycni-build-id"  # == cni.__main__.BUILD_FILE, inside the bundle's _internal/


def version() -> str:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def freeze(entry: Path, name: str, distpath: Path, workpath: Path) -> Path:
    env = {**os.environ, "PYCNI_ENTRY": str(entry), "PYCNI_NAME": name}
    cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--log-level", "WARN",
           "--distpath", str(distpath), "--workpath", str(workpath), str(REPO / "bundler" / "pycni.spec")]
    subprocess.run(cmd, check=True, env=env, cwd=REPO)
    return distpath / name


def layout(root: Path, ver: str) -> manifest.Manifest:
    """Entries, build id and manifest for the bundle already frozen into root/BUNDLE."""
    internal = root / BUNDLE / "_internal"
    (internal / BUILD_ID_FILE).unlink(missing_ok=True)
    digest = manifest.tree_digest(manifest.scan(root, BUNDLE))
    build = f"{ver}-{digest[:12]}"
    (internal / BUILD_ID_FILE).write_text(build + "\n")
    (internal / BUILD_ID_FILE).chmod(0o644)
    m = manifest.Manifest(name="pycni", version=ver, build=build, bundle=BUNDLE,
                          executable=f"{BUNDLE}/{BUNDLE}", plugins=tuple(sorted(PLUGINS)),
                          tools=tuple(sorted(TOOLS)), files=manifest.scan(root, BUNDLE))
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
    args = ap.parse_args(argv)
    dist: Path = args.dist.resolve()
    work = REPO / "build" / "pyinstaller"
    if args.empty:
        out = freeze(REPO / "bundler" / "empty_entry.py", "empty", dist / "empty-bundle", work)
        print(f"built {out}")
        return 0
    root = dist / "cni-bin"
    shutil.rmtree(root, ignore_errors=True)
    freeze(REPO / "bundler" / "entry.py", BUNDLE, root, work)
    m = layout(root, version())
    print(f"built {root} (build {m.build}; entries: {', '.join((*m.plugins, *m.tools))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
