"""Property-based fuzzing of every plugin's configuration and environment (issue 7, "Bad input").

For macvlan, host-device, sriov and whereabouts (on the local SQLite store and on the in-memory
store): a valid configuration with fields mutated, removed or added (wrong types, absurd numbers,
invalid CIDRs and ranges, bad interface names, huge and deeply nested values), raw stdin that is not
a configuration (garbage, invalid UTF-8, deep nesting, huge documents), and hostile CNI_* variables
(netns paths that are files, directories, missing, other namespace types; bad names; bad CNI_ARGS).

Every answer must be a CNI error object with a known code (never 999, which is a traceback), code 7
naming the mutated field and code 4 naming the variable; or a valid result, after which DEL must
succeed. After every call nothing may remain: no link in the pod, no changed host link, no device
record, no changed VF setting, no allocation or reservation. Most cases run in-process (fuzzlab);
a sample runs as real processes. Profiles: conftest.py (`ci` bounded, `make fuzz` long)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni import jsonio
from cni.errors import CODES, Code
from tests.hardening import strategies as S
from tests.hardening.conftest import TALLY
from tests.hardening.fuzzlab import FuzzLab, Outcome, run_process

pytestmark = pytest.mark.root  # namespaces, links, mounts

PLUGINS = ["macvlan", "host-device", "sriov", "whereabouts"]
CASES = [(p, "local") for p in PLUGINS] + [("whereabouts", "memory")]
KNOWN_CODES = set(CODES) - {Code.INTERNAL}
COMMANDS = st.sampled_from(["ADD"] * 6 + ["DEL"] * 2 + ["CHECK", "GC", "STATUS"])
VERSIONS = st.sampled_from(["0.3.1", "0.4.0", "1.0.0", "1.1.0"])


@pytest.fixture(scope="module")
def labs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FuzzLab]]:
    made: dict[str, FuzzLab] = {}
    try:
        for store in ("local", "memory"):
            made[store] = FuzzLab(tmp_path_factory.mktemp(f"fuzz-{store}"), store)
        yield made
    finally:
        for lab in made.values():
            lab.close()


def encode(conf: Any) -> bytes:
    """stdlib json: unlike orjson it writes integers beyond 64 bits and nesting beyond 255 levels,
    as a hostile runtime could."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        return json.dumps(conf).encode()
    finally:
        sys.setrecursionlimit(limit)


def _case_id(case: tuple[str, str]) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.fixture(params=CASES, ids=_case_id)
def case(request: pytest.FixtureRequest, labs: dict[str, FuzzLab]) -> tuple[str, FuzzLab]:
    plugin, store = request.param
    return plugin, labs[store]


def judge(lab: FuzzLab, plugin: str, env: dict[str, str], stdin: bytes, got: Outcome,
          fields: Sequence[str] = (), variables: Sequence[str] = ()) -> None:
    """The properties every answer has; then nothing may be left behind."""
    command = env.get("CNI_COMMAND", "")
    TALLY[f"fuzzed {plugin}"] += 1
    where = f"{plugin} {command}: stdout {got.raw[:600]!r}"
    assert got.rc in (0, 1), where
    if got.rc == 1:
        assert isinstance(got.out, dict), where
        assert isinstance(got.out.get("cniVersion"), str) and isinstance(got.out.get("msg"), str), where
        code, text = got.error()
        assert code in KNOWN_CODES, where  # 999: a traceback
        TALLY[f"code {code}"] += 1
        if code == Code.INVALID_CONFIG and fields and base_error(lab, plugin, env, stdin) == "":
            assert any(f in text for f in fields), f"code 7 does not name {fields}: {where}"
        if code == Code.INVALID_ENV and variables:
            named = any(v in text for v in variables) or "CNI_NETNS" in text
            assert named, f"code 4 names none of {variables}: {where}"
    elif command == "ADD":
        assert isinstance(got.out, dict) and "cniVersion" in got.out, where
        TALLY["valid results"] += 1
        gone = lab.call(plugin, {**env, "CNI_COMMAND": "DEL"}, stdin)
        assert gone.rc == 0, f"DEL after a successful ADD failed: {gone.raw!r}; {where}"
    left = lab.leftovers()
    if left:
        lab.reset()
    assert not left, f"left behind {left}: {where}"


_BASE: dict[tuple[str, str, str, str], str] = {}


def base_error(lab: FuzzLab, plugin: str, env: dict[str, str], stdin: bytes) -> str:
    """The message the unmutated configuration gets for the same command and version (CHECK without
    prevResult, STATUS before 1.1.0; "" when it succeeds): only a mutation that turns a success into
    code 7 must be named by the message."""
    try:
        version = str(json.loads(stdin).get("cniVersion"))
    except Exception:
        return ""
    key = (plugin, lab.store, version, env.get("CNI_COMMAND", ""))
    if key not in _BASE:
        got = lab.call(plugin, env, encode(lab.conf(plugin, cniVersion=version)))
        if got.rc == 0 and env.get("CNI_COMMAND") == "ADD":
            lab.call(plugin, {**env, "CNI_COMMAND": "DEL"}, encode(lab.conf(plugin, cniVersion=version)))
        _BASE[key] = got.error()[1] if got.rc else ""
    return _BASE[key]


@given(data=st.data())
def test_mutated_configuration(case: tuple[str, FuzzLab], data: st.DataObject) -> None:
    plugin, lab = case
    base = lab.conf(plugin, cniVersion=data.draw(VERSIONS, "version"))
    muts = data.draw(st.lists(S.mutation(base, plugin), min_size=1, max_size=3), "mutations")
    conf = S.apply(base, muts)
    command = data.draw(COMMANDS, "command")
    env = lab.env(command)
    stdin = encode(conf)
    got = lab.call(plugin, env, stdin)
    judge(lab, plugin, env, stdin, got, fields=[m.field for m in muts if m.field])


@given(data=st.data())
def test_raw_stdin(case: tuple[str, FuzzLab], data: st.DataObject) -> None:
    plugin, lab = case
    valid = jsonio.dumps(lab.conf(plugin))
    stdin = data.draw(S.raw_stdin(valid), "stdin")
    env = lab.env(data.draw(COMMANDS, "command"))
    got = lab.call(plugin, env, stdin)
    judge(lab, plugin, env, stdin, got)
    if got.rc == 1 and stdin.strip() and not _is_json(stdin):
        assert got.error()[0] == Code.DECODING_FAILURE, got.raw


def _is_json(data: bytes) -> bool:
    try:
        jsonio.loads(data)
    except Exception:
        return False
    return True


@st.composite
def hostile_env(draw: st.DrawFn, lab: FuzzLab) -> tuple[dict[str, str], list[str]]:
    env = lab.env(draw(COMMANDS, "command"))
    touched = []
    for key in draw(st.lists(st.sampled_from(S.ENV_KEYS), min_size=1, max_size=3, unique=True)):
        touched.append(key)
        how = draw(st.sampled_from(["drop", "value"] + (["netns"] * 3 if key == "CNI_NETNS" else [])))
        if how == "drop":
            env.pop(key, None)
        elif how == "netns":
            env[key] = draw(st.sampled_from(sorted(lab.netns_paths().values())))
        elif key == "CNI_ARGS":
            env[key] = draw(S.CNI_ARGS)
        elif key == "CNI_PATH":
            env[key] = draw(st.sampled_from(["", "relative/bin", f"relative:{lab.lab.bin}", "/nonexistent",
                                             f"{lab.lab.bin}:{lab.lab.bin}", "::", str(lab.a_file)]))
        else:
            env[key] = draw(S.env_text)
    return env, touched


@given(data=st.data())
def test_hostile_environment(case: tuple[str, FuzzLab], data: st.DataObject) -> None:
    plugin, lab = case
    env, touched = data.draw(hostile_env(lab), "env")
    stdin = jsonio.dumps(lab.conf(plugin))
    got = lab.call(plugin, env, stdin)
    judge(lab, plugin, env, stdin, got, variables=touched)


@settings(max_examples=12)
@given(data=st.data())
def test_sample_as_real_processes(case: tuple[str, FuzzLab], data: st.DataObject) -> None:
    """The same properties through `python -m cni PLUGIN`: the process boundary (stdout only the
    answer, exit code, env bytes that are not UTF-8) behaves like the in-process call."""
    plugin, lab = case
    base = lab.conf(plugin)
    kind = data.draw(st.sampled_from(["config", "stdin", "env"]), "kind")
    env, stdin, fields, touched = lab.env("ADD"), jsonio.dumps(base), [], []
    if kind == "config":
        # no path field: null or "" there means the node's default directory, outside the lab
        safe = S.mutation(base, plugin).filter(lambda m: m.field not in S.PATH_KEYS)
        muts = data.draw(st.lists(safe, min_size=1, max_size=2), "mutations")
        stdin, fields = encode(S.apply(base, muts)), [m.field for m in muts if m.field]
    elif kind == "stdin":
        stdin = data.draw(S.raw_stdin(stdin).filter(lambda b: len(b) < 1 << 20), "stdin")
    else:
        env, touched = data.draw(hostile_env(lab), "env")
    env = {k: v for k, v in env.items() if "\x00" not in v}
    with _memory_as_local(lab):
        got = run_process(lab, plugin, env, stdin)
        TALLY["fuzzed as processes"] += 1
        assert b"Traceback" not in got.raw, got.raw
        judge(lab, plugin, env, stdin, got, fields=fields, variables=touched)


class _memory_as_local:
    """A real process cannot see the in-memory store: the process sample uses the local store."""

    def __init__(self, lab: FuzzLab) -> None:
        self.lab, self.saved = lab, lab.store

    def __enter__(self) -> None:
        self.lab.store = "local"

    def __exit__(self, *exc: Any) -> None:
        self.lab.store = self.saved


def test_lab_sees_leftovers(labs: dict[str, FuzzLab], tmp_path: Path) -> None:
    """The leak check can fail: a successful ADD without its DEL is reported, for every plugin."""
    lab = labs["local"]
    for plugin in ("macvlan", "host-device", "sriov"):
        env, stdin = lab.env("ADD"), jsonio.dumps(lab.conf(plugin))
        got = lab.call(plugin, env, stdin)
        assert got.rc == 0, got.raw
        left = lab.leftovers()
        assert any("allocation" in x or "/" in x for x in left) and len(left) >= 2, left
        assert lab.call(plugin, {**env, "CNI_COMMAND": "DEL"}, stdin).rc == 0
        assert lab.leftovers() == []
