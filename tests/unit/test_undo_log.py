"""cni.undo (explicit rollback) and cni.log (stderr or a 0600 log file, never stdout; redact)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cni import log
from cni.errors import CniError, ConfigError
from cni.undo import Undo

# ---- undo ---------------------------------------------------------------------------------------


def test_steps_run_newest_first_on_error() -> None:
    done: list[str] = []
    with pytest.raises(ConfigError), Undo() as undo:
        undo.push("a", done.append, "a")
        undo.push("b", done.append, "b")
        undo.push("c", done.append, "c")
        raise ConfigError("x: bad")
    assert done == ["c", "b", "a"]


def test_commit_keeps_everything() -> None:
    done: list[str] = []
    with Undo() as undo:
        undo.push("a", done.append, "a")
        undo.commit()
    assert done == []
    with pytest.raises(RuntimeError), Undo() as undo:  # committed steps do not come back
        undo.push("a", done.append, "a")
        undo.commit()
        raise RuntimeError("late")
    assert done == []


def test_after_commit_new_steps_still_undo() -> None:
    done: list[str] = []
    with pytest.raises(RuntimeError), Undo() as undo:
        undo.push("a", done.append, "a")
        undo.commit()
        undo.push("b", done.append, "b")
        raise RuntimeError("late")
    assert done == ["b"]


def test_every_step_runs_even_if_one_fails(capfd: pytest.CaptureFixture[str]) -> None:
    done: list[str] = []

    def fail(what: str) -> None:
        raise OSError(16, f"{what} busy")

    with pytest.raises(CniError) as e, Undo() as undo:
        undo.push("release allocation", done.append, "ipam")
        undo.push("delete link net1", fail, "link")
        undo.push("restore name", done.append, "name")
        undo.push("delete route", fail, "route")
        raise CniError("add address: File exists", "first detail", code=103)
    assert done == ["name", "ipam"]
    err = e.value
    assert err.code == 103 and err.msg == "add address: File exists"
    assert err.details.startswith("first detail; rollback incomplete: ")
    assert "delete route: [Errno 16] route busy" in err.details
    assert "delete link net1: [Errno 16] link busy" in err.details
    assert err.details.index("delete route") < err.details.index("delete link")
    assert "rollback: delete link net1 failed" in capfd.readouterr().err


def test_details_set_when_empty() -> None:
    with pytest.raises(CniError) as e, Undo() as undo:
        undo.push("x", lambda: 1 / 0)
        raise CniError("boom")
    assert e.value.details == "rollback incomplete: x: division by zero"


def test_non_cni_error_propagates_unchanged() -> None:
    done: list[int] = []
    with pytest.raises(KeyError) as e, Undo() as undo:
        undo.push("ok", done.append, 1)
        undo.push("bad", lambda: 1 / 0)
        raise KeyError("k")
    assert done == [1]
    assert e.value.args == ("k",)


def test_no_error_no_rollback() -> None:
    done: list[int] = []
    with Undo() as undo:
        undo.push("a", done.append, 1)
    assert done == []


# ---- log ----------------------------------------------------------------------------------------


def test_default_level_is_warning(capfd: pytest.CaptureFixture[str]) -> None:
    log.debug("dbg")
    log.info("inf")
    log.warning("warn %d", 1)
    log.error("err %s", "x")
    cap = capfd.readouterr()
    assert cap.out == ""
    assert "dbg" not in cap.err and "inf" not in cap.err
    assert "warning: warn 1" in cap.err and "error: err x" in cap.err


def test_levels_and_tag(capfd: pytest.CaptureFixture[str]) -> None:
    log.configure("DEBUG", tag="macvlan")
    log.debug("now visible")
    err = capfd.readouterr().err
    assert "macvlan[" in err and "debug: now visible" in err


def test_unknown_level_keeps_current_and_says_so(capfd: pytest.CaptureFixture[str]) -> None:
    log.configure("info")
    log.configure("chatty")
    log.info("still info")
    log.debug("hidden")
    err = capfd.readouterr().err
    assert "unknown log level 'chatty' ignored" in err
    assert "still info" in err and "hidden" not in err


def test_bad_format_arguments_do_not_raise(capfd: pytest.CaptureFixture[str]) -> None:
    log.error("100% of %s", "x", "y")
    log.error("%d", "not a number")
    err = capfd.readouterr().err
    assert "100% of %s" in err and "not a number" in err


def test_log_file_created_0600_and_stderr_kept(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "macvlan.log"
    old = os.umask(0)
    try:
        log.configure("info", str(path))
    finally:
        os.umask(old)
    log.info("to both")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "to both" in path.read_text()
    cap = capfd.readouterr()
    assert "to both" in cap.err and cap.out == ""


def test_log_file_appends(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    path.write_text("earlier line\n")
    log.configure("info", str(path))
    log.info("later line")
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier line" and lines[1].endswith("info: later line")


def test_configuring_the_same_file_twice_logs_each_line_once(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    log.configure("info", str(path))
    log.configure("info", str(path))  # e.g. a rollback DEL calling setup_logging again
    log.info("once")
    assert path.read_text().count("once") == 1


def test_log_file_symlink_not_followed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "target"
    target.write_text("")
    link = tmp_path / "link.log"
    link.symlink_to(target)
    log.configure("info", str(link))
    log.info("secret-ish line")
    assert target.read_text() == ""
    err = capfd.readouterr().err
    assert "cannot open log file" in err and "secret-ish line" in err


def test_log_file_unwritable_falls_back_to_stderr(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log.configure("info", str(tmp_path / "missing-dir" / "x.log"))
    log.info("still logged")
    err = capfd.readouterr().err
    assert "cannot open log file" in err and "still logged" in err


def test_undecodable_text_is_written(capfd: pytest.CaptureFixture[str]) -> None:
    log.error("ifname %s", "eth\udcff")
    assert "ifname eth" in capfd.readouterr().err


def test_redact() -> None:
    obj = {
        "name": "n",
        "ipam": {
            "type": "whereabouts",
            "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.kubeconfig"},
            "etcd_password": "hunter2",
            "etcd_key_file": "/etc/pki/client.key",
            "Token": "abc",
            "list": [{"secret": "s"}, {"plain": "p"}],
            "clientCredentials": {"user": "u"},
        },
    }
    out = log.redact(obj)
    ipam = out["ipam"]
    assert ipam["etcd_password"] == ipam["etcd_key_file"] == ipam["Token"] == "***"
    assert ipam["list"] == [{"secret": "***"}, {"plain": "p"}]
    assert ipam["clientCredentials"] == "***"
    assert ipam["kubernetes"] == {"kubeconfig": "/etc/cni/net.d/whereabouts.kubeconfig"}
    assert out["name"] == "n"
    assert obj["ipam"]["etcd_password"] == "hunter2"  # a copy; the original is untouched
