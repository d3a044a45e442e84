"""A read-only or full state directory (issue 7, "Faults"): the local store answers code 11 with a
clear message within a bounded time, writes nothing half, and the next call after recovery succeeds.

The directory is a tiny tmpfs this test mounts (and always unmounts): remounted read-only, or filled
to the last block with a file. whereabouts runs as real processes, as a runtime calls it."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam.store.local import LocalStore
from tests.concurrency.harness import Att, base_conf, check, spawn_all
from tests.hardening.conftest import TALLY

pytestmark = pytest.mark.root  # namespaces, links, mounts

LOCAL = lambda db: {"datastore": "local", "local_db": str(db)}  # noqa: E731
BOUND = 60.0  # seconds: far inside the kubelet's 4 min, far above a loaded 2-core machine's need


@contextlib.contextmanager
def tmpfs(where: Path, size: str = "1m") -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "pycni-test", str(where)],
                   check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def remount(where: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(where)], check=True)


def call(att: Att, command: str, conf: dict[str, Any]) -> tuple[int, Any, float]:
    start = time.monotonic()
    [(rc, out, err)] = spawn_all([(att.env(command), conf)])
    took = time.monotonic() - start
    assert "Traceback" not in err, err
    TALLY["state-dir calls (read-only or full)"] += 1
    return rc, out, took


def assert_clear_failure(rc: int, out: Any, took: float, db: Path, why: str) -> None:
    assert rc == 1 and out is not None, out
    assert took < BOUND, f"{took:.1f}s"
    assert out["code"] == 11, out
    assert str(db) in out["msg"] and why in out["msg"].lower(), out  # which store, and why


def consistent(db: Path, conf: dict[str, Any]) -> dict[tuple[str, str, str], list[str]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = LocalStore(str(db))
    try:
        problems, owners = check(store, [conf])
    finally:
        store.close()
    assert not problems, problems
    return owners


def test_read_only_state_dir(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state") as state:
        db = state / "whereabouts.db"
        conf = base_conf("ro", LOCAL(db), tmp_path, range="198.51.100.0/28")
        kept, new = Att("ro-kept", "net1", "ns/kept"), Att("ro-new", "net1", "ns/new")
        assert call(kept, "ADD", conf)[0] == 0
        remount(state, "ro")
        try:
            assert_clear_failure(*call(new, "ADD", conf), db, "read-only")
            assert_clear_failure(*call(kept, "DEL", conf), db, "read-only")  # DEL must not pretend: code 11
        finally:
            remount(state, "rw")
        assert consistent(db, conf) == {("ro", "ro-kept", "net1"): ["198.51.100.1"]}
        rc, out, _ = call(new, "ADD", conf)
        assert rc == 0, out
        assert call(kept, "DEL", conf)[0] == 0 and call(new, "DEL", conf)[0] == 0
        assert consistent(db, conf) == {}


def test_read_only_before_the_store_exists(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "state") as state:
        remount(state, "ro")
        db = state / "sub" / "whereabouts.db"
        conf = base_conf("ro0", LOCAL(db), tmp_path, range="198.51.100.0/28")
        try:
            assert_clear_failure(*call(Att("ro0", "net1", "ns/a"), "ADD", conf), db, "read-only")
        finally:
            remount(state, "rw")
        assert call(Att("ro0", "net1", "ns/a"), "ADD", conf)[0] == 0
        assert call(Att("ro0", "net1", "ns/a"), "DEL", conf)[0] == 0


def fill(state: Path) -> Path:
    filler = state / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    return filler


@pytest.mark.parametrize("when", ["new-store", "busy-store"])
def test_full_state_dir(tmp_path: Path, when: str) -> None:
    # room for 20 concurrent first writers (the WAL grows by their frames until a checkpoint: at 512k a
    # busy store itself once filled the file system, before the filler); the filler fills it anyway
    with tmpfs(tmp_path / "state", size="4m") as state:
        db = state / "whereabouts.db"
        conf = base_conf("full", LOCAL(db), tmp_path, range="198.18.8.0/22")
        atts = [Att(f"full-{i:03d}", "net1", f"ns/p{i}") for i in range(40)]
        if when == "busy-store":
            results = spawn_all((a.env("ADD"), conf) for a in atts[:20])
            assert all(rc == 0 for rc, _, _ in results), [r for r in results if r[0] != 0][:3]
        filler = fill(state)
        failed = 0
        for att in atts[20:39]:  # a store whose file cannot grow: every failure must be a clean one
            rc, out, took = call(att, "ADD", conf)
            print(f"full ({when}): ADD {att.cid}: rc {rc} in {took:.2f}s: {out and out.get('msg')}")
            if rc != 0:
                failed += 1
                assert_clear_failure(rc, out, took, db, "file system is full")
                if failed == 3:  # pages free inside the file may let a few more in first
                    break
        assert failed, "the full file system never made an ADD fail"
        filler.unlink()
        before = consistent(db, conf) if db.exists() else {}  # nothing half-written
        assert all(k[1] in {a.cid for a in atts} for k in before), before
        rc, out, _ = call(atts[-1], "ADD", conf)
        assert rc == 0, out
        for att in atts:
            assert call(att, "DEL", conf)[0] == 0
        assert consistent(db, conf) == {}


@pytest.mark.parametrize("plugin", ["host-device", "sriov"])
def test_read_only_device_state_dir(tmp_path: Path, plugin: str) -> None:
    """The device plugins' state dir read-only: a clear error before anything is moved or allocated,
    and the next ADD after recovery works."""
    from tests.hardening.fuzzlab import FuzzLab, run_process

    lab = FuzzLab(tmp_path / "lab")
    try:
        with tmpfs(tmp_path / "devstate") as state:
            conf = lab.conf(plugin, stateDir=str(state))
            env = lab.env("ADD", CNI_CONTAINERID="ro-dev")
            stdin = jsonio.dumps(conf)
            remount(state, "ro")
            try:
                start = time.monotonic()
                got = run_process(lab, plugin, env, stdin)
                TALLY["state-dir calls (read-only or full)"] += 1
                assert time.monotonic() - start < BOUND
                assert got.rc == 1 and got.out["code"] == 5 and str(state) in got.out["msg"], got.raw
                assert "read-only" in got.out["msg"].lower(), got.raw
                assert lab.leftovers() == []
            finally:
                remount(state, "rw")
            assert run_process(lab, plugin, env, stdin).rc == 0
            assert run_process(lab, plugin, {**env, "CNI_COMMAND": "DEL"}, stdin).rc == 0
            assert lab.leftovers() == []
    finally:
        lab.close()
