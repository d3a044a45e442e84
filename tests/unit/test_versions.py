"""Version gating: every command against every version, unknown and missing versions, the error
object's cniVersion."""

from __future__ import annotations

import pytest

from cni import spec
from tests.unit.helpers import FakePlugin, conf, env_for, run

VERSIONS = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
MINIMUM = {"ADD": "0.1.0", "DEL": "0.1.0", "CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}
UNKNOWN = ["0.5.0", "1.2.0", "2.0.0", "0.0.1", "1.0", "v1.0.0", "1.0.0-rc1", "abc", " 1.0.0", "01.0.0"]


def allowed(command: str, version: str) -> bool:
    return VERSIONS.index(version) >= VERSIONS.index(MINIMUM[command])


def test_supported_list_is_the_spec_list() -> None:
    assert list(spec.SUPPORTED) == VERSIONS
    assert spec.LATEST == "1.1.0"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("command", list(MINIMUM))
def test_command_by_version(plugin: FakePlugin, command: str, version: str) -> None:
    # ADD with an empty result cannot be printed in 0.1.0/0.2.0; give it an address for this test
    from tests.unit.models import ipam_only

    plugin.result = ipam_only()
    out = run(env_for(command), conf(version))
    if allowed(command, version):
        assert out.rc == 0, out.stdout
        assert plugin.commands == [command]
        assert plugin.calls[0].version == version
        if command == "ADD":
            assert out.obj["cniVersion"] == version
        else:
            assert out.stdout == b""
        return
    assert out.rc == 1
    err = out.obj
    assert err["code"] == 1
    assert command in err["msg"]
    assert f'"{version}"' in err["details"] and MINIMUM[command] in err["details"]
    assert err["cniVersion"] == version
    assert plugin.calls == []


@pytest.mark.parametrize("version", UNKNOWN)
@pytest.mark.parametrize("command", list(MINIMUM))
def test_unknown_version_is_code_1(plugin: FakePlugin, command: str, version: str) -> None:
    out = run(env_for(command), conf(version))
    err = out.obj
    assert out.rc == 1
    assert err["code"] == 1
    assert err["msg"] == "incompatible CNI versions"
    assert f'config is "{version}"' in err["details"]
    for v in VERSIONS:
        assert v in err["details"]
    # an error object never claims a version the plugin does not speak
    assert err["cniVersion"] == spec.LATEST
    assert plugin.calls == []


@pytest.mark.parametrize("missing", [None, ""])
def test_missing_version_is_0_1_0(plugin: FakePlugin, missing: str | None) -> None:
    from tests.unit.models import ipam_only

    plugin.result = ipam_only()
    out = run(env_for("ADD"), conf(missing))
    assert out.rc == 0, out.stdout
    assert plugin.calls[0].version == "0.1.0"
    assert out.obj["cniVersion"] == "0.1.0"
    assert "ip4" in out.obj


@pytest.mark.parametrize("command", ["CHECK", "GC", "STATUS"])
def test_missing_version_gates_newer_commands(plugin: FakePlugin, command: str) -> None:
    out = run(env_for(command), conf(None))
    assert out.obj["code"] == 1
    assert out.obj["cniVersion"] == "0.1.0"
    assert '"0.1.0"' in out.obj["details"]


@pytest.mark.parametrize("bad", [1, 1.0, True, ["1.0.0"], {"v": 1}])
def test_wrongly_typed_version_is_code_7(plugin: FakePlugin, bad: object) -> None:
    out = run(env_for("ADD"), conf(None, cniVersion=bad))
    assert out.obj["code"] == 7
    assert "cniVersion" in out.obj["msg"]
    assert out.obj["cniVersion"] == spec.LATEST


@pytest.mark.parametrize("version", VERSIONS)
def test_error_object_echoes_the_config_version(plugin: FakePlugin, version: str) -> None:
    out = run(env_for("ADD"), conf(version, name="bad name"))
    assert out.obj["code"] == 7
    assert out.obj["cniVersion"] == version
    assert list(out.obj) == ["cniVersion", "code", "msg", "details"]


def test_version_command_ignores_stdin_and_config_version(plugin: FakePlugin) -> None:
    for stdin in (b"", b"not json", b'{"cniVersion":"0.2.0"}'):
        out = run({"CNI_COMMAND": "VERSION"}, stdin)
        assert out.rc == 0
        assert out.stdout.endswith(b"\n")
        assert out.obj == {"cniVersion": "1.1.0", "supportedVersions": VERSIONS}
    assert plugin.calls == []


def test_gate_and_order() -> None:
    assert spec.at_least("1.0.0", "0.4.0")
    assert not spec.at_least("0.3.1", "0.4.0")
    assert spec.parse("0.3.1") < spec.parse("0.4.0") < spec.parse("0.10.0")
    for bad in ("1.0", "1.0.0.0", "a.b.c", ""):
        with pytest.raises(ValueError, match="invalid version"):
            spec.parse(bad)
    assert [spec.family(v) for v in VERSIONS] == ["0.2", "0.2", "0.4", "0.4", "0.4", "1", "1"]
