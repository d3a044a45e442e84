"""cni.delegate: finding the IPAM in CNI_PATH and running it (fake IPAM scripts in a tmp dir)."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from cni import delegate, jsonio, log
from cni.errors import CniError, ConfigError, DecodeError
from cni.registry import IN_PROCESS_IPAM
from cni.types.netconf import Request
from cni.types.result import Result, parse, to_wire
from cni.types.valueclass import replace
from tests.unit import models

RESULT_020 = {
    "cniVersion": "0.2.0",
    "ip4": {"ip": "198.51.100.7/24", "gateway": "198.51.100.1", "routes": [{"dst": "0.0.0.0/0"}]},
}


def script(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def ipam_printing(directory: Path, obj: Any, rc: int = 0, name: str = "fakeipam", stderr: str = "") -> Path:
    """An IPAM that records its stdin and environment per command and prints `obj`."""
    out = obj if isinstance(obj, str) else jsonio.dumps(obj).decode()
    body = (
        f'cat > "{directory}/stdin.$CNI_COMMAND"\n'
        f'env > "{directory}/env.$CNI_COMMAND"\n'
        f"printf '%s' '{out}'\n" + (f"printf '%s' '{stderr}' >&2\n" if stderr else "") + f"exit {rc}\n"
    )
    return script(directory, name, body)


def request(path: tuple[str, ...], ipam_type: str = "fakeipam", version: str = "1.0.0") -> Request:
    conf = {"cniVersion": version, "name": "n", "type": "macvlan", "ipam": {"type": ipam_type, "x": 1}}
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_IFNAME": "net1",
        "CNI_NETNS": "/run/netns/x",
        "CNI_PATH": ":".join(path),
        "CNI_ARGS": "K8S_POD_NAME=p",
        "PATH": os.environ.get("PATH", ""),
    }
    return Request("ADD", version, conf, jsonio.dumps(conf), "c1", "/run/netns/x", "net1", path=path, env=env)


# ---- find ---------------------------------------------------------------------------------------


def test_find_first_absolute_match(tmp_path: Path) -> None:
    a = script(tmp_path / "a", "host-local", "exit 0\n")
    script(tmp_path / "b", "host-local", "exit 0\n")
    assert delegate.find("host-local", (str(tmp_path / "a"), str(tmp_path / "b"))) == str(a)


def test_find_ignores_relative_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script(tmp_path / "rel", "host-local", "exit 0\n")
    good = script(tmp_path / "abs", "host-local", "exit 0\n")
    monkeypatch.chdir(tmp_path)
    assert delegate.find("host-local", ("rel", "./rel", str(tmp_path / "abs"))) == str(good)
    with pytest.raises(ConfigError):
        delegate.find("host-local", ("rel",))


def test_find_skips_non_executables_and_directories(tmp_path: Path) -> None:
    script(tmp_path / "a", "host-local", "exit 0\n", mode=0o644)
    (tmp_path / "b" / "host-local").mkdir(parents=True)
    good = script(tmp_path / "c", "host-local", "exit 0\n")
    dirs = tuple(str(tmp_path / d) for d in "abc")
    assert delegate.find("host-local", dirs) == str(good)


@pytest.mark.parametrize("kind", ["../bin/host-local", "/usr/lib/cni/host-local", "a/b", ".", "..", ""])
def test_find_rejects_paths_in_type(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ConfigError) as e:
        delegate.find(kind, (str(tmp_path),))
    assert e.value.msg.startswith("ipam.type: invalid plugin name")
    assert e.value.code == 7


def test_find_not_found_names_ipam_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        delegate.find("whereabouts", (str(tmp_path), "/nonexistent"))
    assert e.value.code == 7
    assert e.value.msg.startswith('ipam.type: plugin "whereabouts" not found in CNI_PATH')
    assert str(tmp_path) in e.value.msg


# ---- exec ---------------------------------------------------------------------------------------


def test_add_parses_result_in_its_own_version(tmp_path: Path) -> None:
    ipam_printing(tmp_path, RESULT_020)
    req = request((str(tmp_path),), version="1.0.0")
    assert delegate.add(req) == models.ipam_only()
    assert (tmp_path / "stdin.ADD").read_bytes() == req.stdin  # the full config, byte for byte
    env = dict(line.split("=", 1) for line in (tmp_path / "env.ADD").read_text().splitlines() if "=" in line)
    for key in ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_NETNS", "CNI_PATH", "CNI_ARGS"):
        assert env[key] == req.env[key]


@pytest.mark.parametrize("command", ["DEL", "CHECK", "STATUS", "GC"])
def test_other_commands_set_cni_command(tmp_path: Path, command: str) -> None:
    ipam_printing(tmp_path, "")
    req = request((str(tmp_path),))
    getattr(delegate, {"DEL": "delete"}.get(command, command.lower()))(req)
    env = (tmp_path / f"env.{command}").read_text()
    assert f"CNI_COMMAND={command}\n" in env
    assert req.env["CNI_COMMAND"] == "ADD"  # the caller's environment is not changed


def test_error_object_passes_through(tmp_path: Path) -> None:
    ipam_printing(
        tmp_path, {"cniVersion": "1.0.0", "code": 11, "msg": "store down", "details": "etcd timeout"}, rc=1
    )
    with pytest.raises(CniError) as e:
        delegate.add(request((str(tmp_path),)))
    assert (e.value.code, e.value.msg, e.value.details) == (11, "fakeipam: store down", "etcd timeout")


def test_error_object_of_our_range_passes_through(tmp_path: Path) -> None:
    ipam_printing(tmp_path, {"code": 100, "msg": "no free address in 198.51.100.0/24"}, rc=1)
    with pytest.raises(CniError) as e:
        delegate.delete(request((str(tmp_path),)))
    assert e.value.code == 100 and "198.51.100.0/24" in e.value.msg and e.value.details == ""


@pytest.mark.parametrize("stdout", ["", "\n", "  \n"])
def test_empty_stdout_uses_stderr(tmp_path: Path, stdout: str, capfd: pytest.CaptureFixture[str]) -> None:
    ipam_printing(tmp_path, stdout, rc=2, stderr="cannot open lock file /var/lib/cni/x")
    with pytest.raises(CniError) as e:
        delegate.add(request((str(tmp_path),)))
    assert e.value.code == 999
    assert "cannot open lock file /var/lib/cni/x" in e.value.msg
    assert "cannot open lock file" in capfd.readouterr().err  # its stderr reaches ours


def test_non_json_stdout_is_reported(tmp_path: Path) -> None:
    ipam_printing(tmp_path, "panic: runtime error", rc=2)
    with pytest.raises(CniError) as e:
        delegate.add(request((str(tmp_path),)))
    assert "fakeipam failed: panic: runtime error" in e.value.msg


def test_no_output_at_all(tmp_path: Path) -> None:
    ipam_printing(tmp_path, "", rc=3)
    with pytest.raises(CniError, match="fakeipam failed: no output"):
        delegate.add(request((str(tmp_path),)))


def test_invalid_result_is_code_6_naming_the_field(tmp_path: Path) -> None:
    ipam_printing(tmp_path, {"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.7"}]})
    with pytest.raises(DecodeError) as e:
        delegate.add(request((str(tmp_path),)))
    assert "fakeipam" in e.value.msg and "ips[0].address" in e.value.msg


def test_malformed_result_is_code_6(tmp_path: Path) -> None:
    ipam_printing(tmp_path, "{not json")
    with pytest.raises(DecodeError) as e:
        delegate.add(request((str(tmp_path),)))
    assert "(9 bytes of output: b'{not json')" in e.value.details  # what it printed, in short


def test_success_without_a_result_says_there_was_no_output(tmp_path: Path) -> None:
    ipam_printing(tmp_path, "")  # exit 0, nothing on stdout: a broken IPAM, not a malformed result
    with pytest.raises(DecodeError) as e:
        delegate.add(request((str(tmp_path),)))
    assert e.value.code == 6 and e.value.details.endswith("(0 bytes of output)")


def test_result_without_ips_is_rejected(tmp_path: Path) -> None:
    ipam_printing(tmp_path, {"cniVersion": "1.0.0"})
    result = delegate.add(request((str(tmp_path),)))
    with pytest.raises(CniError) as e:
        delegate.require_ips(result, "fakeipam")
    assert e.value.code == 7 and "no IP addresses" in e.value.msg


def test_exec_failure_other_than_etxtbsy(tmp_path: Path) -> None:
    (tmp_path / "fakeipam").write_bytes(b"\x7fELF garbage")
    (tmp_path / "fakeipam").chmod(0o755)
    with pytest.raises(CniError) as e:
        delegate.add(request((str(tmp_path),)))
    assert "exec" in e.value.msg and str(tmp_path) in e.value.msg


def test_etxtbsy_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real 'text file busy': the IPAM binary is still open for writing (an installer copying it);
    the writer finishes during our first back-off."""
    path = ipam_printing(tmp_path, RESULT_020)
    fd = os.open(path, os.O_WRONLY)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            os.close(fd)

    monkeypatch.setattr(delegate.time, "sleep", sleep)
    try:
        assert delegate.add(request((str(tmp_path),))) == models.ipam_only()
    finally:
        if len(sleeps) < 2:
            os.close(fd)
    assert len(sleeps) == 2


def test_etxtbsy_gives_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ipam_printing(tmp_path, RESULT_020)
    monkeypatch.setattr(delegate.time, "sleep", lambda s: None)
    fd = os.open(path, os.O_WRONLY)
    try:
        with pytest.raises(CniError) as e:
            delegate.add(request((str(tmp_path),)))
    finally:
        os.close(fd)
    assert "Text file busy" in e.value.msg


# ---- in-process (our own IPAM inside the frozen bundle) -----------------------------------------


def in_process_ipam(
    monkeypatch: pytest.MonkeyPatch, module: str, registered: str, result: Result | None = None,
    delete: bool = False,
) -> list[Request]:  # fmt: skip
    """A stand-in IPAM module `module` registered for in-process use under `registered`: the requests
    its `add` (returning `result`, else models.ipam_only()) and, with `delete`, its `delete` saw."""
    calls: list[Request] = []

    def add(req: Request) -> Any:
        calls.append(req)
        return result or models.ipam_only()

    mod = types.ModuleType(module)
    mod.add = add  # type: ignore[attr-defined]
    if delete:
        mod.delete = calls.append  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(IN_PROCESS_IPAM, registered, mod.__name__)
    return calls


def test_in_process_when_the_binary_is_this_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = script(tmp_path, "ouripam", "echo should-not-run; exit 1\n")
    calls = in_process_ipam(monkeypatch, "tests.unit.ouripam", "ouripam")
    token = delegate.CALLER_BUNDLE.set(str(binary))  # what a frozen process (or the agent) sets
    try:
        req = request((str(tmp_path),), ipam_type="ouripam", version="0.4.0")
        assert delegate.add(req) == models.ipam_only()
        assert [c.command for c in calls] == ["ADD"]
        assert delegate.call(req, "DEL") is None  # no delete function: success, as in skel
    finally:
        delegate.CALLER_BUNDLE.reset(token)


def test_in_process_under_the_installers_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pycni-install --prefix pycni-` installs the IPAM as `pycni-whereabouts`: still this bundle."""
    binary = script(tmp_path, "pycni-whereabouts", "echo should-not-run; exit 1\n")
    calls = in_process_ipam(monkeypatch, "tests.unit.prefixedipam", "whereabouts")
    token = delegate.CALLER_BUNDLE.set(str(binary))
    try:
        req = request((str(tmp_path),), ipam_type="pycni-whereabouts", version="0.4.0")
        assert delegate.add(req) == models.ipam_only()
        assert [c.command for c in calls] == ["ADD"]
    finally:
        delegate.CALLER_BUNDLE.reset(token)
    other = ipam_printing(tmp_path / "other", RESULT_020, name="pycni-bogus")  # no registry name: executed
    token = delegate.CALLER_BUNDLE.set(str(other))
    try:
        req = request((str(tmp_path / "other"),), ipam_type="pycni-bogus")
        assert delegate.add(req) == models.ipam_only()
        assert (tmp_path / "other" / "stdin.ADD").exists()
    finally:
        delegate.CALLER_BUNDLE.reset(token)


def test_not_in_process_when_not_frozen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = ipam_printing(tmp_path, RESULT_020, name="ouripam")
    monkeypatch.setitem(IN_PROCESS_IPAM, "ouripam", "tests.unit.nonexistent")
    monkeypatch.setattr(sys, "executable", str(binary))
    assert delegate.add(request((str(tmp_path),), ipam_type="ouripam")) == models.ipam_only()
    assert (tmp_path / "stdin.ADD").exists()  # it was executed


@pytest.mark.parametrize("version", ["0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_an_in_process_result_is_handed_over_as_the_version_carries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    """The IPAM's Result object itself (1.1.0), or what a process printing it in the request's version
    would have given (the fields and addresses the version lacks dropped), never printed and parsed."""
    binary = script(tmp_path, "ouripam", "echo should-not-run; exit 1\n")
    got = models.full()
    in_process_ipam(monkeypatch, "tests.unit.fullipam", "ouripam", result=got)
    monkeypatch.setattr(jsonio, "loads", None)  # nothing is parsed on the way
    token = delegate.CALLER_BUNDLE.set(str(binary))
    try:
        handed = delegate.add(request((str(tmp_path),), ipam_type="ouripam", version=version))
    finally:
        delegate.CALLER_BUNDLE.reset(token)
    monkeypatch.undo()
    assert handed == parse(to_wire(got, version), version)
    assert (handed is got) == (version == "1.1.0")


def test_an_in_process_result_the_version_cannot_carry_is_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cniVersion 0.2.0 cannot carry a result without addresses: the ADD is undone (the IPAM's DEL) and
    the error is the one printing it would raise, as when the IPAM runs as a process (cni.skel)."""
    binary = script(tmp_path, "ouripam", "echo should-not-run; exit 1\n")
    calls = in_process_ipam(monkeypatch, "tests.unit.noipam", "ouripam", result=models.l2(), delete=True)
    token = delegate.CALLER_BUNDLE.set(str(binary))
    try:
        with pytest.raises(ConfigError, match="cannot express a result without IP addresses"):
            delegate.add(request((str(tmp_path),), ipam_type="ouripam", version="0.2.0"))
    finally:
        delegate.CALLER_BUNDLE.reset(token)
    assert [c.command for c in calls] == ["ADD", "DEL"]


def test_the_in_process_ipams_log_settings_and_the_plugins_stay_apart(tmp_path: Path) -> None:
    """whereabouts run in process with log_level/log_file in its ipam section: its lines go to its
    file, at its level; the plugin's level and file are the same after it as before, and neither its
    level nor its file applied to the IPAM (as when the IPAM is a process of its own)."""
    binary = script(tmp_path, "whereabouts", "echo should-not-run; exit 1\n")
    plugin_log, ipam_log = tmp_path / "macvlan.log", tmp_path / "whereabouts.log"
    log.configure("debug", str(plugin_log), "macvlan")
    before = log._STATE.get()
    req = request((str(tmp_path),), ipam_type="whereabouts")
    section = {"type": "whereabouts", "range": "198.51.100.0/24", "datastore": "local",
               "local_db": str(tmp_path / "ipam.db"), "log_file": str(ipam_log), "log_level": "info"}
    req = replace(req, conf={**req.conf, "ipam": section}, env={**req.env, "NODENAME": "node1"})
    fds = len(os.listdir("/proc/self/fd"))
    token = delegate.CALLER_BUNDLE.set(str(binary))
    try:
        assert [str(ip.address) for ip in delegate.add(req).ips] == ["198.51.100.1/24"]
        section["log_level"] = "error"
        delegate.delete(req)
    finally:
        delegate.CALLER_BUNDLE.reset(token)
    assert log._STATE.get() is before  # the plugin's level, file and tag as they were
    assert len(os.listdir("/proc/self/fd")) == fds  # the IPAM's log file closed after each call
    log.debug("the plugin's own line")
    ipam_lines = ipam_log.read_text().splitlines()
    assert len(ipam_lines) == 1 and " whereabouts[" in ipam_lines[0] and "ADD c1 net1" in ipam_lines[0]
    plugin_lines = plugin_log.read_text()
    assert "the plugin's own line" in plugin_lines and "whereabouts" not in plugin_lines
