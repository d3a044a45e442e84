"""The plugin entry as a shim (`python -m cni macvlan` with an agent FIFO): what it imports when the
agent answers, what it prints when the agent is lost mid-request, and that a refused request runs
in-process with the very output of PYCNI_AGENT=off. A scripted agent (tests.agentutil.fake_agent)
stands in for the real one, so these run without root."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cni import jsonio
from cni.agent import proto
from tests.agentutil import Claimed, fake_agent, listener
from tests.nsutil import REPO
from tests.unit.test_import_cost import modules

SHIM_MODULES = {"cni", "cni.buildid", "cni.procs", "cni.registry", "cni.agent", "cni.agent.client",
                "cni.agent.proto"}
SLOW_STDLIB = ("typing", "socket", "selectors", "array", "collections", "enum", "contextlib", "dataclasses",
               "subprocess", "logging", "json", "stat")
ADD = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/none", "CNI_IFNAME": "net1",
       "CNI_PATH": "/usr/lib/cni"}
CONF = {"cniVersion": "0.4.0", "name": "n", "type": "macvlan", "master": "none", "ipam": {"type": "x"}}


def shim(fifo: Path, env: dict[str, str], *opts: str) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_AGENT"))}
    # patient for the scripted agent's word (a loaded machine), unless the test says otherwise
    full |= {"PYCNI_AGENT_FIFO": str(fifo), "PYTHONPATH": str(REPO), "PYCNI_AGENT_TIMEOUT": "120", **env}
    return subprocess.run([sys.executable, *opts, "-m", "cni", "macvlan"], input=jsonio.dumps(CONF),
                          env=full, capture_output=True, timeout=60, check=False)


def answer(reply: bytes) -> Callable[[Claimed], None]:
    def script(c: Claimed) -> None:
        c.send(proto.READY)
        c.send(proto.ANSWER, reply)

    return script


def test_served_call_imports_only_stdlib_orjson_and_the_shim(tmp_path: Path) -> None:
    fifo = tmp_path / "a.fifo"
    t = fake_agent(fifo, answer(b'0\0{"cniVersion":"0.4.0"}\n'))
    p = shim(fifo, ADD, "-X", "importtime")
    t.join()
    assert (p.returncode, p.stdout) == (0, b'{"cniVersion":"0.4.0"}\n')
    mods = modules(p.stderr.decode())
    after_startup = mods[mods.index("runpy") + 1 :]  # what `python -c pass` imports is not the shim's
    ours = {m for m in after_startup if m.split(".")[0] in ("cni", "ipam", "bundler")}
    assert ours == SHIM_MODULES
    foreign = [m for m in after_startup if m.split(".")[0] not in (*sys.stdlib_module_names, "cni")]
    assert foreign == []  # not even orjson: it is only needed for the rare code-11 answer
    # and none of the stdlib modules that cost milliseconds on every call (measured: bundler/README.md,
    # docs/benchmarks.md): `socket` above all, with the `enum` and `selectors` it imports
    slow = [m for m in after_startup if m in SLOW_STDLIB]
    assert slow == [], after_startup


def test_agent_lost_after_ready_answers_code_11_and_does_not_run_in_process(tmp_path: Path) -> None:
    fifo = tmp_path / "a.fifo"

    def script(c: Claimed) -> None:
        c.send(proto.READY)  # then the "agent" dies without an answer

    t = fake_agent(fifo, script)
    p = shim(fifo, ADD)
    t.join()
    out = jsonio.loads(p.stdout)
    assert p.returncode == 1 and out["code"] == 11 and out["cniVersion"] == "0.4.0", out
    # an in-process run would have answered code 3 (no such netns) and said so on stderr
    assert p.stderr == b""


def test_refused_runs_in_process_exactly_as_with_the_agent_off(tmp_path: Path) -> None:
    fifo = tmp_path / "a.fifo"
    t = fake_agent(fifo, lambda c: c.send(proto.REFUSED, b"busy"))
    refused = shim(fifo, ADD)
    t.join()
    off = shim(fifo, {**ADD, "PYCNI_AGENT": "off"})
    none = shim(tmp_path / "missing.fifo", ADD)
    assert refused.returncode == off.returncode == none.returncode == 1
    assert refused.stdout == off.stdout == none.stdout
    assert jsonio.loads(off.stdout)["code"] == 3  # the in-process answer: no such network namespace


def test_an_agent_that_never_accepts_keeps_nothing_of_the_caller(tmp_path: Path) -> None:
    """Issue 28: the shim gives up waiting for READY and runs the call in-process; the runtime reads its
    output until end of file, which comes when the shim exits: none of its descriptors (stderr above
    all) was left with an agent that never read its FIFO (a request line holds no descriptor)."""
    fifo = tmp_path / "a.fifo"
    hung = listener(fifo)
    try:
        given_up = shim(fifo, {**ADD, "PYCNI_AGENT_TIMEOUT": "0.2"})  # TimeoutExpired: a pipe held open
        off = shim(fifo, {**ADD, "PYCNI_AGENT": "off"})
    finally:
        hung.kill()
        hung.wait()
    assert given_up.returncode == off.returncode == 1
    assert given_up.stdout == off.stdout and jsonio.loads(off.stdout)["code"] == 3
