"""stdin decoding (code 6), config validation (code 7), the about text, the error object, code 999,
and the rollback when a result cannot be printed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any

import pytest

from cni import skel
from cni.errors import CniError, ConfigError, TryAgainError
from tests.unit import models
from tests.unit.helpers import FAKE, FakePlugin, conf, env_for, run

MALFORMED = [
    b"",
    b"   \n\t",
    b"{",
    b'{"name": "n",}',
    b"{'name': 'n'}",
    b'{"name": "n"} trailing',
    b'{"name": NaN}',
    b'{"name": "\xff\xfe"}',  # invalid UTF-8
    b"\xef\xbb\xbf\xff",
    b'{"name": "\\ud800"}',  # a lone surrogate escape
    b'{"a":' * 5000 + b"1" + b"}" * 5000,  # deeply nested
    b"[" * 100000,
]


@pytest.mark.parametrize("stdin", MALFORMED, ids=range(len(MALFORMED)))
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK", "GC", "STATUS"])
def test_malformed_json_is_code_6(plugin: FakePlugin, command: str, stdin: bytes) -> None:
    out = run(env_for(command), stdin)
    assert out.rc == 1
    assert out.obj["code"] == 6
    assert out.obj["cniVersion"] == "1.1.0"
    assert plugin.calls == []


@pytest.mark.parametrize("stdin", [b"[]", b'"conf"', b"1", b"null", b"true", b'[{"name": "n"}]'])
def test_non_object_is_code_6(plugin: FakePlugin, stdin: bytes) -> None:
    out = run(env_for("ADD"), stdin)
    assert out.obj["code"] == 6
    assert "JSON object" in out.obj["msg"]


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        (None, "required"),
        ("", "required"),
        (5, "5"),
        (["n"], "['n']"),
        ("a b", '"a b"'),
        ("-net", '"-net"'),
        ("net/1", '"net/1"'),
        ("net\n", '"net\n"'),
        ("ü", '"ü"'),
        (True, "True"),
    ],
)
def test_name_problems_are_code_7(plugin: FakePlugin, name: Any, shown: str) -> None:
    c = conf("1.0.0")
    if name is None:
        del c["name"]
    else:
        c["name"] = name
    out = run(env_for("ADD"), c)
    assert out.obj["code"] == 7
    assert out.obj["msg"].startswith("name: "), out.obj["msg"]
    assert shown in out.obj["msg"]
    assert plugin.calls == []


@pytest.mark.parametrize("value", [5, {"t": 1}, False])
def test_type_must_be_a_string(plugin: FakePlugin, value: Any) -> None:
    out = run(env_for("ADD"), conf("1.0.0", type=value))
    assert out.obj["code"] == 7
    assert out.obj["msg"].startswith("type: must be a string"), out.obj["msg"]


def test_name_with_dots_and_dashes_is_fine(plugin: FakePlugin) -> None:
    assert run(env_for("DEL"), conf("1.0.0", name="rdma-net.v1_a")).rc == 0
    assert plugin.calls[0].name == "rdma-net.v1_a"


def test_unknown_plugin_is_code_7(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    rc = skel.run("nosuchplugin", env_for("DEL"), io.BytesIO(b'{"cniVersion":"1.0.0","name":"n"}'), out)
    assert rc == 1
    assert b'"code":7' in out.getvalue() and b"nosuchplugin" in out.getvalue()


def test_about_text_on_stderr_nothing_on_stdout(
    plugin: FakePlugin, capfd: pytest.CaptureFixture[str]
) -> None:
    out = io.BytesIO()
    rc = skel.run(FAKE, {}, io.BytesIO(b""), out, about="pycni fakeplug v0")
    assert rc == 0
    assert out.getvalue() == b""
    err = capfd.readouterr().err
    assert "pycni fakeplug v0" in err
    assert "CNI protocol versions supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0" in err


def test_error_object_shape(plugin: FakePlugin, capfd: pytest.CaptureFixture[str]) -> None:
    plugin.raise_on["ADD"] = TryAgainError("store out of reach", "etcd 198.51.100.2:2379 timed out")
    out = run(env_for("ADD"), conf("1.0.0"))
    assert out.rc == 1
    assert out.stdout.endswith(b"\n") and out.stdout.count(b"\n") == 1
    assert out.obj == {
        "cniVersion": "1.0.0",
        "code": 11,
        "msg": "store out of reach",
        "details": "etcd 198.51.100.2:2379 timed out",
    }


def test_plugin_codes_pass_through(plugin: FakePlugin) -> None:
    plugin.raise_on["DEL"] = CniError("ours", code=104)
    out = run(env_for("DEL"), conf("0.4.0"))
    assert (out.obj["code"], out.obj["cniVersion"], out.obj["details"]) == (104, "0.4.0", "")


def test_logs_never_reach_stdout(plugin: FakePlugin, capfd: pytest.CaptureFixture[str]) -> None:
    from cni import log

    log.configure("debug")
    plugin.raise_on["ADD"] = ConfigError("master: nope")
    out = run(env_for("ADD"), conf("1.0.0"))
    assert out.obj["code"] == 7
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "master: nope" in captured.err  # the debug line about the failure


@pytest.mark.parametrize(
    "exc", [RuntimeError("boom"), KeyError("k"), ZeroDivisionError("z"), AssertionError()]
)
def test_unexpected_exception_is_code_999(
    plugin: FakePlugin, capfd: pytest.CaptureFixture[str], exc: Exception
) -> None:
    plugin.raise_on["ADD"] = exc
    out = run(env_for("ADD"), conf("0.3.1"))
    assert out.rc == 1
    assert out.obj["code"] == 999
    assert out.obj["cniVersion"] == "0.3.1"
    assert out.obj["msg"].startswith("internal error")
    assert b"Traceback" not in out.stdout
    err = capfd.readouterr().err
    assert err.count("Traceback (most recent call last)") == 1
    assert type(exc).__name__ in err


def test_unreadable_stdin_is_code_5(plugin: FakePlugin) -> None:
    class Broken(io.RawIOBase):
        def readinto(self, b: Any) -> int:
            raise OSError(5, "Input/output error")

    out = io.BytesIO()
    rc = skel.run(FAKE, env_for("ADD"), Broken(), out)  # type: ignore[arg-type]
    assert rc == 1
    assert b'"code":5' in out.getvalue()


@pytest.mark.parametrize("command", ["DEL", "CHECK", "GC", "STATUS"])
def test_only_add_prints_a_result(plugin: FakePlugin, command: str) -> None:
    plugin.result = models.full()
    out = run(env_for(command), conf("1.1.0"))
    assert (out.rc, out.stdout) == (0, b"")


def test_add_prints_in_the_config_version(plugin: FakePlugin) -> None:
    plugin.result = models.full()
    out = run(env_for("ADD"), conf("0.4.0"))
    assert out.rc == 0
    assert out.stdout.endswith(b"\n")
    assert out.obj["cniVersion"] == "0.4.0"
    assert out.obj["ips"][0]["version"] == "6"


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_rollback_when_result_cannot_be_printed(plugin: FakePlugin, version: str) -> None:
    plugin.result = models.l2()
    out = run(env_for("ADD", CNI_ARGS="K8S_POD_NAME=p"), conf(version))
    assert out.rc == 1
    assert out.obj["code"] == 7
    assert out.obj["cniVersion"] == version
    assert "without IP addresses" in out.obj["msg"]
    assert plugin.commands == ["ADD", "DEL"]
    add, dele = plugin.calls
    assert (dele.container_id, dele.ifname, dele.netns, dele.conf) == (
        add.container_id,
        add.ifname,
        add.netns,
        add.conf,
    )
    assert dele.args.pod_name == "p"


def test_rollback_failure_keeps_the_original_error(
    plugin: FakePlugin, capfd: pytest.CaptureFixture[str]
) -> None:
    plugin.result = models.l2()
    plugin.raise_on["DEL"] = RuntimeError("link busy")
    out = run(env_for("ADD"), conf("0.2.0"))
    assert out.obj["code"] == 7
    assert plugin.commands == ["ADD", "DEL"]
    assert "link busy" in capfd.readouterr().err


def test_missing_plugin_function_is_success(plugin: FakePlugin, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = sys.modules[f"tests.unit.{FAKE}"]
    monkeypatch.delattr(mod, "gc")
    assert run(env_for("GC"), conf("1.1.0")).rc == 0


# ---- through a real process: python -m cni --------------------------------------------------------


def cni_proc(
    env: dict[str, str], stdin: bytes = b"", plugin: str = "macvlan"
) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")} | env
    return subprocess.run(
        [sys.executable, "-m", "cni", plugin],
        input=stdin,
        env=full,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_process_about_and_version() -> None:
    p = cni_proc({})
    assert (p.returncode, p.stdout) == (0, b"")
    assert b"CNI protocol versions supported" in p.stderr
    p = cni_proc({"CNI_COMMAND": "VERSION"})
    assert p.returncode == 0
    versions = b'["0.1.0","0.2.0","0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]'
    assert p.stdout == b'{"cniVersion":"1.1.0","supportedVersions":' + versions + b"}\n"


def test_process_error_exit_1() -> None:
    p = cni_proc(env_for("ADD"), b'{"cniVersion":"1.0.0"}')
    assert p.returncode == 1
    assert p.stdout == b'{"cniVersion":"1.0.0","code":7,"msg":"name: required","details":""}\n'


def test_process_undecodable_environment() -> None:
    """Bytes that are not UTF-8 in CNI_IFNAME and CNI_CONTAINERID still give a clean error object."""
    env = {k.encode(): v.encode() for k, v in env_for("ADD").items()}
    env[b"CNI_IFNAME"] = b"eth\xff\xfe"
    env[b"CNI_CONTAINERID"] = b"c\xff"
    full = {k: v for k, v in os.environb.items() if not k.startswith(b"CNI_")} | env
    p = subprocess.run(
        [sys.executable, "-m", "cni", "macvlan"],
        input=b'{"cniVersion":"1.0.0","name":"n"}',
        env=full,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 1, p.stderr
    assert b"Traceback" not in p.stderr
    from cni import jsonio

    err = jsonio.loads(p.stdout)
    assert err["code"] == 4
    assert "CNI_IFNAME" in err["msg"] and "CNI_CONTAINERID" in err["msg"]


def test_process_usage_without_plugin() -> None:
    p = subprocess.run([sys.executable, "-m", "cni"], capture_output=True, timeout=60, check=False)
    assert p.returncode == 2
    assert p.stdout == b""
    assert b"macvlan" in p.stderr


def test_process_logs_go_to_stderr_and_log_file_only(tmp_path: Any) -> None:
    logfile = tmp_path / "macvlan.log"
    conf = {
        "cniVersion": "1.0.0",
        "name": "n",
        "type": "macvlan",
        "mode": "bogus",
        "logLevel": "debug",
        "logFile": str(logfile),
    }
    from cni import jsonio

    p = cni_proc(env_for("ADD"), jsonio.dumps(conf))
    assert p.returncode == 1
    assert p.stdout.count(b"\n") == 1
    err = jsonio.loads(p.stdout)
    assert err["code"] == 7 and err["msg"].startswith("mode:")
    assert b"mode: unknown value" in p.stderr  # skel's debug line about the failure
    assert "mode: unknown value" in logfile.read_text()
    assert oct(logfile.stat().st_mode & 0o777) == "0o600"
