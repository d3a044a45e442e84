"""docs/install.md's overlay for a node whose CNI directories are not /opt/cni/bin and /etc/cni/net.d,
as an operator copies it: its two files (`my-overlay/kustomization.yaml`, `my-overlay/cni-dirs.yaml`)
taken from the page's yaml blocks, the first byte for byte, the second with only its two values (the
node's directories) changed, beside a `pycni` link to this repository (the overlay names
`../pycni/bundler/manifests`). So the page and what the tests install cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.nsutil import REPO

PAGE = REPO / "docs" / "install.md"
FILES = ("kustomization.yaml", "cni-dirs.yaml")
KEYS = {"bin": "cni-bin-dir", "conf": "cni-conf-dir"}


def blocks(page: Path = PAGE) -> dict[str, str]:
    """The page's yaml blocks whose first line is `# my-overlay/<file>`, by file name."""
    found: dict[str, str] = {}
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        head = re.match(r"# my-overlay/([\w.-]+)", block)
        if head:
            assert head.group(1) not in found, f"{page}: two blocks for my-overlay/{head.group(1)}"
            found[head.group(1)] = block
    missing = [f for f in FILES if f not in found]
    assert not missing, f"{page} shows no yaml block starting with # my-overlay/{missing[0]}"
    return found


def shown_dirs(page: Path = PAGE) -> dict[str, str]:
    """The directories the page's cni-dirs.yaml sets: {"bin": ..., "conf": ...}."""
    data = yaml.safe_load(blocks(page)["cni-dirs.yaml"])["data"]
    assert set(data) == set(KEYS.values()), f"cni-dirs.yaml sets {sorted(data)}, not {sorted(KEYS.values())}"
    return {k: str(data[key]) for k, key in KEYS.items()}


def write(where: Path, bin_dir: str | None = None, conf_dir: str | None = None, page: Path = PAGE) -> Path:
    """`where`/my-overlay as the page shows it (the node's directories, when given, in cni-dirs.yaml)
    and `where`/pycni -> this repository; returns the overlay's directory."""
    found, shown = blocks(page), shown_dirs(page)
    overlay = where / "my-overlay"
    overlay.mkdir(parents=True, exist_ok=True)
    link = where / "pycni"
    if not link.is_symlink():
        link.symlink_to(REPO, target_is_directory=True)
    (overlay / "kustomization.yaml").write_text(found["kustomization.yaml"], encoding="utf-8")
    dirs = found["cni-dirs.yaml"]
    for kind, value in (("bin", bin_dir), ("conf", conf_dir)):
        if value is not None:
            line = f"  {KEYS[kind]}: {shown[kind]}\n"
            assert dirs.count(line) == 1, f"cni-dirs.yaml: no line {line!r}"
            dirs = dirs.replace(line, f"  {KEYS[kind]}: {value}\n")
    (overlay / "cni-dirs.yaml").write_text(dirs, encoding="utf-8")
    return overlay
