"""Unit-test helpers: run skel in-process against a fake plugin, build CNI environments."""

from __future__ import annotations

import contextlib
import io
import subprocess
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cni import jsonio, skel
from cni.types.netconf import Request
from cni.types.result import Result
from ipam import decide
from ipam.allocator import Decision, decision, segments_as_offsets
from ipam.decide import SnapshotView
from ipam.model import Allocation, Pool, PoolView
from ipam.operation import DECIDED, WRITTEN, Op
from ipam.ranges import IPRange

FAKE = "fakeplug"


def env_for(command: str, **extra: str) -> dict[str, str]:
    """A complete, valid environment for `command` (what a runtime sends)."""
    env = {"CNI_COMMAND": command, "CNI_PATH": "/nonexistent-cni-bin"}
    if command in ("ADD", "CHECK", "DEL"):
        env |= {"CNI_CONTAINERID": "c0ffee", "CNI_IFNAME": "net1"}
    if command in ("ADD", "CHECK"):
        env["CNI_NETNS"] = "/run/netns/pycni-unit-absent"
    env.update(extra)
    return env


def conf(version: str | None = "1.1.0", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": "unitnet", "type": FAKE}
    if version is not None:
        out["cniVersion"] = version
    out.update(extra)
    return out


@dataclass
class Outcome:
    rc: int
    stdout: bytes

    @property
    def obj(self) -> Any:
        return jsonio.loads(self.stdout)


@dataclass
class FakePlugin:
    """A plugin module whose functions record the requests they get."""

    result: Result = field(default_factory=Result)
    calls: list[Request] = field(default_factory=list)
    raise_on: dict[str, BaseException] = field(default_factory=dict)

    def module(self) -> types.ModuleType:
        mod = types.ModuleType(f"tests.unit.{FAKE}")
        for command, name in skel.FUNCTIONS.items():
            setattr(mod, name, self._fn(command))
        return mod

    def _fn(self, command: str) -> Callable[[Request], Any]:
        def fn(req: Request) -> Any:
            self.calls.append(req)
            if command in self.raise_on:
                raise self.raise_on[command]
            return self.result if command == "ADD" else None

        return fn

    @property
    def commands(self) -> list[str]:
        return [r.command for r in self.calls]


def run(env: dict[str, str], stdin: bytes | dict[str, Any] | str = b"") -> Outcome:
    """skel.run in-process with the fake plugin."""
    if isinstance(stdin, dict):
        stdin = jsonio.dumps(stdin)
    elif isinstance(stdin, str):
        stdin = stdin.encode()
    out = io.BytesIO()
    rc = skel.run(FAKE, env, io.BytesIO(stdin), out)
    return Outcome(rc, out.getvalue())


@contextlib.contextmanager
def reaped() -> Iterator[list[subprocess.Popen[Any]]]:
    """The processes a test appends to the list: at the end each one still running is killed, and every
    one is waited for (its pipes read to their end)."""
    procs: list[subprocess.Popen[Any]] = []
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def in_threads(n: int, call: Callable[[int], Any], timeout: float = 60.0) -> list[Any]:
    """call(i) for i in range(n), in n threads released together; their answers. Fails if a call
    raised or did not return within `timeout` seconds."""
    out: list[Any] = [None] * n
    errors: list[BaseException] = []
    start = threading.Barrier(n)

    def run(i: int) -> None:
        start.wait()
        try:
            out[i] = call(i)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not [t for t in threads if t.is_alive()], "a call did not return"
    assert not errors, errors
    return out


class Counted:
    """A fault hook (cni.faults) that counts the steps it sees and passes each on to `then` (another hook,
    if any): e.g. `combiner-queued`, one per call queued on a pool's combiner (ipam.combiner)."""

    def __init__(self, then: Callable[[str], None] | None = None) -> None:
        self.seen: dict[str, int] = {}
        self.then = then
        self.lock = threading.Lock()

    def __call__(self, step: str) -> None:
        with self.lock:
            self.seen[step] = self.seen.get(step, 0) + 1
        if self.then is not None:
            self.then(step)

    def __getitem__(self, step: str) -> int:
        with self.lock:
            return self.seen.get(step, 0)


def written(op: Op) -> None:
    """A fake batch executor's "written": `op` decided, then written (ipam.operation.Op.to)."""
    op.to(DECIDED)
    op.to(WRITTEN)


def decided(rng: IPRange, pool: Pool | PoolView, owner: Allocation, **add: Any) -> Decision:
    """One ADD decided as the executor decides it (ipam.attempt: the core's ipam.decide.add, then
    ipam.allocator.decision, which raises the CNI errors); `add`: the other fields of ipam.decide.Add."""
    view = SnapshotView(pool) if isinstance(pool, Pool) else pool
    outcome = decide.add(view, decide.Add(owner, **add), segments_as_offsets(rng))
    return decision(rng, view, owner, outcome)
