"""Run installed plugin entries in a tight loop while the installer upgrades them: the promise is zero
ETXTBSY, zero exec-format errors and zero partial JSON for every call made while the upgrades run,
whichever side is faster (the calls go on until the last upgrade is done)."""

from __future__ import annotations

import errno
import itertools
import threading
import time
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
    error: str = ""  # the upgrader's exception, if any

    def unfinished(self, upgrades: int) -> str:
        """Why fewer than `upgrades` upgrades were done (the hang guard, or an upgrade failed)."""
        why = self.error or "the hang guard stopped the storm"
        return f"{self.upgrades} of {upgrades} upgrades in {self.calls} calls: {why}"


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
        invocations: int = 1000, upgrades: int = 20, grace: float = 5.0, hang_guard: float = 900.0) -> Storm:
    """At least `invocations` calls, and calls go on until all `upgrades` are done, however fast either
    side runs: upgrade k waits for k/(upgrades+1) of the calls, and the upgrades are spread over at
    least 2.375 x `grace`, so copies retired early expire (are removed) while later upgrades run and
    calls go on. `grace` is far longer than one call. `hang_guard` only stops a hung storm."""
    storm = Storm()
    install.install_once(opts(bin_dir, conf_dir, sources[0], "--grace", str(grace)))
    step = max(1, invocations // (upgrades + 1))
    spacing = 2.5 * grace / upgrades
    progress = threading.Condition()
    done = threading.Event()
    deadline = time.monotonic() + hang_guard
    first = 0.0

    def upgrader() -> None:
        nonlocal first
        try:
            pairs = zip(range(1, upgrades + 1), itertools.cycle((sources[1], sources[0])), strict=False)
            for k, src in pairs:
                with progress:
                    progress.wait_for(lambda k=k: storm.calls >= k * step or time.monotonic() > deadline)
                first = first or time.monotonic()
                time.sleep(max(0.0, first + (k - 1) * spacing - time.monotonic()))
                before = install.state.load(bin_dir).current
                install.install_once(opts(bin_dir, conf_dir, src, "--grace", str(grace)))
                st = install.state.load(bin_dir)
                storm.switches += st.current != before
                storm.expired = k - len(st.retired)  # each upgrade retired one copy
                storm.upgrades += 1
        except Exception as e:
            storm.error = f"upgrade {storm.upgrades + 1} failed: {e!r}"
        finally:
            done.set()

    t = threading.Thread(target=upgrader, daemon=True)
    t.start()
    while (storm.calls < invocations or not done.is_set()) and time.monotonic() < deadline:
        _invoke(bin_dir / entry, storm)
        with progress:
            storm.calls += 1
            progress.notify_all()
    t.join(timeout=max(1.0, deadline - time.monotonic()))
    if t.is_alive():
        storm.error = "the upgrader was still running at the hang guard"
    return storm
