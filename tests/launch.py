"""The test launcher: a plugin run from source with test seams installed, for the subprocess tests that
need them. The product has none of this: its fault points (cni/faults.py) and its VF seam
(cni.sriov.vf.factory) can only be set from inside the process, which this launcher does from its own
arguments before running the normal entry point (`python -m cni PLUGIN`, cni.__main__.main):

  python -m tests.launch [--faults STEP[,STEP...]] [--fake-pf STATE.json] [--] PLUGIN [ARGS...]

--faults   `step` raises at that step (the plugin's rollback runs), `step!` SIGKILLs the process there
           (nothing runs after it), `step~` SIGSTOPs it there (a stalled node: the test SIGCONTs it).
           The steps are listed in docs/testing.md. An IPAM the plugin
           execs is another process and gets no faults.
--fake-pf  the recording VF seam (tests/fakevf.py) on that state file instead of netlink.

The call runs in this process, never through a node-local agent (which has no seams): a launched call
is the in-process path of the entry. Imports stay minimal: this is on every launched call."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO

USAGE = "usage: python -m tests.launch [--faults STEP[,STEP...]] [--fake-pf STATE.json] [--] PLUGIN [ARGS...]"


def options(faults: str = "", fake_pf: str | os.PathLike[str] | None = None) -> list[str]:
    """The launcher's options for a call (empty: nothing to install)."""
    opts = ["--faults", faults] if faults else []
    return opts + (["--fake-pf", os.fspath(fake_pf)] if fake_pf else [])


def command(plugin: str, faults: str = "", fake_pf: str | os.PathLike[str] | None = None) -> list[str]:
    """argv that runs `plugin` from source through the launcher (the caller sets PYTHONPATH=REPO)."""
    return [sys.executable, "-m", "tests.launch", *options(faults, fake_pf), "--", plugin]


class FaultPlan:
    """A fault hook (cni.faults.hook) from a `--faults` list."""

    def __init__(self, spec: str) -> None:
        self.items = {s for s in spec.split(",") if s}

    def __call__(self, step: str) -> None:
        if f"{step}!" in self.items:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        if f"{step}~" in self.items:
            import signal

            self.items.discard(f"{step}~")  # once: resumed, it goes on
            os.kill(os.getpid(), signal.SIGSTOP)
        if step in self.items:
            from cni.errors import CniError

            raise CniError(f"injected fault at step {step} (tests/launch.py --faults)")


def install(faults: str = "", fake_pf: str | None = None) -> None:
    """Install the seams in this process."""
    if faults:
        from cni import faults as points

        points.hook = FaultPlan(faults)
    if fake_pf:
        from cni.sriov import vf
        from tests.fakevf import FakeVf

        path = fake_pf
        vf.factory = lambda: FakeVf(path)


def _in_process(name: str, stdin: IO[bytes]) -> tuple[int | None, IO[bytes]]:
    return None, stdin


def main(argv: list[str]) -> int:
    faults, fake_pf = "", None
    rest = list(argv)
    while rest and rest[0].startswith("--"):
        flag = rest.pop(0)
        if flag == "--":
            break
        if flag not in ("--faults", "--fake-pf") or not rest:
            sys.stderr.write(USAGE + "\n")
            return 2
        value = rest.pop(0)
        if flag == "--faults":
            faults = value
        else:
            fake_pf = value
    if not rest:
        sys.stderr.write(USAGE + "\n")
        return 2
    install(faults, fake_pf)
    import cni.__main__ as entry

    entry._via_agent = _in_process  # the agent has no seams: the call runs here
    return entry.main(["tests.launch", *rest])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
