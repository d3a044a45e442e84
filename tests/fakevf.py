"""A recording VfControl for tests: installed as the VF seam (cni.sriov.vf.factory) by tests/launch.py
`--fake-pf STATE` or by a test in-process; the product has no way to select it.

The state file is JSON shared by every plugin process of a test:

  {"pfs": {"<pf>": {"vfs": {"<n>": {<VfState fields>}}, "unsupported": ["vlan", ...]}},
   "fail": {"<kind>": "<message>", "<kind>@<n>": "<message>", "read": "<message>"},
   "calls": [{"op": "read", "pf": .., "vf": ..}, {"op": "set", "pf": .., "vf": .., "kind": .., <fields>}]}

Every request is appended to "calls" (a refused one too) so a test can compare the exact sequence;
a set updates the VF's state. "unsupported" kinds fail like a driver without that operation;
a "fail" entry fails the next request of its kind, or with "@n" the n-th one (counting from the start
of "calls"), once: the entry is consumed. That injects a fault at one step, e.g. in a rollback."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from typing import Any

from cni import jsonio
from cni.errors import KernelError
from cni.sriov.vf import Setting, VfState


class FakeVf:
    def __init__(self, path: str) -> None:
        self.path = path

    @contextlib.contextmanager
    def _state(self) -> Iterator[dict[str, Any]]:
        with open(self.path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with open(self.path, "rb") as fh:
                state: dict[str, Any] = jsonio.loads(fh.read(), self.path)
            try:
                yield state
            finally:
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as fh:
                    fh.write(jsonio.dumps(state, indent=True))
                os.replace(tmp, self.path)

    def _vf(self, state: dict[str, Any], pf: str, vf: int, op: str) -> dict[str, Any]:
        pfs = state.get("pfs", {})
        if pf not in pfs:
            raise KernelError(f"PF {pf}: {op}: No such device")
        vfs = pfs[pf].setdefault("vfs", {})
        if str(vf) not in vfs:
            raise KernelError(f"PF {pf}: reports no VF {vf}")
        entry: dict[str, Any] = vfs[str(vf)]
        return entry

    def read(self, pf: str, vf: int) -> VfState:
        with self._state() as state:
            state.setdefault("calls", []).append({"op": "read", "pf": pf, "vf": vf})
            message = state.get("fail", {}).pop("read", None)
            if message:
                raise KernelError(f"PF {pf}: read VF {vf}: {message}")
            return VfState.from_dict(self._vf(state, pf, vf, "read"))

    def set(self, pf: str, vf: int, setting: Setting) -> None:
        with self._state() as state:
            state.setdefault("calls", []).append({"op": "set", "pf": pf, "vf": vf, "kind": setting.kind,
                                                  **setting.fields()})
            op = f"set VF {vf} {setting.describe()}"
            entry = self._vf(state, pf, vf, op)
            if setting.kind in state["pfs"][pf].get("unsupported", []):
                raise KernelError(f"PF {pf}: {op}: Operation not supported")
            nth = sum(1 for c in state["calls"] if c.get("kind") == setting.kind)
            fail = state.get("fail", {})
            message = fail.pop(setting.kind, None) or fail.pop(f"{setting.kind}@{nth}", None)
            if message:
                raise KernelError(f"PF {pf}: {op}: {message}")
            entry.update(setting.applied_to(VfState.from_dict(entry)).to_dict())
