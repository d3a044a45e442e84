"""`python -X importtime` for one plugin call from source: run it, parse the profile, summarise it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni import jsonio

# Packages worth knowing about when they load on a plugin call (each costs milliseconds).
HEAVY = ("asyncio", "ssl", "multiprocessing", "concurrent", "email", "http", "xml", "logging", "json",
         "inspect", "pickle")


@dataclass(frozen=True)
class Entry:
    name: str
    self_us: int
    cumulative_us: int
    depth: int


@dataclass(frozen=True)
class Profile:
    entries: tuple[Entry, ...]
    rc: int
    stdout: bytes

    @staticmethod
    def parse(stderr: str, rc: int = 0, stdout: bytes = b"") -> Profile:
        entries = []
        for line in stderr.splitlines():
            if not line.startswith("import time:") or "imported package" in line:
                continue
            self_us, cumulative, name = line[len("import time:"):].split("|", 2)
            depth = (len(name) - len(name.lstrip(" ")) - 1) // 2
            entries.append(Entry(name.strip(), int(self_us), int(cumulative), depth))
        return Profile(tuple(entries), rc, stdout)

    @property
    def total_us(self) -> int:
        """All import time of the process: the sum of every module's own time."""
        return sum(e.self_us for e in self.entries)

    def names(self) -> set[str]:
        return {e.name for e in self.entries}

    def top_self(self, n: int) -> list[Entry]:
        return sorted(self.entries, key=lambda e: -e.self_us)[:n]

    def top_level(self) -> list[Entry]:
        """Imports made at depth 0 (by the interpreter, site, or our entry point), by cumulative time."""
        return sorted((e for e in self.entries if e.depth == 0), key=lambda e: -e.cumulative_us)

    def matching(self, prefix: str) -> list[str]:
        return [e.name for e in self.entries if e.name == prefix or e.name.startswith(prefix + ".")]

    def heavy_loaded(self) -> list[str]:
        return [h for h in HEAVY if h in self.names()]

    def importer(self, name: str) -> str:
        """Who imported `name` first: -X importtime prints children before their parent, so the parent
        is the next entry one level up."""
        for i, e in enumerate(self.entries):
            if e.name == name:
                return next((p.name for p in self.entries[i + 1:] if p.depth < e.depth), "<interpreter>")
        return ""


def profile_call(host: str, entry: Path, env: Mapping[str, str], conf: Mapping[str, Any]) -> Profile:
    """Run the from-source entry `entry` under -X importtime inside namespace `host`."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYTHON"))}
    full.update(env)
    cmd = ["ip", "netns", "exec", host, sys.executable, "-I", "-X", "importtime", str(entry)]
    proc = subprocess.run(cmd, input=jsonio.dumps(dict(conf)), env=full, capture_output=True, check=False)
    return Profile.parse(proc.stderr.decode(errors="replace"), proc.returncode, proc.stdout)
