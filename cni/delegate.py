"""Run an IPAM: exec the binary named by ipam.type from CNI_PATH with the same config and env, or,
when that binary is this very bundle and the IPAM is one of ours, call it in-process."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from contextvars import ContextVar
from dataclasses import replace
from typing import Any

from cni import log
from cni.errors import CniError, Code, ConfigError, DecodeError
from cni.types.netconf import Request
from cni.types.result import Result, parse

ETXTBSY_TRIES = 5
# The frozen bundle this request came through (None: from source). In a plugin process that is
# sys.executable; the agent sets the calling shim's own executable for each request.
CALLER_BUNDLE: ContextVar[str | None] = ContextVar(
    "pycni_caller_bundle", default=sys.executable if getattr(sys, "frozen", False) else None
)


def find(kind: str, path: tuple[str, ...]) -> str:
    """The executable `kind` in the absolute directories of CNI_PATH."""
    if not kind or "/" in kind or kind in (".", ".."):
        raise ConfigError(f'ipam.type: invalid plugin name "{kind}"')
    for directory in path:
        if not os.path.isabs(directory):
            log.warning("CNI_PATH entry %r ignored: not absolute", directory)
            continue
        candidate = os.path.join(directory, kind)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError(f'ipam.type: plugin "{kind}" not found in CNI_PATH {list(path)}')


def _in_process_module(kind: str, binary: str) -> str | None:
    """Our own IPAM runs in-process when CNI_PATH resolves to this frozen bundle."""
    from cni.registry import IN_PROCESS_IPAM

    module = IN_PROCESS_IPAM.get(kind)
    bundle = CALLER_BUNDLE.get()
    if module is None or bundle is None:
        return None
    return module if os.path.realpath(binary) == os.path.realpath(bundle) else None


def _exec(binary: str, req: Request, command: str) -> bytes:
    env = dict(req.env)
    env["CNI_COMMAND"] = command
    env.pop("PYCNI_TEST_FAULTS", None)  # tests inject faults into the plugin, not into its IPAM
    for attempt in range(ETXTBSY_TRIES):
        try:
            proc = subprocess.run([binary], input=req.stdin, env=env, capture_output=True, check=False)
            break
        except OSError as e:
            if e.errno != errno.ETXTBSY or attempt == ETXTBSY_TRIES - 1:
                raise CniError(f"exec {binary}: {e.strerror}") from None
            time.sleep(0.2 * (attempt + 1))
    if proc.stderr:
        log.raw(proc.stderr)
    if proc.returncode != 0:
        raise _delegate_error(binary, proc.stdout, proc.stderr)
    return proc.stdout


def _delegate_error(binary: str, stdout: bytes, stderr: bytes) -> CniError:
    """The delegate's own error object, code kept, message prefixed with who said it."""
    from cni import jsonio

    name = os.path.basename(binary)
    try:
        obj: Any = jsonio.loads(stdout, "delegate output")
        code, msg = int(obj["code"]), str(obj.get("msg", ""))
        return CniError(f"{name}: {msg}", str(obj.get("details", "")), code=code)
    except (CniError, KeyError, TypeError, ValueError):
        text = (stdout.strip() or stderr).decode(errors="replace").strip()[:500]
        return CniError(f"{name} failed: {text or 'no output'}")


def call(req: Request, command: str) -> bytes:
    """Run the IPAM for `command`; returns its stdout (the result on ADD)."""
    ipam = req.ipam()
    assert ipam is not None
    binary = find(str(ipam["type"]), req.path)
    module = _in_process_module(str(ipam["type"]), binary)
    if module is None:
        return _exec(binary, req, command)
    import importlib

    from cni.skel import FUNCTIONS, dispatch

    sub = replace(req, command=command)
    out = dispatch(importlib.import_module(module), sub) if FUNCTIONS.get(command) else b""
    return out


def add(req: Request) -> Result:
    out = call(req, "ADD")
    from cni import jsonio

    kind = req.ipam()["type"]  # type: ignore[index]
    try:
        raw = jsonio.loads(out, f"ipam {kind} result")
        return parse(raw, req.version, f"ipam {kind} result")
    except CniError as e:
        raise DecodeError(f"ipam plugin {kind} returned an invalid result: {e.msg}", e.details) from None


def delete(req: Request) -> None:
    call(req, "DEL")


def check(req: Request) -> None:
    call(req, "CHECK")


def status(req: Request) -> None:
    call(req, "STATUS")


def gc(req: Request) -> None:
    call(req, "GC")


def require_ips(result: Result, kind: str) -> Result:
    if not result.ips:
        raise CniError(f"ipam plugin {kind} returned no IP addresses", code=Code.INVALID_CONFIG)
    return result
