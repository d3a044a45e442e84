"""The dependency locks (bundler/requirements.lock, bundler/requirements-dev.lock) and the checks that the
build freezes exactly what they say.

The locks are `uv pip compile --generate-hashes` output (`make lock`): one `name==version` per
distribution with its `--hash=sha256:...` lines. Standard library only: bundler.build imports this before
anything is known about the environment, and every first-party module is also frozen into the bundle.

`python -m bundler.lock extraneous LOCK`: the installed distributions LOCK does not name (besides the
project itself), one a line; `make venv` uninstalls them so that the virtualenv is exactly the lock.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUNTIME_LOCK = REPO / "bundler" / "requirements.lock"
DEV_LOCK = REPO / "bundler" / "requirements-dev.lock"
PROJECT = "pycni"
HOW_TO_FIX = "run `make venv` to install the lock, or `make lock` after changing pyproject.toml"

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class LockError(Exception):
    pass


@dataclass(frozen=True)
class Pin:
    name: str  # normalized (PEP 503)
    version: str
    hashes: tuple[str, ...]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str, where: str = "lock") -> dict[str, Pin]:
    """`name==version --hash=sha256:...` entries (continuation lines joined, comments dropped). Anything
    else (a range, a marker, a URL, an entry without a hash) is refused: a lock pins exactly."""
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("--hash") else raw.strip()
        if not buf:
            start = no
        cont = line.endswith("\\")
        buf = f"{buf} {line.removesuffix(chr(92)).strip()}".strip()
        if not cont:
            if buf:
                logical.append((start, buf))
            buf = ""
    if buf:
        logical.append((start, buf))
    pins: dict[str, Pin] = {}
    for no, entry in logical:
        head, *opts = entry.split()
        m = _PIN.match(head)
        if not m:
            raise LockError(f"{where}:{no}: not an exact pin `name==version`: {entry[:80]!r}")
        hashes = []
        for opt in opts:
            h = _HASH.match(opt)
            if not h:
                raise LockError(f"{where}:{no}: {m.group(1)}: unexpected {opt[:80]!r} "
                                "(only --hash=sha256:...)")
            hashes.append(h.group(1))
        if not hashes:
            raise LockError(f"{where}:{no}: {m.group(1)} has no --hash")
        name = normalize(m.group(1))
        if name in pins:
            raise LockError(f"{where}:{no}: {name} pinned twice")
        pins[name] = Pin(name, m.group(2), tuple(hashes))
    return pins


def load(path: Path) -> dict[str, Pin]:
    try:
        text = path.read_text()
    except OSError as e:
        raise LockError(f"{path}: cannot read the lock ({e.strerror}); {HOW_TO_FIX}") from None
    return parse(text, str(path))


def requirement_names(requirements: Iterable[str]) -> list[str]:
    """The distribution names of PEP 508 requirement strings (what pyproject.toml declares)."""
    out = []
    for req in requirements:
        m = _NAME.match(req)
        if m:
            out.append(normalize(m.group(1)))
    return out


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(lock: Mapping[str, Pin], declared: Iterable[str],
          installed: Callable[[str], str | None] | None = None) -> list[str]:
    """Problems that make a build unlocked: a declared dependency (runtime or build, from pyproject.toml)
    the lock does not pin, and a locked distribution not installed at exactly its locked version."""
    bad = [f"{name}: declared in pyproject.toml but not in the lock"
           for name in sorted({normalize(n) for n in declared}) if name not in lock]
    installed = installed or installed_version
    for name, pin in sorted(lock.items()):
        have = installed(name)
        if have is None:
            bad.append(f"{name}: locked at {pin.version}, not installed")
        elif have != pin.version:
            bad.append(f"{name}: locked at {pin.version}, installed {have}")
    return bad


def unlocked_distributions(top_level_modules: Iterable[str], lock: Mapping[str, Pin],
                           owners: Mapping[str, list[str]] | None = None) -> dict[str, list[str]]:
    """{distribution: [modules]} for collected top-level modules that belong to an installed distribution
    the lock does not pin (the project itself excepted). `owners` is importlib.metadata's
    packages_distributions(); modules of no distribution (stdlib, first party from source) are fine."""
    owners = importlib.metadata.packages_distributions() if owners is None else owners
    out: dict[str, list[str]] = {}
    for mod in sorted(set(top_level_modules)):
        for dist in owners.get(mod, []):
            name = normalize(dist)
            if name != PROJECT and name not in lock:
                out.setdefault(name, []).append(mod)
    return out


def refuse(problems: list[str], what: str) -> None:
    if problems:
        raise SystemExit(f"pycni bundle: {what}:\n  " + "\n  ".join(problems) + f"\n{HOW_TO_FIX}")


def installed_distributions() -> set[str]:
    return {normalize(d.metadata["Name"]) for d in importlib.metadata.distributions() if d.metadata["Name"]}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "extraneous":
        print(__doc__.strip().rsplit("\n\n", 1)[-1], file=sys.stderr)
        return 2
    lock = load(Path(args[1]))
    for name in sorted(installed_distributions() - set(lock) - {PROJECT}):
        print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
