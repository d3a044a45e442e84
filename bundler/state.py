"""What the installer put on the host, recorded in <bin dir>/.pycni/state.json, so an upgrade knows what
to retire and `--uninstall` removes exactly that and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bundler import fsutil
from cni import jsonio

HOME = ".pycni"  # our directory inside the CNI bin dir: versioned bundles, displaced files, state
STATE = "state.json"
DISPLACED = "displaced"
DISPLACED_CONF = "displaced-conf"  # foreign conf files we replaced (upstream whereabouts' flat file)


@dataclass
class State:
    current: str = ""  # directory (under HOME) the entries point to
    build: str = ""
    entries: list[str] = field(default_factory=list)  # names in the bin dir that are ours
    displaced: list[str] = field(default_factory=list)  # foreign files we replaced, kept under DISPLACED
    # names we leave to another installer (bundler.binaries.settle_foreign): name -> what was found there
    yielded: dict[str, str] = field(default_factory=dict)
    retired: dict[str, float] = field(default_factory=dict)  # old bundle dir -> time it was retired
    conf_files: list[str] = field(default_factory=list)  # relative to the conf dir
    conf_dirs: list[str] = field(default_factory=list)  # directories we created there
    displaced_conf: list[str] = field(default_factory=list)  # conf files replaced, under DISPLACED_CONF
    bin_dir_created: bool = False

    @staticmethod
    def from_dict(d: dict[str, Any]) -> State:
        return State(
            current=str(d.get("current", "")), build=str(d.get("build", "")),
            entries=[str(x) for x in d.get("entries", [])],
            displaced=[str(x) for x in d.get("displaced", [])],
            yielded={str(k): str(v) for k, v in d.get("yielded", {}).items()},
            retired={str(k): float(v) for k, v in d.get("retired", {}).items()},
            conf_files=[str(x) for x in d.get("conf_files", [])],
            conf_dirs=[str(x) for x in d.get("conf_dirs", [])],
            displaced_conf=[str(x) for x in d.get("displaced_conf", [])],
            bin_dir_created=bool(d.get("bin_dir_created", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"current": self.current, "build": self.build, "entries": sorted(self.entries),
                "displaced": sorted(self.displaced), "yielded": dict(sorted(self.yielded.items())),
                "retired": dict(self.retired),
                "conf_files": sorted(self.conf_files), "conf_dirs": list(self.conf_dirs),
                "displaced_conf": sorted(self.displaced_conf), "bin_dir_created": self.bin_dir_created}


def path(bin_dir: Path) -> Path:
    return bin_dir / HOME / STATE


def load(bin_dir: Path) -> State:
    p = path(bin_dir)
    if p.is_symlink():
        raise RuntimeError(f"{p}: is a symlink; refusing to follow it")
    if not p.exists():
        return State()
    try:
        return State.from_dict(jsonio.loads(p.read_bytes(), str(p)))
    except Exception as e:
        raise RuntimeError(f"{p}: unreadable installer state ({e}); refusing to guess what is ours") from None


def save(bin_dir: Path, st: State) -> None:
    fsutil.write_atomic(path(bin_dir), jsonio.dumps(st.to_dict(), indent=True) + b"\n", 0o600)
