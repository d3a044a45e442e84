"""pycni's installer beside another installer writing the same names into the CNI bin dir (the NVIDIA
Network Operator's cni-plugins DaemonSet copies macvlan, host-device, ... into /opt/cni/bin; the SR-IOV
operator copies sriov): the rule of bundler/binaries.py `settle_foreign`, docs/network-operator.md.

The other installer is a thread running a loop that writes its own files at its names (temp file and
rename, as an installer does), counting what it finds there before each write: a pycni symlink means
pycni overwrote its file. The rounds are in lockstep with pycni's installer passes (`install_once`, the
body of the installer's loop) through explicit hand-offs, then both run freely for a number of rounds
each: the assertions hold for any interleaving (no count of race outcomes, no sleeps). Last, the
installer's real loop in its own process (serve(), as the DaemonSet runs it): each round of the other
installer waits for the installer's log to report a whole pass begun after the write."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bundler import binaries, install, state
from bundler.cli import parse
from tests.bundle_layouts import FAKE_EXE, fake_layout, opts, snapshot
from tests.logtee import PYTHONPATH

pytestmark = pytest.mark.skipif(not FAKE_EXE.exists(), reason=f"{FAKE_EXE} (containernetworking-plugins)")

OPERATOR_NAMES = ("macvlan", "host-device", "sriov", "bridge", "static")  # its plugins, and sriov-cni
ROUNDS = 12
HANDOFF_TIMEOUT = 60.0  # a hang guard for the hand-offs, not a synchronisation


class OtherInstaller(threading.Thread):
    """Writes `names` every round; before each write it notes whether pycni replaced its file."""

    def __init__(self, bin_dir: Path, names: tuple[str, ...], rounds: int, lockstep: bool) -> None:
        super().__init__(daemon=True)
        self.bin_dir, self.names, self.rounds, self.lockstep = bin_dir, names, rounds, lockstep
        self.overwritten: list[tuple[int, str]] = []  # (round, name) found as pycni's symlink
        self.first = threading.Event()  # its first round is written
        self.wrote = threading.Event()  # lockstep: a round is written
        self.go = threading.Event()  # lockstep: pycni's pass after it is done
        self.error: BaseException | None = None

    def content(self, name: str, n: int) -> bytes:
        return f"#!/bin/sh\n# the operator's {name}, round {n}\n".encode()

    def write_round(self, n: int) -> None:
        for name in self.names:
            target = self.bin_dir / name
            if binaries.is_ours(target):
                self.overwritten.append((n, name))
            tmp = self.bin_dir / f".{name}.other-installer"
            tmp.write_bytes(self.content(name, n))
            tmp.chmod(0o755)
            os.replace(tmp, target)

    def run(self) -> None:
        try:
            for n in range(self.rounds):
                self.write_round(n)
                self.first.set()
                if self.lockstep:
                    self.wrote.set()
                    if not self.go.wait(HANDOFF_TIMEOUT):
                        raise TimeoutError("pycni's pass never handed back")
                    self.go.clear()
        except BaseException as e:  # reported by the test
            self.error = e
            self.first.set()
            self.wrote.set()

    def next_round(self) -> None:
        """Lockstep: wait until the other installer has written its round."""
        assert self.wrote.wait(HANDOFF_TIMEOUT), "the other installer never wrote its round"
        self.wrote.clear()
        assert self.error is None, self.error

    def finish(self) -> None:
        self.join(HANDOFF_TIMEOUT)
        assert not self.is_alive() and self.error is None, self.error


def last_round_intact(other: OtherInstaller) -> None:
    for name in other.names:
        target = other.bin_dir / name
        assert not target.is_symlink() and target.read_bytes() == other.content(name, other.rounds - 1), name


def run_against(other: OtherInstaller, passes: int, *args: str) -> None:
    """pycni's installer loop against the other installer: lockstep rounds, or free-running."""
    src = other.bin_dir.parent / "src"
    o = opts(other.bin_dir, other.bin_dir.parent / "conf", src, *args)
    other.start()
    if other.lockstep:
        for _ in range(other.rounds):
            other.next_round()
            install.install_once(o, full=False)
            other.go.set()
    else:
        assert other.first.wait(HANDOFF_TIMEOUT), "the other installer never wrote"  # it came first
        for _ in range(passes):
            install.install_once(o, full=False)
    other.finish()
    install.install_once(o)  # one more pass after its last round


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    fake_layout(tmp_path / "src", "0.0.1")
    d = tmp_path / "opt-cni-bin"
    d.mkdir()
    return d


@pytest.mark.parametrize("lockstep", [True, False], ids=["lockstep", "free-running"])
def test_a_foreign_file_is_left_alone_and_reported(bin_dir: Path, lockstep: bool,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    other = OtherInstaller(bin_dir, OPERATOR_NAMES, ROUNDS, lockstep)
    run_against(other, ROUNDS)
    assert other.overwritten == [], "pycni overwrote the other installer's file"
    last_round_intact(other)
    st = state.load(bin_dir)
    shared = {"macvlan", "host-device", "sriov"}  # the names both install (bridge, static are not pycni's)
    assert set(st.yielded) == shared and not shared & set(st.entries) and st.displaced == []
    assert all(st.yielded[n].startswith("file of ") for n in shared), st.yielded
    assert binaries.is_ours(bin_dir / "whereabouts"), "the names nobody else writes are installed"
    err = capfd.readouterr().err
    for name in shared:  # said once, when it was found, naming the file and what to do
        lines = [line for line in err.splitlines() if f"{bin_dir / name} is not pycni's" in line]
        assert len(lines) == 1, err
        assert "--prefix" in lines[0] and f"--reclaim {name}" in lines[0] and "--take-over" in lines[0]


def test_take_over_replaces_once_and_never_flip_flops(bin_dir: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    """--take-over (the shipped DaemonSet's): the file found at the first install is kept and replaced;
    the other installer writing the name again is left alone from then on."""
    other = OtherInstaller(bin_dir, OPERATOR_NAMES, ROUNDS, lockstep=True)
    run_against(other, ROUNDS, "--take-over")
    shared = {"macvlan", "host-device", "sriov"}
    assert sorted(other.overwritten) == sorted((1, n) for n in shared), "exactly one take-over each"
    last_round_intact(other)
    st = state.load(bin_dir)
    assert set(st.yielded) == shared and not shared & set(st.entries)
    assert all("after pycni had installed it" in line for line in capfd.readouterr().err.splitlines()
               if "is not pycni's" in line)
    kept = bin_dir / state.HOME / state.DISPLACED / "macvlan"
    assert kept.read_bytes() == other.content("macvlan", 0), "the file taken over is kept"


def test_prefix_keeps_both_sets_intact(bin_dir: Path) -> None:
    other = OtherInstaller(bin_dir, OPERATOR_NAMES, ROUNDS, lockstep=True)
    run_against(other, ROUNDS, "--prefix", "pycni-", "--take-over")
    assert other.overwritten == []
    last_round_intact(other)
    st = state.load(bin_dir)
    assert st.yielded == {} and st.displaced == []
    for name in ("pycni-macvlan", "pycni-host-device", "pycni-sriov", "pycni-whereabouts"):
        assert binaries.is_ours(bin_dir / name), name
    assert sorted(st.entries) == ["pycni-host-device", "pycni-macvlan", "pycni-sriov", "pycni-whereabouts"]


def test_reclaim_takes_a_yielded_name_back_and_uninstall_puts_its_file_back(
        bin_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    other = OtherInstaller(bin_dir, ("macvlan",), 3, lockstep=True)
    run_against(other, 3)
    assert set(state.load(bin_dir).yielded) == {"macvlan"}
    o = opts(bin_dir, tmp_path / "conf", tmp_path / "src", "--once")
    capfd.readouterr()
    install.install_once(o)  # a restarted installer (serve() and --once remind at their first pass)
    install.remind(o)
    err = capfd.readouterr().err
    assert err.count("is not pycni's") == 0, "yielded once: not reported as new again"
    assert f"{bin_dir / 'macvlan'} is left to another installer" in err, err
    assert not binaries.is_ours(bin_dir / "macvlan")
    before = snapshot(bin_dir)["macvlan"]
    install.install_once(opts(bin_dir, tmp_path / "conf", tmp_path / "src", "--once", "--reclaim", "macvlan"))
    assert binaries.is_ours(bin_dir / "macvlan") and state.load(bin_dir).yielded == {}
    install.uninstall(o)
    assert snapshot(bin_dir) == {"macvlan": before}, "the other installer's file is back, nothing else left"


def test_reclaim_is_only_for_a_single_run() -> None:
    with pytest.raises(SystemExit):
        parse(["--cni-bin-dir", "/b", "--cni-conf-dir", "/c", "--reclaim", "macvlan"])
    with pytest.raises(SystemExit):
        parse(["--cni-bin-dir", "/b", "--cni-conf-dir", "/c", "--once", "--reclaim", "../macvlan"])


def passes_done(log: Path) -> int:
    """How many passes the running installer has finished (its `install pass N done` lines)."""
    found = re.findall(r"install pass (\d+) done", log.read_text(errors="replace")) if log.exists() else []
    return int(found[-1]) + 1 if found else 0


def wait_for(what: str, ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the installer reports `what` (its log, its ready file); a hang guard, not a synchronisation."""
    end = time.monotonic() + HANDOFF_TIMEOUT
    while not ready():
        assert proc.poll() is None, f"the installer exited waiting for {what}:\n{log.read_text()}"
        assert time.monotonic() < end, f"no {what} from the installer:\n{log.read_text()}"
        time.sleep(0.02)


def test_the_running_installer_never_writes_back_what_another_installer_wrote(tmp_path: Path) -> None:
    """The installer's own loop (`python -m bundler.install`, serve()), shipped options (--take-over),
    installs first; then the other installer writes its names round after round, each round waiting
    until the running installer has completed a whole pass begun after the write (its log says so)."""
    src = fake_layout(tmp_path / "src", "0.0.1")
    bin_dir, conf_dir, log, ready = (tmp_path / "opt-cni-bin", tmp_path / "conf", tmp_path / "installer.log",
                                     tmp_path / "ready")
    cmd = [sys.executable, "-m", "bundler.install", "--cni-bin-dir", str(bin_dir), "--cni-conf-dir",
           str(conf_dir), "--source", str(src), "--node-name", "node-a", "--ipam-datastore", "local",
           "--take-over", "--interval", "0.05", "--ready-file", str(ready), "--log-level", "debug"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env={**os.environ, "PYTHONPATH": PYTHONPATH})
    try:
        wait_for("the ready file", ready.exists, proc, log)
        assert all(binaries.is_ours(bin_dir / n) for n in ("macvlan", "host-device", "sriov"))
        other = OtherInstaller(bin_dir, OPERATOR_NAMES, ROUNDS, lockstep=False)
        for n in range(ROUNDS):
            seen = passes_done(log)
            other.write_round(n)
            wait_for(f"pass {seen + 2}", lambda s=seen: passes_done(log) >= s + 2, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(HANDOFF_TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shared = {"macvlan", "host-device", "sriov"}
    # pycni's entries were there at its first round (pycni came first); never again after
    assert sorted(other.overwritten) == sorted((0, n) for n in shared), other.overwritten
    last_round_intact(other)
    st = state.load(bin_dir)
    assert set(st.yielded) == shared and binaries.is_ours(bin_dir / "whereabouts")
    text = log.read_text()
    for name in shared:
        assert text.count(f"{bin_dir / name} is not pycni's") == 1, text
    assert not ready.exists(), "SIGTERM removes the ready file"
