"""`python -m bundler.image [--layout DIR] [--tag pycni:VERSION] [--save FILE]`: build the pycni image
offline with podman, from the frozen bundle and this machine's own shared libraries; no registry.

Two steps, and the second is the registry path's own:

1. a base image made here: `podman import` of a tarball holding exactly the shared libraries the
   bundle's ELF files load from outside the bundle (`ldd`; the bootloader's first process runs with
   the node's environment and needs the system's libz, everything after its re-exec has `_internal/`
   first in LD_LIBRARY_PATH, so what the bundle carries is not taken twice), the dynamic loader,
   libgcc_s (which glibc dlopens for pthread_exit: ldd cannot see it), /etc/passwd and /etc/group for
   uid 0 and 65534, and /tmp, /run;
2. `podman build -f bundler/Dockerfile --build-arg BASE=<that base>`: the very Dockerfile users build
   with a registry base (distroless cc-debian12: Debian 12's libc6, libgcc-s1 and zlib1g, the
   packages step 1 copies from),
   so /pycni/cni-bin, the entry point and every path the manifests name are the same in both images.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from bundler import build, manifest

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "bundler" / "Dockerfile"
NAME = "pycni"
IMAGE_LAYOUT = "dist/cni-bin"  # where the Dockerfile COPYs from, relative to the build context
DLOPENED = ("libgcc_s.so.1",)  # glibc loads it at run time (pthread_exit/cancel unwinding)
# The base the Dockerfile names for a registry build is made of these Debian packages; every library
# the offline base copies must come from one of them (tests/e2e/test_image.py checks with dpkg -S).
REGISTRY_BASE_PACKAGES = ("libc6", "libgcc-s1", "zlib1g")
ETC = {"etc/passwd": "root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:"
                     "/sbin/nologin\n",
       "etc/group": "root:x:0:\nnogroup:x:65534:\n"}
_LDD = re.compile(r"^\s*(?:\S+ => )?(/\S+) \(0x[0-9a-f]+\)$")


@dataclass(frozen=True)
class Built:
    tag: str
    base: str  # the base image reference (localhost/pycni-base:<digest>)
    build: str  # the bundle's build id (pycni.manifest.json)


def elf_files(layout: Path) -> list[Path]:
    out = []
    for p in sorted((layout / build.BUNDLE).rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def libraries(layout: Path) -> list[str]:
    """Absolute host paths of what the bundle loads from outside itself, as the loader names them."""
    internal = (layout / build.BUNDLE / "_internal").resolve()
    exe = (layout / build.BUNDLE / build.BUNDLE).resolve()
    found: set[str] = set()
    for elf in elf_files(layout):
        # the bootloader starts with the node's environment (its own libz comes from the system), then
        # re-executes itself with _internal first in LD_LIBRARY_PATH for everything else
        env = {"PATH": os.defpath, **({} if elf.resolve() == exe else {"LD_LIBRARY_PATH": str(internal)})}
        out = subprocess.run(["ldd", str(elf)], env=env, capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            m = _LDD.match(line)
            if m and not os.path.realpath(m.group(1)).startswith(str(internal) + os.sep):
                found.add(m.group(1))
    if not found:
        raise RuntimeError(f"ldd found no libraries for {layout}: not a dynamically linked bundle?")
    libc_dir = Path(next(p for p in found if Path(p).name == "libc.so.6")).parent
    for name in DLOPENED:
        if not (libc_dir / name).exists():
            raise RuntimeError(f"{libc_dir / name} missing (Debian: apt-get install libgcc-s1)")
        found.add(str(libc_dir / name))
    return sorted(found)


def _copy_host_path(path: str, root: Path) -> None:
    """Copy one absolute host path into root, recreating every symlink on the way (merged /usr:
    /lib64 -> usr/lib64, ld-linux-x86-64.so.2 -> ...) so the loader finds it where the host does."""
    parts = Path(path).parts[1:]
    host = Path("/")
    for i, part in enumerate(parts):
        host = host / part
        dest = root / host.relative_to("/")
        if host.is_symlink():
            if not dest.is_symlink():
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.symlink_to(os.readlink(host))
            target = os.path.normpath(os.path.join(host.parent, os.readlink(host)))
            _copy_host_path(os.path.join(target, *parts[i + 1:]), root)
            return
        if i == len(parts) - 1:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(host, dest)


def base_rootfs(layout: Path, root: Path) -> list[str]:
    """Write the base root filesystem into root (empty or absent); returns the library paths."""
    libs = libraries(layout)
    for lib in libs:
        _copy_host_path(lib, root)
    for rel, text in ETC.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        (root / rel).chmod(0o644)
    for d, mode in (("tmp", 0o1777), ("run", 0o755), ("proc", 0o555), ("sys", 0o555), ("dev", 0o755)):
        (root / d).mkdir(exist_ok=True)
        (root / d).chmod(mode)
    (root / "var").mkdir(exist_ok=True)
    (root / "var" / "run").symlink_to("../run")
    return libs


def tar_rootfs(root: Path, out: Path) -> str:
    """A reproducible tarball of root (owner 0:0, mtime 0, sorted); returns its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(p), arcname=str(p.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isreg():
                with open(p, "rb") as fh:
                    tar.addfile(info, fh)
            else:
                tar.addfile(info)
    data = buf.getvalue()
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return hashlib.sha256(data).hexdigest()


def _podman(podman: list[str], *args: str) -> str:
    proc = subprocess.run([*podman, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def build_image(layout: Path, tag: str, workdir: Path, podman: list[str] | None = None) -> Built:
    """Base image from this machine's libraries, then bundler/Dockerfile on it with podman."""
    podman = podman or ["podman"]
    m = manifest.load(layout / manifest.FILENAME)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    base_rootfs(layout, workdir / "rootfs")
    digest = tar_rootfs(workdir / "rootfs", workdir / "base.tar")
    base = f"localhost/pycni-base:{digest[:12]}"
    _podman(podman, "import", "--quiet", str(workdir / "base.tar"), base)
    ctx = workdir / "context"
    shutil.copytree(layout, ctx / IMAGE_LAYOUT, symlinks=True)
    _podman(podman, "build", "--quiet", "--pull=never", "--file", str(DOCKERFILE), "--build-arg",
            f"BASE={base}", "--label", f"org.opencontainers.image.version={m.version}",
            "--label", f"io.pycni.build={m.build}", "--tag", tag, str(ctx))
    return Built(tag=tag, base=base, build=m.build)


def default_tag(version: str) -> str:
    """The image bundler/manifests deploy (kustomization `images: name`, `newTag` = the version)."""
    return f"{NAME}:{version}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bundler.image", description=__doc__.split("\n\n")[0])
    ap.add_argument("--layout", type=Path, default=REPO / "dist" / "cni-bin", help="the cni-bin layout")
    ap.add_argument("--tag", default=None, help="image name (default pycni:<version>)")
    ap.add_argument("--save", type=Path, default=None, help="also write a docker-archive tarball here")
    ap.add_argument("--workdir", type=Path, default=REPO / "build" / "image")
    args = ap.parse_args(argv)
    layout: Path = args.layout.resolve()
    tag = args.tag or default_tag(manifest.load(layout / manifest.FILENAME).version)
    built = build_image(layout, tag, args.workdir.resolve())
    if args.save:
        args.save.unlink(missing_ok=True)
        _podman(["podman"], "save", "--format", "docker-archive", "--output", str(args.save), tag)
    print(f"built {built.tag} (build {built.build}) on {built.base}"
          + (f"; saved to {args.save}" if args.save else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
