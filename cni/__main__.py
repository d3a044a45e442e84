"""Multicall entry: the plugin is the executable's name (frozen: /opt/cni/bin/macvlan -> macvlan),
or the first argument (`python -m cni macvlan`). Tools of the bundle (the installer) dispatch the same way."""

from __future__ import annotations

import io
import os
import sys

from cni.buildid import build_id

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the shim path does not import typing
if TYPE_CHECKING:
    from typing import IO, Any

class _Ran:
    plugin_call = False  # main() ran a plugin call (CNI_COMMAND set, not a tool): see run()


def _tool(name: str, argv: list[str]) -> int:
    import importlib

    from cni.registry import TOOLS

    module: Any = importlib.import_module(TOOLS[name])
    return int(module.main(argv))


def main(argv: list[str] | None = None) -> int:
    from cni.registry import TOOLS, entries, resolve

    argv = sys.argv if argv is None else argv
    name, rest = resolve(os.path.basename(argv[0])), argv[1:]
    if name is None:
        name = resolve(rest[0]) if rest else None
        if name is None:
            sys.stderr.write(f"usage: {os.path.basename(argv[0])} PLUGIN  (one of: {', '.join(entries())})\n")
            return 2
        rest = rest[1:]
    if name in TOOLS and not (rest == [] and os.environ.get("CNI_COMMAND") == "VERSION"):
        return _tool(name, rest)
    stdin: IO[bytes] = sys.stdin.buffer
    _Ran.plugin_call = bool(os.environ.get("CNI_COMMAND")) and name not in TOOLS
    try:
        if _Ran.plugin_call:
            served, stdin = _via_agent(name, stdin)
            if served is not None:
                return served
        from cni.skel import run

        about = "" if os.environ.get("CNI_COMMAND") else f"pycni {name} {build_id()}"
        return run(name, os.environ, stdin, sys.stdout.buffer, about)
    finally:
        sys.stdout.flush()


def _via_agent(name: str, stdin: IO[bytes]) -> tuple[int | None, IO[bytes]]:
    """Hand the call to the node-local agent (cni.agent). (exit code, _) when it answered; (None, the
    stdin to run in-process with) when it did not take the request."""
    from cni.agent import client

    path = client.fifo_path(os.environ)
    if path is None:
        return None, stdin
    try:
        data = stdin.read()
    except OSError:
        return None, stdin  # in-process reports it (code 5) exactly as always
    bundle = sys.executable if getattr(sys, "frozen", False) else ""
    try:
        rc, out = client.exchange(path, name, build_id(), bundle, data)
    except client.Unreachable:
        return None, io.BytesIO(data)
    except client.Lost as e:
        rc, out = 1, client.lost_error(data, str(e))
    sys.stdout.buffer.write(out)
    return rc, stdin


def run() -> None:
    """The process's entry (`python -m cni`, and bundler/entry.py in the frozen bundle): exit with
    main()'s code. A plugin call that returned exits at once (os._exit) once stdout and stderr are
    flushed: the interpreter's finalisation (module teardown, GC) would add to each call, and
    nothing of the call is left to it (no atexit handler, no thread of ours, the store closed, log lines
    written straight to their fds). Tools (the installer, the agent, the CLI) exit normally."""
    rc = main()
    if _Ran.plugin_call:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # the interpreter's own exit reports it, as it always has
            sys.exit(rc)
        os._exit(rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
