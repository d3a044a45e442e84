"""docs/architecture.md and docs/install.md name only code that exists (issue 45: `leftover.free`,
`handles.settle`, the retry reason `again` and an agent "over the socket" were left behind by changes).

Every dotted name on those pages (`batch.settle_all`, `Engine.add`, `cni.agent.server.warm`) is resolved
in the sources, without importing them: its first part a module (by its dotted path or its own name), a
class, or one of the few instances the pages name (`store`); the rest functions, classes, constants or
attributes (a class's methods, fields and `self.X`). File names, hosts and the Kubernetes or config
fields the pages quote are told apart by their form or listed in NOT_CODE; anything else must resolve.
The metrics table's label values are the ones the code counts."""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ("docs/architecture.md", "docs/install.md")
PACKAGES = ("cni", "ipam", "bundler", "tests")
NOT_CODE = {  # dotted words of the pages that are no Python name, and what they are
    "spec.nodeName": "a pod's field (fieldSelector, downward API)",
    "metadata.annotations.k8s": "a jsonpath into a pod (kubectl -o jsonpath)",
    "ipam.type": "a field of the network configuration",
    "cniConf.confDir": "a value of upstream whereabouts' Helm chart",
}
FILE_SUFFIXES = {"md", "py", "yaml", "yml", "toml", "tar", "lock", "go", "sh", "json", "conf", "d", "fifo",
                 "kubeconfig", "io", "com", "test"}
INSTANCES = {"store": ("ipam.store.base", "Store")}  # how the pages name an object of a class
DOTTED = re.compile(r"(?<![\w./$-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?!\.?[\w/-])")


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the project by dotted name."""
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def names_of(body: list[ast.stmt], cls: bool) -> dict[str, ast.AST]:
    """What a module or class body defines: functions, classes, assigned names, imports; in a class
    also what its methods assign to `self.X`."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        out[t.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                out[(alias.asname or alias.name).split(".")[0]] = node
        if cls and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for t in ast.walk(node):
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                        and isinstance(t.ctx, ast.Store)):
                    out.setdefault(t.attr, t)
    if cls:  # __slots__ = ("a", "b")
        for node in body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                    for t in node.targets):
                for c in ast.walk(node.value):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        out[c.value] = node
    return out


@functools.cache
def classes() -> dict[str, list[ast.ClassDef]]:
    out: dict[str, list[ast.ClassDef]] = {}
    for path in modules().values():
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def member(scope: ast.AST | None, rest: list[str]) -> bool:
    """`rest` resolves from `scope` (a module or a class), one part after the other."""
    for part in rest:
        if isinstance(scope, ast.Module):
            found = names_of(scope.body, cls=False).get(part)
        elif isinstance(scope, ast.ClassDef):
            found = names_of(scope.body, cls=True).get(part)
            if found is None:  # inherited from a project class
                bases = [b.id for b in scope.bases if isinstance(b, ast.Name)]
                return any(member(c, [part, *rest[rest.index(part) + 1:]])
                           for b in bases for c in classes().get(b, []))
        else:
            return True  # a function's attribute, an instance's: past what the sources can say
        if found is None:
            return False
        scope = found if isinstance(found, ast.ClassDef) else None
    return True


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    mods = modules()
    for i in range(len(parts), 0, -1):  # a dotted module path (cni.agent.server.warm)
        if ".".join(parts[:i]) in mods:
            return member(tree(mods[".".join(parts[:i])]), parts[i:])
    by_name = [path for name, path in mods.items() if name.rsplit(".", 1)[-1] == parts[0]]
    if any(member(tree(path), parts[1:]) for path in by_name):  # a module by its own name (batch.share)
        return True
    if any(member(c, parts[1:]) for c in classes().get(parts[0], [])):  # a class (Engine.add)
        return True
    if parts[0] in INSTANCES:
        module, cls = INSTANCES[parts[0]]
        return any(member(c, parts[1:]) for c in classes()[cls] if c in ast.walk(tree(mods[module])))
    if not by_name and parts[0] in ("os", "sys"):  # the standard library the pages quote
        obj: object = importlib.import_module(parts[0])
        return all(hasattr(obj := getattr(obj, p, None), "__class__") and obj is not None for p in parts[1:])
    return False


def dotted_names(page: str) -> set[str]:
    text = (REPO / page).read_text(encoding="utf-8")
    text = re.sub(r"```yaml\n.*?```", "", text, flags=re.S)  # manifests (kustomize field paths)
    text = re.sub(r"https?://\S+", "", text)
    found = set(DOTTED.findall(text))
    return {m for m in found if m.rsplit(".", 1)[-1] not in FILE_SUFFIXES and m not in NOT_CODE}


@pytest.mark.parametrize("page", PAGES)
def test_every_dotted_name_on_the_page_exists(page: str) -> None:
    names = dotted_names(page)
    assert len(names) >= 5, names  # the pages name code: the scan finds it
    assert sorted(n for n in names if not resolves(n)) == []


def test_the_resolver_finds_what_exists_and_nothing_else() -> None:
    for good in ("combiner.settle_all", "Engine.add", "cni.agent.server.warm", "store.commit_pool", "Op.to",
                 "handles.BATCH", "main.remaining", "agentreads.Memory", "sys.executable"):
        assert resolves(good), good
    for bad in ("leftover.free", "handles.settle", "Engine.nothing", "cni.agent.server.nothing"):
        assert not resolves(bad), bad


def counted(method: str) -> set[str]:
    """The label values the code passes to cni.metrics `method` (metrics.retry("conflict"), ...)."""
    out = set()
    for pkg in ("cni", "ipam"):
        for path in (REPO / pkg).rglob("*.py"):
            for node in ast.walk(tree(path)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr == method and isinstance(node.func.value, ast.Name)
                        and node.func.value.id == "metrics" and node.args
                        and isinstance(node.args[0], ast.Constant)):
                    out.add(str(node.args[0].value))
    return out


@pytest.mark.parametrize(("family", "label", "method"), [("pycni_ipam_retries_total", "reason", "retry"),
                                                         ("pycni_ipam_conflicts_total", "kind", "conflict")])
def test_the_metrics_tables_label_values_are_the_ones_counted(family: str, label: str, method: str) -> None:
    text = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith(f"| `{family}`"))
    listed = re.search(rf"`{label}` \(([^)]*)\)", row)
    assert listed is not None, row
    assert set(re.findall(r"`(\w+)`", listed.group(1))) == counted(method)


def test_no_page_or_docstring_has_the_agent_talk_over_a_socket() -> None:
    """The agent is reached through its FIFO and /proc (docs/architecture.md says why not a socket)."""
    said = [str(p.relative_to(REPO)) for p in [*(REPO / "docs").glob("*.md"), REPO / "README.md",
                                               *(p for pkg in ("cni", "ipam", "bundler")
                                                 for p in (REPO / pkg).rglob("*.py"))]
            if "over the socket" in p.read_text(encoding="utf-8")]
    assert said == []
