"""Test seams are out of the product: no shipped module reads a test switch from the environment or
carries a test double; the seams (cni.faults.hook, cni.sriov.vf.factory, cni.log.tee) are set only inside
a test process (tests/launch.py, tests/logtee.py). tests/integration/test_no_test_switches.py runs the
plugins with the former variables set, from source and frozen. Every environment variable the product
reads is found in its syntax trees: none may have TEST in its name."""

from __future__ import annotations

import ast

import pytest

from bundler.freeze import FIRST_PARTY, first_party_modules
from cni import faults
from cni.sriov import vf
from tests.nsutil import REPO

FORMER = ("PYCNI_TEST_FAULTS", "PYCNI_SRIOV_FAKE_PF", "PYCNI_TEST_LOG", "FakeVf", "from tests",
          "import tests", "ipam.store.memory")


def test_no_shipped_source_names_a_test_switch() -> None:
    found = [f"{path.relative_to(REPO)}: {word}" for pkg in FIRST_PARTY for path in (REPO / pkg).rglob("*.py")
             for word in FORMER if word in path.read_text()]
    assert found == []
    assert not any("fake" in m or m.startswith("tests") or "memory" in m for m in first_party_modules())


def test_the_seams_are_inert_whatever_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYCNI_TEST_FAULTS", "result!,result,link!,link")
    monkeypatch.setenv("PYCNI_SRIOV_FAKE_PF", "/nonexistent.json")
    assert faults.hook is None and vf.factory is None
    for step in ("result", "link"):
        faults.point(step)  # neither raises nor kills
    assert isinstance(vf.control(), vf.NetlinkVf)


# ---- the environment variables the product reads, from its syntax trees ----------------------------

ENVIRONMENTS = ("environ", "environb", "env")  # os.environ(b), and every mapping named *env (req.env...)


def _is_environment(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name in ENVIRONMENTS or name.endswith("_env") or name.endswith("environ")


def _constants(trees: list[ast.Module]) -> dict[str, set[str]]:
    """The strings every name may hold: assigned a str (or bytes) constant or a literal of them anywhere
    (`ENV = "..."`, `A, B = "...", "..."`, `KNOBS = ("...", ...)`, `NEEDS = {"ADD": (...)}`), or bound
    by a loop over such a name (`for k in KNOBS`, `[k for k in NEEDS[command]]`)."""
    out: dict[str, set[str]] = {}
    loops: list[tuple[ast.expr, ast.expr]] = []
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.For | ast.comprehension):
                loops.append((node.target, node.iter))
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                pairs = (zip(target.elts, node.value.elts, strict=False)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                for t, v in pairs:
                    if isinstance(t, ast.Name | ast.Attribute) and _strings(v):
                        out.setdefault(t.id if isinstance(t, ast.Name) else t.attr, set()).update(_strings(v))
    for target, iterated in loops:
        source = iterated
        while isinstance(source, ast.Subscript):
            source = source.value
        if isinstance(target, ast.Name) and isinstance(source, ast.Name | ast.Attribute):
            held = out.get(source.id if isinstance(source, ast.Name) else source.attr, set())
            if held:
                out.setdefault(target.id, set()).update(held)
    return out


def _strings(node: ast.expr) -> set[str]:
    """The str/bytes constants of a constant or of a literal tuple, list, set or dict (its values)."""
    if isinstance(node, ast.Constant):
        return {_text(node.value)} if isinstance(node.value, str | bytes) else set()
    items = node.values if isinstance(node, ast.Dict) else node.elts if isinstance(
        node, ast.Tuple | ast.List | ast.Set) else []
    return {text for item in items for text in _strings(item)}


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _keys(node: ast.expr, constants: dict[str, set[str]]) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        return {_text(node.value)}
    if isinstance(node, ast.Name):
        return constants.get(node.id, {f"<unresolved {node.id}>"})
    if isinstance(node, ast.Attribute):
        return constants.get(node.attr, {f"<unresolved {node.attr}>"})
    return {"<computed>"}


def environment_reads(trees: list[ast.Module]) -> set[str]:
    """The variable names read by `env.get(K)`, `env.pop(K)`, `os.getenv(K)`, `env[K]`, `K in env`."""
    constants = _constants(trees)
    found: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                if (isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault") \
                        and _is_environment(func.value)) or \
                        (isinstance(func, ast.Attribute | ast.Name) and _name(func) == "getenv"):
                    found |= _keys(node.args[0], constants)
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) \
                    and _is_environment(node.value):
                found |= _keys(node.slice, constants)
            elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In | ast.NotIn) for o in node.ops) \
                    and any(_is_environment(c) for c in node.comparators):
                found |= _keys(node.left, constants)
    return found


def _name(node: ast.Attribute | ast.Name) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id


def product_trees() -> list[ast.Module]:
    return [ast.parse(path.read_text(), str(path))
            for pkg in FIRST_PARTY for path in (REPO / pkg).rglob("*.py")]


def test_no_environment_variable_the_product_reads_is_a_test_switch() -> None:
    names = environment_reads(product_trees())
    # the scan sees the variables it must (so an empty or broken scan cannot pass)
    assert {"CNI_COMMAND", "PYCNI_AGENT", "PYCNI_AGENT_FIFO", "PYCNI_SYSFS_ROOT", "KUBERNETES_SERVICE_HOST",
            "NODENAME", "PYCNI_IMPORTTIME"} <= names, sorted(names)
    assert [n for n in names if n.startswith("<")] == []  # every name read is known (no computed keys)
    assert [n for n in names if "TEST" in n.upper()] == []


@pytest.mark.parametrize("source", [
    'import os\nos.environ.get("PYCNI_TEST_LOG")',
    'import os\nLOG = "PYCNI_TEST_LOG"\nos.environ[LOG]',
    'import os\nif "PYCNI_TEST_X" in os.environ: pass',
    'import os\nos.getenv("MY_TEST")',
    'def f(req):\n    return req.env.get("PYCNI_TESTING", "")',
    'from cni import log\ndef f(env):\n    return env.get(log.TEST_ENV)\nTEST_ENV = "X_TEST"',
    'import os\nKNOBS = ("PYCNI_STRIP", "PYCNI_TEST_KNOB")\nfor knob in KNOBS:\n    os.environ.get(knob)',
    'NEEDS = {"ADD": ("CNI_X", "CNI_TEST")}\ndef f(env, c):\n    return [k for k in NEEDS[c] if env.get(k)]',
    'import os\nos.environb.get(b"PYCNI_TEST_B")',
])
def test_the_scan_finds_a_test_switch(source: str) -> None:
    assert [n for n in environment_reads([ast.parse(source)]) if "TEST" in n] != []
