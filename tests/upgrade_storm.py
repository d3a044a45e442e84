"""Run installed plugin entries in a tight loop while the installer upgrades them: the promise is zero
ETXTBSY, zero exec-format errors and zero partial JSON."""

from __future__ import annotations

import errno
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bundler import install
from cni import jsonio
from tests.bundle_layouts import opts, version_call


@dataclass
class Storm:
    calls: int = 0
    upgrades: int = 0
    failures: Counter[str] = field(default_factory=Counter)
    switches: int = 0  # upgrades after which the entries pointed at another copy
    expired: int = 0  # retired copies removed (grace passed) while the loop ran


def _invoke(entry: Path, storm: Storm) -> None:
    try:
        call = version_call(entry)
    except OSError as e:
        storm.failures[errno.errorcode.get(e.errno or 0, str(e))] += 1
        return
    try:
        doc = jsonio.loads(call.stdout)
        ok = call.returncode == 0 and "supportedVersions" in doc
    except Exception:
        ok = False
        storm.failures["bad JSON"] += 1
    if not ok:
        storm.failures[f"rc={call.returncode} {call.stdout[:80]!r} {call.stderr[-200:]!r}"] += 1


def run(sources: tuple[Path, Path], bin_dir: Path, conf_dir: Path, entry: str,
        invocations: int = 1000, upgrades: int = 20, grace: float = 5.0) -> Storm:
    """`grace` is far longer than one call, short enough that old copies expire during the storm."""
    storm = Storm()
    install.install_once(opts(bin_dir, conf_dir, sources[0], "--grace", str(grace)))
    step = max(1, invocations // (upgrades + 1))
    progress = threading.Condition()

    def upgrader() -> None:
        for k, src in zip(range(1, upgrades + 1), itertools.cycle((sources[1], sources[0])), strict=False):
            with progress:
                progress.wait_for(lambda k=k: storm.calls >= k * step)
            before = install.state.load(bin_dir).current
            install.install_once(opts(bin_dir, conf_dir, src, "--grace", str(grace)))
            st = install.state.load(bin_dir)
            storm.switches += st.current != before
            storm.expired = k - len(st.retired)  # each upgrade retired one copy
            storm.upgrades += 1

    t = threading.Thread(target=upgrader, daemon=True)
    t.start()
    for _ in range(invocations):
        _invoke(bin_dir / entry, storm)
        with progress:
            storm.calls += 1
            progress.notify_all()
    t.join(timeout=120)
    return storm
