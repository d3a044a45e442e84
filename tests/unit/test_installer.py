"""The installer against temporary 'host' directories, with a fake bundle (a real ELF stands in for the
frozen executable, so exec semantics are real): versioned copies, atomic switch, no-op re-run, grace
period, prefix, displaced foreign files, repair, conf files, uninstall."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bundler import binaries, install, manifest, state
from cni import jsonio
from tests.bundle_layouts import FAKE_EXE, fake_layout, opts, snapshot, variant, version_call

pytestmark = pytest.mark.skipif(not FAKE_EXE.exists(), reason=f"{FAKE_EXE} (containernetworking-plugins)")


@pytest.fixture
def host(tmp_path: Path) -> tuple[Path, Path, Path]:
    src = fake_layout(tmp_path / "src", "0.0.1")
    bin_dir, conf_dir = tmp_path / "host" / "opt-cni-bin", tmp_path / "host" / "etc-cni-net.d"
    bin_dir.mkdir(parents=True)
    conf_dir.mkdir(parents=True)
    return src, bin_dir, conf_dir


def build_id(src: Path) -> str:
    return manifest.load(src / manifest.FILENAME).build


def test_install_links_every_plugin_into_a_versioned_copy(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    assert install.install_once(opts(bin_dir, conf_dir, src))
    m = manifest.load(src / manifest.FILENAME)
    target = f".pycni/{m.build}/pycni/pycni"
    for name in m.plugins:
        assert os.readlink(bin_dir / name) == target  # relative: valid from the host and from /host
        call = version_call(bin_dir / name)
        assert call.returncode == 0 and "supportedVersions" in jsonio.loads(call.stdout)
    for name in m.tools:
        assert not (bin_dir / name).exists(), "tools are not CNI plugins: not linked on the host"
    assert manifest.problems(bin_dir / ".pycni" / m.build, m) == []
    st = state.load(bin_dir)
    assert (st.current, st.build, sorted(st.entries)) == (m.build, m.build, sorted(m.plugins))


def test_rerun_with_same_version_is_a_noop(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    install.install_once(opts(bin_dir, conf_dir, src))
    def stamps() -> dict[Path, tuple[int, int]]:
        paths = [*bin_dir.rglob("*"), *conf_dir.rglob("*")]
        return {p: (p.lstat().st_ino, p.lstat().st_mtime_ns) for p in paths}

    before = stamps()
    assert install.install_once(opts(bin_dir, conf_dir, src)) is False
    assert stamps() == before


def test_upgrade_switches_links_and_keeps_previous_for_the_grace_period(
        host: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, bin_dir, conf_dir = host
    src2 = variant(src, tmp_path / "src2", "0.0.2")
    install.install_once(opts(bin_dir, conf_dir, src, "--grace", "3600"))
    old, new = build_id(src), build_id(src2)
    assert install.install_once(opts(bin_dir, conf_dir, src2, "--grace", "3600"))
    assert os.readlink(bin_dir / "macvlan") == f".pycni/{new}/pycni/pycni"
    assert (bin_dir / ".pycni" / old).is_dir(), "a process started from the old version may still run"
    assert old in state.load(bin_dir).retired
    st = state.load(bin_dir)
    st.retired[old] -= 3601  # the grace period has passed
    state.save(bin_dir, st)
    assert install.install_once(opts(bin_dir, conf_dir, src2, "--grace", "3600"))
    assert not (bin_dir / ".pycni" / old).exists()
    assert state.load(bin_dir).retired == {}


def test_prefix_lives_beside_upstream_plugins(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    (bin_dir / "macvlan").write_bytes(FAKE_EXE.read_bytes())
    before = snapshot(bin_dir)
    install.install_once(opts(bin_dir, conf_dir, src, "--prefix", "pycni-"))
    assert snapshot(bin_dir)["macvlan"] == before["macvlan"]
    assert os.readlink(bin_dir / "pycni-macvlan").startswith(".pycni/")
    assert state.load(bin_dir).displaced == []


def test_foreign_file_is_displaced_then_restored(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    foreign = bin_dir / "macvlan"
    foreign.write_bytes(b"#!/bin/sh\necho upstream\n")
    foreign.chmod(0o755)
    inode = foreign.stat().st_ino
    install.install_once(opts(bin_dir, conf_dir, src, "--take-over"))
    assert binaries.is_ours(foreign)
    install.uninstall(opts(bin_dir, conf_dir, src))
    assert not foreign.is_symlink() and foreign.stat().st_ino == inode
    assert foreign.read_bytes() == b"#!/bin/sh\necho upstream\n"


def kube_args(tmp_path: Path) -> tuple[str, ...]:
    """The installer's options for the Kubernetes store, with a token and CA of the test's own."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_bytes(b"tok-1")
    ca.write_bytes(b"CA")
    return ("--ipam-datastore", "kubernetes", "--kube-server", "https://[2001:db8::1]:6443",
            "--token-file", str(token), "--ca-file", str(ca))


def test_uninstall_leaves_the_directories_as_they_were(host: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, bin_dir, conf_dir = host
    (bin_dir / "bridge").write_bytes(b"upstream bridge")
    (bin_dir / "macvlan").write_bytes(b"upstream macvlan")
    (conf_dir / "10-primary.conflist").write_bytes(b"{}")
    kube = kube_args(tmp_path)
    before_bin, before_conf = snapshot(bin_dir), snapshot(conf_dir)
    install.install_once(opts(bin_dir, conf_dir, src, *kube))
    v2 = variant(src, tmp_path / "v2", "0.0.2")
    install.install_once(opts(bin_dir, conf_dir, v2, *kube, "--grace", "60"))
    assert snapshot(conf_dir) != before_conf
    install.uninstall(opts(bin_dir, conf_dir, src, *kube))
    assert (snapshot(bin_dir), snapshot(conf_dir)) == (before_bin, before_conf)


def test_an_upstream_whereabouts_node_is_given_back_as_it_was(host: tuple[Path, Path, Path],
                                                                tmp_path: Path) -> None:
    """A node migrating from upstream whereabouts: its installer's binary, flat file and kubeconfig (an
    inline token, 0600) are replaced by ours, kept, and `--uninstall` (the rollback) puts back each of
    them, so upstream's binary finds its own flat file again."""
    src, bin_dir, conf_dir = host
    (bin_dir / "whereabouts").write_bytes(b"upstream whereabouts")
    wb = conf_dir / "whereabouts.d"
    wb.mkdir()
    (wb / "whereabouts.conf").write_bytes(b'{"datastore": "kubernetes"}')
    (wb / "whereabouts.kubeconfig").write_bytes(b"users: [{user: {token: upstream-secret}}]")
    for f in wb.iterdir():
        f.chmod(0o600)
    kube = kube_args(tmp_path)
    before_bin, before_conf = snapshot(bin_dir), snapshot(conf_dir)
    install.install_once(opts(bin_dir, conf_dir, src, *kube))
    assert b"upstream-secret" not in (wb / "whereabouts.kubeconfig").read_bytes()
    assert jsonio.loads((wb / "whereabouts.conf").read_bytes())["configuration_path"] == str(wb)
    kept = bin_dir / ".pycni" / "displaced-conf" / "whereabouts.d" / "whereabouts.kubeconfig"
    assert kept.read_bytes() == b"users: [{user: {token: upstream-secret}}]"
    assert kept.stat().st_mode & 0o777 == 0o600
    install.install_once(opts(bin_dir, conf_dir, src, *kube))  # a restart keeps what it kept
    assert kept.read_bytes() == b"users: [{user: {token: upstream-secret}}]"
    install.uninstall(opts(bin_dir, conf_dir, src, *kube))
    assert (snapshot(bin_dir), snapshot(conf_dir)) == (before_bin, before_conf)


def test_uninstall_removes_a_bin_dir_it_created(tmp_path: Path) -> None:
    src = fake_layout(tmp_path / "src")
    bin_dir, conf_dir = tmp_path / "new" / "bin", tmp_path / "new" / "conf"
    install.install_once(opts(bin_dir, conf_dir, src))
    install.uninstall(opts(bin_dir, conf_dir, src))
    assert not bin_dir.exists() and not conf_dir.exists()


def test_repair_never_writes_into_an_installed_copy(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    o = opts(bin_dir, conf_dir, src, "--grace", "3600")
    install.install_once(o)
    build = build_id(src)
    first = bin_dir / ".pycni" / build
    (first / "pycni" / "_internal" / "lib.dat").unlink()
    assert install.install_once(o)
    repaired = state.load(bin_dir).current
    assert repaired == f"{build}.r1"
    assert os.readlink(bin_dir / "macvlan") == f".pycni/{repaired}/pycni/pycni"
    assert not (first / "pycni" / "_internal" / "lib.dat").exists(), "the damaged copy is retired as is"
    data = bin_dir / ".pycni" / repaired / "pycni" / "_internal" / "lib.dat"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF  # same size: only the full sha256 check sees it
    data.write_bytes(bytes(raw))
    assert install.install_once(o, full=False) is False
    assert install.install_once(o, full=True)
    assert state.load(bin_dir).current == f"{build}.r2"


def test_removed_entry_is_restored(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    install.install_once(opts(bin_dir, conf_dir, src))
    (bin_dir / "macvlan").unlink()
    assert install.install_once(opts(bin_dir, conf_dir, src), full=False)
    assert version_call(bin_dir / "macvlan").returncode == 0
    assert state.load(bin_dir).current == build_id(src), "entries only: the copy itself was fine"


def test_source_that_does_not_match_its_manifest_is_refused(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    (src / "pycni" / "_internal" / "lib.dat").write_bytes(b"truncated")
    before = snapshot(bin_dir)
    with pytest.raises(RuntimeError, match="does not match its manifest"):
        install.install_once(opts(bin_dir, conf_dir, src))
    assert {k: v for k, v in snapshot(bin_dir).items() if not k.startswith(".pycni")} == before


def test_no_temporary_files_are_left(host: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, bin_dir, conf_dir = host
    install.install_once(opts(bin_dir, conf_dir, src, "--grace", "60"))
    install.install_once(opts(bin_dir, conf_dir, variant(src, tmp_path / "v2", "0.0.2"), "--grace", "60"))
    leftovers = [p for p in [*bin_dir.rglob("*"), *conf_dir.rglob("*")] if "pycni-tmp" in p.name]
    assert leftovers == []


def test_retired_copy_goes_after_grace_without_upgrade(host: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src, bin_dir, conf_dir = host
    install.install_once(opts(bin_dir, conf_dir, src, "--grace", "0.2"))
    install.install_once(opts(bin_dir, conf_dir, variant(src, tmp_path / "v2", "0.0.2"), "--grace", "0.2"))
    time.sleep(0.3)
    assert install.install_once(opts(bin_dir, conf_dir, tmp_path / "v2", "--grace", "0.2"))
    assert sorted(p.name for p in (bin_dir / ".pycni").iterdir() if p.is_dir()) == [build_id(tmp_path / "v2")]


def test_leftovers_of_a_crashed_run_are_cleaned_or_adopted(host: tuple[Path, Path, Path]) -> None:
    src, bin_dir, conf_dir = host
    install.install_once(opts(bin_dir, conf_dir, src))
    home = bin_dir / ".pycni"
    (home / ".0.0.9-x.pycni-tmp-dead").mkdir()  # a staged copy the crash interrupted
    (bin_dir / ".macvlan.pycni-tmp-dead").symlink_to("nowhere")  # a symlink never renamed
    (home / "0.0.9-orphan").mkdir()  # renamed into place, state never saved
    (conf_dir / "whereabouts.d" / ".nodename.pycni-tmp-dead").write_bytes(b"half")
    assert install.install_once(opts(bin_dir, conf_dir, src, "--grace", "3600")) is False
    assert "0.0.9-orphan" in state.load(bin_dir).retired
    assert [p.name for p in [*bin_dir.rglob("*"), *conf_dir.rglob("*")] if "pycni-tmp" in p.name] == []
    install.install_once(opts(bin_dir, conf_dir, src, "--grace", "0"))
    assert not (home / "0.0.9-orphan").exists()
