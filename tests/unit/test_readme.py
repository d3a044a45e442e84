"""README.md shows one NetworkAttachmentDefinition per model: each must be the conf-examples file it
names (which the suite loads and runs), so the README cannot drift from them. The quick start keeps its
two commands, the ones CI (.ci/run) and a newcomer run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")
EXAMPLES = REPO / "conf-examples" / "kubernetes"


def section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def readme_nads(text: str = README) -> dict[str, dict[str, Any]]:
    """The NADs of the yaml blocks of README.md (or of a part of it), by name."""
    docs = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    return {d["metadata"]["name"]: d for d in docs
            if isinstance(d, dict) and d.get("kind") == "NetworkAttachmentDefinition"}


@pytest.mark.parametrize("name", ["roce-shared-macvlan.yaml", "sriov-vf.yaml", "hostdevice-pf.yaml",
                                  "rail-macvlan.yaml", "rail-sriov.yaml", "rail-hostdevice.yaml"])
def test_readme_nad_is_the_example(name: str) -> None:
    example = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    shown = readme_nads().get(example["metadata"]["name"])
    assert shown is not None, f"README.md shows no NAD named {example['metadata']['name']} ({name})"
    assert f"`{name}`" in README, f"README.md does not name conf-examples/kubernetes/{name}"
    assert shown["apiVersion"] == example["apiVersion"]
    assert shown["metadata"] == example["metadata"]
    assert json.loads(shown["spec"]["config"]) == json.loads(example["spec"]["config"])


@pytest.mark.parametrize("title", ["The three models", "Multi-rail pods"])
def test_readme_shows_one_nad_per_model(title: str) -> None:
    nads = readme_nads(section(title)).values()
    types = sorted(json.loads(nad["spec"]["config"])["type"] for nad in nads)
    assert types == ["host-device", "macvlan", "sriov"]


def test_quick_start_is_make_demo_and_make_test() -> None:
    quick = README.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", quick, re.S)
    assert block is not None, "the quick start has no sh block"
    commands = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
    assert "exec make test" in (REPO / ".ci" / "run").read_text(encoding="utf-8")
