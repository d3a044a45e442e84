"""The plugin entry as a shim (`python -m cni macvlan` with an agent socket): what it imports when the
agent answers, what it prints when the agent is lost mid-request, and that a refused request runs
in-process with the very output of PYCNI_AGENT=off. A scripted agent (tests.agentutil.fake_agent)
stands in for the real one, so these run without root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from cni import jsonio
from cni.agent import proto
from tests.agentutil import fake_agent, listener
from tests.nsutil import REPO
from tests.unit.test_import_cost import modules

SHIM_MODULES = {"cni", "cni.registry", "cni.agent", "cni.agent.client", "cni.agent.proto"}
SLOW_STDLIB = ("typing", "socket", "selectors", "array", "collections", "enum", "contextlib", "dataclasses",
               "subprocess", "logging", "json")
ADD = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/none", "CNI_IFNAME": "net1",
       "CNI_PATH": "/usr/lib/cni"}
CONF = {"cniVersion": "0.4.0", "name": "n", "type": "macvlan", "master": "none", "ipam": {"type": "x"}}


def shim(sock: Path, env: dict[str, str], *opts: str) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CNI_", "PYCNI_AGENT"))}
    full |= {"PYCNI_AGENT_SOCKET": str(sock), "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, *opts, "-m", "cni", "macvlan"], input=jsonio.dumps(CONF),
                          env=full, capture_output=True, timeout=60, check=False)


def answer(reply: bytes) -> object:
    def script(conn: socket.socket, r: proto.Reader) -> None:
        proto.send(conn, proto.READY)
        r.expect(proto.GO)
        proto.send(conn, proto.ANSWER, reply)

    return script


def test_served_call_imports_only_stdlib_orjson_and_the_shim(tmp_path: Path) -> None:
    sock = tmp_path / "a.sock"
    t = fake_agent(sock, answer(b'0\0{"cniVersion":"0.4.0"}\n'))
    p = shim(sock, ADD, "-X", "importtime")
    t.join()
    assert (p.returncode, p.stdout) == (0, b'{"cniVersion":"0.4.0"}\n')
    mods = modules(p.stderr.decode())
    after_startup = mods[mods.index("runpy") + 1 :]  # what `python -c pass` imports is not the shim's
    ours = {m for m in after_startup if m.split(".")[0] in ("cni", "ipam", "bundler")}
    assert ours == SHIM_MODULES
    foreign = [m for m in after_startup if m.split(".")[0] not in (*sys.stdlib_module_names, "cni")]
    assert foreign == []  # not even orjson: it is only needed for the rare code-11 answer
    # and none of the stdlib modules that cost milliseconds on every call (measured: bundler/README.md),
    # but for the public socket module and what it imports itself (issue 27: no private modules)
    slow = [m for m in after_startup if m in SLOW_STDLIB and m not in socket_closure()]
    assert slow == [], after_startup


def socket_closure() -> set[str]:
    """What `import socket` loads into a bare interpreter."""
    code = "import sys; before = set(sys.modules); import socket; print(*sorted(set(sys.modules) - before))"
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_agent_lost_after_go_answers_code_11_and_does_not_run_in_process(tmp_path: Path) -> None:
    sock = tmp_path / "a.sock"

    def script(conn: socket.socket, r: proto.Reader) -> None:
        proto.send(conn, proto.READY)
        r.expect(proto.GO)  # then the "agent" dies without an answer

    t = fake_agent(sock, script)
    p = shim(sock, ADD)
    t.join()
    out = jsonio.loads(p.stdout)
    assert p.returncode == 1 and out["code"] == 11 and out["cniVersion"] == "0.4.0", out
    # an in-process run would have answered code 3 (no such netns) and said so on stderr
    assert p.stderr == b""


def test_refused_runs_in_process_exactly_as_with_the_agent_off(tmp_path: Path) -> None:
    sock = tmp_path / "a.sock"
    t = fake_agent(sock, lambda conn, r: proto.send(conn, proto.REFUSED, b"busy"))
    refused = shim(sock, ADD)
    t.join()
    off = shim(sock, {**ADD, "PYCNI_AGENT": "off"})
    none = shim(tmp_path / "missing.sock", ADD)
    assert refused.returncode == off.returncode == none.returncode == 1
    assert refused.stdout == off.stdout == none.stdout
    assert jsonio.loads(off.stdout)["code"] == 3  # the in-process answer: no such network namespace


def test_an_agent_that_never_accepts_keeps_nothing_of_the_caller(tmp_path: Path) -> None:
    """Issue 28: the shim gives up waiting for READY and runs the call in-process; the runtime reads its
    output until end of file, which comes when the shim exits: none of its descriptors (stderr above
    all) was left in flight in the agent's backlog, where nobody would ever read or close it."""
    sock = tmp_path / "a.sock"
    hung = listener(sock)
    try:
        given_up = shim(sock, {**ADD, "PYCNI_AGENT_TIMEOUT": "0.2"})  # TimeoutExpired: a pipe held open
        off = shim(sock, {**ADD, "PYCNI_AGENT": "off"})
    finally:
        hung.kill()
        hung.wait()
    assert given_up.returncode == off.returncode == 1
    assert given_up.stdout == off.stdout and jsonio.loads(off.stdout)["code"] == 3
