"""bundler/image.py without podman: the Dockerfile takes its base as an argument (so the offline build
runs the very file registry users build), host libraries are copied with every symlink on their path
(merged /usr), the base tarball is reproducible, and `make image` tags what the manifests deploy."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
import yaml

from bundler import build, image
from tests.unit import test_manifests as tm

LOADER = Path("/lib64/ld-linux-x86-64.so.2")


def test_dockerfile_builds_on_a_base_given_as_an_argument() -> None:
    lines = [x for x in image.DOCKERFILE.read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "ARG BASE=gcr.io/distroless/cc-debian12"
    assert [x for x in lines if x.startswith("FROM ")] == ["FROM ${BASE}"], "one stage, on BASE"
    assert not any(x.startswith(("RUN ", "ADD ")) for x in lines), "nothing runs: no shell in the base"


@pytest.mark.skipif(not LOADER.exists(), reason=f"{LOADER}: an x86-64 glibc host path to copy")
def test_host_paths_are_copied_with_the_links_on_their_way(tmp_path: Path) -> None:
    image._copy_host_path(str(LOADER), tmp_path)
    host, copy = Path("/"), tmp_path
    for part in LOADER.parts[1:]:
        host, copy = host / part, copy / part
        assert host.is_symlink() == copy.is_symlink(), copy
        if host.is_symlink():
            assert os.readlink(host) == os.readlink(copy)
    real = tmp_path / os.path.realpath(LOADER).lstrip("/")
    assert real.is_file() and not real.is_symlink()
    assert real.read_bytes() == LOADER.read_bytes()


def test_base_tarball_is_reproducible_and_owned_by_root(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/sbin/nologin\n")
    (root / "lib").symlink_to("usr/lib")
    first = image.tar_rootfs(root, tmp_path / "a.tar")
    os.utime(root / "etc" / "passwd", (1, 1))
    assert image.tar_rootfs(root, tmp_path / "b.tar") == first, "mtimes do not change the digest"
    (root / "etc" / "passwd").write_text("changed\n")
    assert image.tar_rootfs(root, tmp_path / "c.tar") != first
    with tarfile.open(tmp_path / "a.tar") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["etc", "etc/passwd", "lib"]
    assert all(m.uid == m.gid == 0 and m.mtime == 0 for m in members)
    assert members[2].issym() and members[2].linkname == "usr/lib"


def test_make_image_tags_the_image_the_manifests_deploy() -> None:
    kust = yaml.safe_load((tm.MANIFESTS / "kustomization.yaml").read_text())
    [deployed] = kust["images"]
    assert image.default_tag(build.version()) == f"{deployed['name']}:{deployed['newTag']}"
    for kind in ("DaemonSet", "Deployment"):
        for c in tm.by_kind(kind)[0]["spec"]["template"]["spec"]["containers"]:
            assert c["image"] == image.default_tag(build.version()), (kind, c["name"])
