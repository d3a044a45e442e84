"""Security (issue 7): every file the suite writes is root-owned and 0600 and never written through a
symlink planted in its place; secrets never reach a log line; CNI_PATH entries that are not absolute
are ignored. The session-wide grep of every log line is tests/conftest.py (_no_secrets_in_logs)."""

from __future__ import annotations

import functools
import os
import stat
import sys
from pathlib import Path

import pytest

from bundler import install
from cni import jsonio
from ipam import engine
from ipam.retry import Retry
from tests.bundle_layouts import FAKE_EXE, fake_layout, opts
from tests.conftest import SECRET_MARK
from tests.hardening.conftest import TALLY
from tests.hardening.fuzzlab import SECRET, FuzzLab, run_process

pytestmark = pytest.mark.root  # namespaces and links
VICTIM_TEXT = b"victim: must stay as it is\n"



def assert_private(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode), f"{path}: not a regular file"
    assert st.st_uid == 0 and (st.st_mode & 0o777) == 0o600, f"{path}: uid {st.st_uid} mode {st.st_mode:o}"


def plant(link: Path, victim: Path, exists: bool) -> None:
    link.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    victim.unlink(missing_ok=True)
    if exists:
        victim.write_bytes(VICTIM_TEXT)
    link.unlink(missing_ok=True)
    os.symlink(victim, link)
    TALLY["symlinks planted"] += 1


def untouched(victim: Path, exists: bool) -> None:
    if exists:
        assert victim.read_bytes() == VICTIM_TEXT, "written through the symlink"
    else:
        assert not victim.exists(), "created through the symlink"


# ---- the local store ------------------------------------------------------------------------------


def test_local_store_files_are_private(lab: FuzzLab, tmp_path: Path) -> None:
    db = tmp_path / "state" / "whereabouts.db"
    conf = lab.conf("whereabouts", ipam=lab.ipam(local_db=str(db)))
    env = lab.env("ADD", CNI_CONTAINERID="sec-files")
    got = lab.call("whereabouts", env, jsonio.dumps(conf))
    assert got.rc == 0, got.raw
    from ipam.store.local import LocalStore

    store = LocalStore(str(db))  # an open connection keeps -wal and -shm in place
    store.ping()
    try:
        files = sorted(p.name for p in db.parent.iterdir())
        assert files == ["whereabouts.db", "whereabouts.db-shm", "whereabouts.db-wal"], files
        for name in files:
            assert_private(db.parent / name)
        assert (db.parent.stat().st_mode & 0o777) == 0o700
    finally:
        store.close()
    assert lab.call("whereabouts", {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0


@pytest.mark.parametrize("exists", [False, True], ids=["victim-absent", "victim-present"])
@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", "-journal"])
def test_local_store_refuses_planted_symlinks(lab: FuzzLab, tmp_path: Path, suffix: str,
                                              exists: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    # The refused link is an unavailable store, which the engine retries for its outage grace (3 s,
    # ipam/retry.py; its length is tested in tests/unit/ipam/test_engine.py) before code 11. A planted
    # link never goes away by itself: here the calls (in this process) give up after 0.1 s, the same
    # retry path and the same answer, without waiting 3 s per call for nothing.
    monkeypatch.setattr(engine, "Retry", functools.partial(Retry, outage=0.1))
    db = tmp_path / "state" / "whereabouts.db"
    conf = lab.conf("whereabouts", ipam=lab.ipam(local_db=str(db)))
    env = lab.env("ADD", CNI_CONTAINERID="sec-link")
    if suffix:  # the database exists; a link is planted beside it
        assert lab.call("whereabouts", env, jsonio.dumps(conf)).rc == 0
        assert lab.call("whereabouts", {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0
    victim = tmp_path / "victim"
    plant(Path(f"{db}{suffix}"), victim, exists)
    for command in ("ADD", "DEL"):
        got = lab.call("whereabouts", {**env, "CNI_COMMAND": command}, jsonio.dumps(conf))
        assert got.rc == 1, got.raw
        code, msg = got.error()
        assert code == 11 and f"{db}{suffix}: is a symlink" in msg, msg
    untouched(victim, exists)
    os.unlink(f"{db}{suffix}")
    assert lab.call("whereabouts", env, jsonio.dumps(conf)).rc == 0  # after recovery
    assert lab.call("whereabouts", {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0


# ---- device records, owners and locks -------------------------------------------------------------


@pytest.mark.parametrize("exists", [False, True], ids=["victim-absent", "victim-present"])
@pytest.mark.parametrize("sub", ["attachments", "owners", "locks"])
@pytest.mark.parametrize("plugin", ["host-device", "sriov"])
def test_device_state_refuses_planted_symlinks(lab: FuzzLab, tmp_path: Path, plugin: str, sub: str,
                                               exists: bool) -> None:
    conf, env = lab.conf(plugin), lab.env("ADD", CNI_CONTAINERID="sec-dev")
    key = "pci-0000:af:06.0" if plugin == "sriov" else "pci-0000:3b:00.0"
    name = {"attachments": "sec-dev:net1", "owners": key, "locks": key}[sub]
    link = lab.lab.state_dir / sub / name
    victim = tmp_path / "victim"
    plant(link, victim, exists)
    got = lab.call(plugin, env, jsonio.dumps(conf))
    untouched(victim, exists)
    if got.rc == 0:  # written by rename: the link was replaced, not followed
        assert not link.is_symlink()
        assert lab.call(plugin, {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0
    else:
        assert "symlink" in got.error()[1], got.raw
        link.unlink()
        lab.call(plugin, {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf))
    untouched(victim, exists)
    for d in ("attachments", "owners"):
        for p in (lab.lab.state_dir / d).iterdir() if (lab.lab.state_dir / d).is_dir() else ():
            assert_private(p)
    assert lab.leftovers() == []


def test_device_records_are_private(lab: FuzzLab) -> None:
    conf, env = lab.conf("sriov"), lab.env("ADD", CNI_CONTAINERID="sec-rec")
    assert lab.call("sriov", env, jsonio.dumps(conf)).rc == 0
    try:
        files = [p for d in ("attachments", "owners") for p in (lab.lab.state_dir / d).iterdir()]
        assert len(files) == 2
        for p in files:
            assert_private(p)
        for d in ("attachments", "owners", "locks"):
            assert ((lab.lab.state_dir / d).stat().st_mode & 0o777) == 0o700
    finally:
        assert lab.call("sriov", {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0


# ---- log files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("exists", [False, True], ids=["victim-absent", "victim-present"])
@pytest.mark.parametrize(("plugin", "where"), [("macvlan", "logFile"), ("whereabouts", "ipam.log_file")])
def test_log_file_never_through_a_symlink(lab: FuzzLab, tmp_path: Path, plugin: str, where: str,
                                          exists: bool) -> None:
    logfile, victim = tmp_path / "plugin.log", tmp_path / "victim"
    plant(logfile, victim, exists)
    conf = lab.conf(plugin)
    if where == "logFile":
        conf |= {"logFile": str(logfile), "logLevel": "debug"}
    else:
        conf["ipam"] |= {"log_file": str(logfile)}
    env = lab.env("ADD", CNI_CONTAINERID="sec-log")
    got = run_process(lab, plugin, env, jsonio.dumps(conf))  # a fresh process: its own log state
    assert got.rc == 0, got.raw
    assert run_process(lab, plugin, {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0
    untouched(victim, exists)
    assert b"cannot open log file" in got.raw
    logfile.unlink()
    got = run_process(lab, plugin, env, jsonio.dumps(conf))
    assert run_process(lab, plugin, {**env, "CNI_COMMAND": "DEL"}, jsonio.dumps(conf)).rc == 0
    assert got.rc == 0 and logfile.stat().st_size > 0
    assert_private(logfile)


# ---- installer outputs ----------------------------------------------------------------------------

needs_fake = pytest.mark.skipif(not FAKE_EXE.exists(), reason=f"{FAKE_EXE} (containernetworking-plugins)")


def kube_args(tmp_path: Path) -> tuple[str, ...]:
    token, ca = tmp_path / "sa" / "token", tmp_path / "sa" / "ca.crt"
    token.parent.mkdir(exist_ok=True)
    token.write_bytes(SECRET_MARK.encode() + b"installer-token")
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return ("--ipam-datastore", "kubernetes", "--kube-server", "https://[2001:db8::10]:6443",
            "--token-file", str(token), "--ca-file", str(ca), "--namespace", "pycni-system",
            "--log-level", "debug")


INSTALLER_FILES = ["whereabouts.d/whereabouts.conf", "whereabouts.d/whereabouts.kubeconfig",
                   "whereabouts.d/pycni-sa-token", "whereabouts.d/pycni-ca.crt", "whereabouts.d/nodename"]


@needs_fake
@pytest.mark.parametrize("exists", [False, True], ids=["victim-absent", "victim-present"])
@pytest.mark.parametrize("rel", [*INSTALLER_FILES, "whereabouts.d", "BIN/.pycni/lock",
                                 "BIN/.pycni/state.json"])
def test_installer_never_writes_through_a_symlink(tmp_path: Path, rel: str, exists: bool) -> None:
    src = fake_layout(tmp_path / "src")
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    o = opts(bin_dir, conf_dir, src, *kube_args(tmp_path))
    if rel.startswith("BIN/"):
        install.install_once(o)  # the state dir exists; its files are replaced by links
        link = bin_dir / rel.removeprefix("BIN/")
    else:
        link = conf_dir / rel
    victim = tmp_path / "victim"
    if rel == "whereabouts.d":  # a planted directory link: nothing may be written into its target
        victim.mkdir()
        conf_dir.mkdir(exist_ok=True)
        os.symlink(victim, link)
        TALLY["symlinks planted"] += 1
        with pytest.raises(RuntimeError, match="is a symlink"):
            install.install_once(o)
        assert list(victim.iterdir()) == []
        return
    plant(link, victim, exists)
    if rel.startswith("BIN/"):  # the lock and the state: refused, never followed
        with pytest.raises((OSError, RuntimeError), match=r"symlink|symbolic link"):
            install.install_once(o)
    else:  # conf files are written by rename: the link is replaced
        install.install_once(o)
        assert_private(link)
    untouched(victim, exists)
    for name in INSTALLER_FILES:
        if (conf_dir / name).exists():
            assert_private(conf_dir / name)


@needs_fake
def test_installer_outputs_are_private(tmp_path: Path) -> None:
    src = fake_layout(tmp_path / "src")
    conf_dir, bin_dir = tmp_path / "net.d", tmp_path / "bin"
    install.install_once(opts(bin_dir, conf_dir, src, *kube_args(tmp_path)))
    for name in INSTALLER_FILES:
        assert_private(conf_dir / name)
    assert_private(bin_dir / ".pycni" / "state.json")
    assert_private(bin_dir / ".pycni" / "lock")


# ---- secrets and CNI_PATH -------------------------------------------------------------------------


def test_secrets_never_logged(lab: FuzzLab, tmp_path: Path) -> None:
    """Secrets in every credential field, calls that fail on purpose, every level: no log line of
    these calls (stderr and log file) carries the marker. The whole session is grepped too."""
    assert SECRET.startswith(SECRET_MARK)
    logfile = tmp_path / "plugin.log"
    ipam = lab.ipam(etcd_password=SECRET, etcd_username=SECRET, log_file=str(logfile), log_level="debug")
    bad = [
        {**ipam, "range": "198.51.100.0/33"},  # code 7
        {**ipam, "kubernetes": {"kubeconfig": "/nonexistent/kubeconfig"}, "datastore": "kubernetes"},
        {**ipam, "etcd_host": "https://[2001:db8::99]:2379", "datastore": "etcd"},
        {**ipam, "etcd_password": {"nested": SECRET}},  # wrong type: the message must not echo it
        ipam,  # succeeds
    ]
    out = b""
    for i, section in enumerate(bad):
        conf = lab.conf("macvlan", ipam=section, logFile=str(logfile), logLevel="debug")
        env = lab.env("ADD", CNI_CONTAINERID=f"sec-secret-{i}")
        for command in ("ADD", "CHECK", "DEL"):
            got = run_process(lab, "macvlan", {**env, "CNI_COMMAND": command}, jsonio.dumps(conf))
            out += got.raw.split(b"\n--stderr--\n", 1)[-1]
    text = out.decode(errors="replace") + logfile.read_text(errors="replace")
    assert text.count("\n") > 20, text  # the calls did log
    assert SECRET_MARK not in text, [line for line in text.splitlines() if SECRET_MARK in line][:3]
    assert lab.leftovers() == []


def test_installer_never_logs_the_token(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    if not FAKE_EXE.exists():
        pytest.skip(f"{FAKE_EXE} (containernetworking-plugins)")
    src = fake_layout(tmp_path / "src")
    conf_dir = tmp_path / "net.d"
    install.install_once(opts(tmp_path / "bin", conf_dir, src, *kube_args(tmp_path)))
    assert (conf_dir / "whereabouts.d" / "pycni-sa-token").read_bytes().startswith(SECRET_MARK.encode())
    captured = capfd.readouterr()
    assert SECRET_MARK not in captured.err + captured.out


def test_relative_cni_path_entries_are_ignored(lab: FuzzLab, tmp_path: Path) -> None:
    """A process whose working directory holds bin/whereabouts: `bin` and `./bin` in CNI_PATH are
    not searched (a relative entry would depend on the runtime's cwd), the absolute one is."""
    rel = tmp_path / "bin"
    rel.mkdir()
    (rel / "whereabouts").write_text(f"#!/bin/sh\nexec {sys.executable} -m cni whereabouts\n")
    (rel / "whereabouts").chmod(0o755)
    conf = jsonio.dumps(lab.conf("macvlan"))
    env = lab.env("ADD", CNI_CONTAINERID="sec-path", CNI_PATH="bin:./bin")
    got = run_process(lab, "macvlan", env, conf, cwd=tmp_path)
    assert got.rc == 1 and got.error()[0] == 7 and "not found in CNI_PATH" in got.error()[1], got.raw
    assert b"CNI_PATH entry 'bin' ignored: not absolute" in got.raw
    assert lab.leftovers() == []
    env["CNI_PATH"] = f"bin:{rel}"
    assert run_process(lab, "macvlan", env, conf, cwd=tmp_path).rc == 0
    assert run_process(lab, "macvlan", {**env, "CNI_COMMAND": "DEL"}, conf, cwd=tmp_path).rc == 0
