"""Environment validation (code 4), CNI_ARGS parsing, unknown commands."""

from __future__ import annotations

import pytest

from cni import skel
from cni.errors import EnvError
from cni.types.args import parse as parse_args
from tests.unit.helpers import FakePlugin, conf, env_for, run

REQUIRED = {
    "ADD": ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
    "CHECK": ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"],
    "DEL": ["CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"],
    "GC": ["CNI_PATH"],
    "STATUS": [],
}
ALL_VARS = ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH", "CNI_ARGS"]


@pytest.mark.parametrize(("command", "var"), [(c, v) for c, vs in REQUIRED.items() for v in vs])
def test_each_required_variable_missing_is_code_4(plugin: FakePlugin, command: str, var: str) -> None:
    env = env_for(command)
    del env[var]
    out = run(env, conf())
    assert out.rc == 1
    assert out.obj["code"] == 4
    assert var in out.obj["msg"]
    assert plugin.calls == []


@pytest.mark.parametrize(("command", "var"), [(c, v) for c, vs in REQUIRED.items() for v in vs])
def test_each_required_variable_empty_is_missing(plugin: FakePlugin, command: str, var: str) -> None:
    out = run(env_for(command, **{var: ""}), conf())
    assert out.obj["code"] == 4
    assert var in out.obj["msg"]


@pytest.mark.parametrize("command", list(REQUIRED))
def test_all_missing_reported_at_once(plugin: FakePlugin, command: str) -> None:
    out = run({"CNI_COMMAND": command}, conf())
    if not REQUIRED[command]:
        assert out.rc == 0, out.stdout  # STATUS needs nothing but the command
        return
    assert out.obj["code"] == 4
    for var in REQUIRED[command]:
        assert var in out.obj["msg"]


@pytest.mark.parametrize("command", list(REQUIRED))
def test_optional_variables_are_optional(plugin: FakePlugin, command: str) -> None:
    env = env_for(command)
    for var in ALL_VARS:
        if var not in REQUIRED[command]:
            env.pop(var, None)
    out = run(env, conf())
    assert out.rc == 0, out.stdout
    assert plugin.commands == [command]


def test_del_without_netns_passes_empty_netns(plugin: FakePlugin) -> None:
    assert run(env_for("DEL"), conf()).rc == 0
    assert plugin.calls[0].netns == ""


def test_missing_and_invalid_together(plugin: FakePlugin) -> None:
    env = env_for("ADD", CNI_IFNAME="a/b", CNI_CONTAINERID="-bad", CNI_ARGS="novalue")
    del env["CNI_NETNS"]
    msg = run(env, conf()).obj["msg"]
    for word in ("CNI_NETNS", "CNI_IFNAME", "CNI_CONTAINERID", "CNI_ARGS"):
        assert word in msg, msg


@pytest.mark.parametrize(
    "cid",
    ["c0ffee", "0", "a" * 200, "A-b_c.d", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"],
)
def test_container_id_valid(plugin: FakePlugin, cid: str) -> None:
    assert run(env_for("ADD", CNI_CONTAINERID=cid), conf()).rc == 0
    assert plugin.calls[0].container_id == cid


@pytest.mark.parametrize("cid", ["-abc", "_abc", ".abc", "ab c", "ab/c", "ab:c", "abc\n", "é", "ab$"])
def test_container_id_invalid(plugin: FakePlugin, cid: str) -> None:
    out = run(env_for("ADD", CNI_CONTAINERID=cid), conf())
    assert out.obj["code"] == 4
    assert "CNI_CONTAINERID" in out.obj["msg"]
    assert plugin.calls == []


@pytest.mark.parametrize(
    "name",
    ["eth0", "net1", "a", "x" * 15, "é" * 7 + "x", "eth.1", "eth-1_2", "ü" * 7, "@weird#", "." * 3],
)
def test_ifname_valid(plugin: FakePlugin, name: str) -> None:
    assert len(name.encode()) <= 15
    out = run(env_for("ADD", CNI_IFNAME=name), conf())
    assert out.rc == 0, out.stdout
    assert plugin.calls[0].ifname == name


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("x" * 16, "16 bytes"),
        ("é" * 8, "16 bytes"),  # 8 characters, 16 bytes
        ("€" * 5 + "x", "16 bytes"),  # 6 characters, 16 bytes
        (".", "may not be"),
        ("..", "may not be"),
        ("a/b", "'/'"),
        ("a:b", "':'"),
        ("a b", "' '"),
        ("a\tb", "'\\t'"),
        ("eth0\n", "'\\n'"),
        ("a\u00a0b", "'\\xa0'"),
    ],
)
def test_ifname_invalid(plugin: FakePlugin, name: str, why: str) -> None:
    out = run(env_for("ADD", CNI_IFNAME=name), conf())
    assert out.obj["code"] == 4
    assert "CNI_IFNAME" in out.obj["msg"]
    assert why in out.obj["msg"], out.obj["msg"]
    assert plugin.calls == []


@pytest.mark.parametrize("command", ["DEL", "CHECK"])
def test_ifname_validated_for_del_and_check(plugin: FakePlugin, command: str) -> None:
    out = run(env_for(command, CNI_IFNAME="a/b"), conf())
    assert out.obj["code"] == 4


def test_ifname_problem_counts_bytes() -> None:
    assert skel.ifname_problem("é" * 7 + "x") is None
    assert "16 bytes" in (skel.ifname_problem("é" * 8) or "")
    assert skel.ifname_problem("") == "is empty"


def test_cni_args_as_runtimes_send_them(plugin: FakePlugin) -> None:
    args = (
        "IgnoreUnknown=true;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0;"
        "K8S_POD_INFRA_CONTAINER_ID=9f86d081884c;K8S_POD_UID=0b0c3c9e-5f2a-4d0e-9c1e-5b5f8c8d7a61;"
        "MAC=02:00:5e:00:53:07;IP=198.51.100.7/24"
    )
    assert run(env_for("ADD", CNI_ARGS=args), conf()).rc == 0
    a = plugin.calls[0].args
    assert a.get("IgnoreUnknown") == "true"
    assert a.pod_namespace == "team-a"
    assert a.pod_name == "trainer-0"
    assert a.pod_ref == "team-a/trainer-0"
    assert a.pod_uid == "0b0c3c9e-5f2a-4d0e-9c1e-5b5f8c8d7a61"
    assert a.get("K8S_POD_INFRA_CONTAINER_ID") == "9f86d081884c"
    assert a.get("MAC") == "02:00:5e:00:53:07"
    assert a.get("IP") == "198.51.100.7/24"
    assert a.get("absent", "dflt") == "dflt"


def test_cni_args_edge_forms() -> None:
    assert parse_args("").pairs == ()
    assert parse_args("A=1;").pairs == (("A", "1"),)  # a trailing ';' as some runtimes send
    assert parse_args("A=").get("A") == ""
    assert (
        parse_args("FOO=bar;K8S_POD_NAME=p").pod_name == "p"
    )  # unknown keys tolerated, even without IgnoreUnknown
    assert parse_args("K8S_POD_NAMESPACE=ns").pod_ref == ""  # no pod reference without a pod name
    assert parse_args("K8S_POD_NAME=p").pod_ref == "/p"  # whereabouts' "namespace/name" form


@pytest.mark.parametrize("bad", ["novalue", "A=1;B", "A=1=2", "=v", "A=1;;=x", "IP=198.51.100.7/24=x"])
def test_cni_args_invalid_pair_is_code_4(plugin: FakePlugin, bad: str) -> None:
    with pytest.raises(EnvError) as e:
        parse_args(bad)
    assert "CNI_ARGS" in e.value.msg
    out = run(env_for("ADD", CNI_ARGS=bad), conf())
    assert out.obj["code"] == 4
    assert "CNI_ARGS" in out.obj["msg"]
    assert plugin.calls == []


@pytest.mark.parametrize("command", ["add", "FOO", "DELETE", " ADD"])
def test_unknown_command_is_code_4(plugin: FakePlugin, command: str) -> None:
    out = run(env_for("ADD", CNI_COMMAND=command), conf())
    assert out.rc == 1
    assert out.obj["code"] == 4
    assert "CNI_COMMAND" in out.obj["msg"] and command in out.obj["msg"]
    assert plugin.calls == []


def test_own_netns_is_code_8(plugin: FakePlugin) -> None:
    out = run(env_for("ADD", CNI_NETNS="/proc/self/ns/net"), conf())
    assert out.obj["code"] == 8
    assert plugin.calls == []


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_own_netns_override(plugin: FakePlugin, value: str) -> None:
    out = run(env_for("ADD", CNI_NETNS="/proc/self/ns/net", CNI_NETNS_OVERRIDE=value), conf())
    assert out.rc == 0, out.stdout


def test_request_carries_environment(plugin: FakePlugin) -> None:
    env = env_for("ADD", CNI_PATH="/opt/cni/bin::relative:/usr/lib/cni", EXTRA="kept")
    assert run(env, conf()).rc == 0
    req = plugin.calls[0]
    assert req.path == ("/opt/cni/bin", "relative", "/usr/lib/cni")
    assert req.env["EXTRA"] == "kept"
    assert (req.container_id, req.ifname, req.netns) == ("c0ffee", "net1", env["CNI_NETNS"])
