"""The plugin main: validate env and stdin, gate by cniVersion, dispatch, print the result or the
error object. `run` takes env, stdin and the output streams so it is testable without a process."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping

from cni import faults, log, spec
from cni.errors import CniError, Code, ConfigError, DecodeError, EnvError
from cni.netns import stat as netns_stat
from cni.types import fields as f
from cni.types.args import CniArgs
from cni.types.args import parse as parse_args
from cni.types.netconf import Request
from cni.types.valueclass import replace

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import IO, Any

FUNCTIONS = {"ADD": "add", "DEL": "delete", "CHECK": "check", "GC": "gc", "STATUS": "status"}
NEEDS = {  # which CNI_* each command requires (CNI_NETNS is optional on DEL, CNI_PATH on STATUS)
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": (),
}
IFNAMSIZ = 16
ENV_VARS = ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH")


def ifname_problem(name: str) -> str | None:
    size = len(os.fsencode(name))  # bytes as the kernel counts them, undecodable ones included
    if size == 0:
        return "is empty"
    if size >= IFNAMSIZ:
        return f"is {size} bytes long (at most {IFNAMSIZ - 1})"
    if name in (".", ".."):
        return "may not be . or .."
    if any("\udc80" <= ch <= "\udcff" for ch in name):  # undecodable bytes (surrogateescape)
        return "is not valid UTF-8 (a result could not name it)"
    for ch in name:
        if ch in "/:" or ch.isspace():
            return f"contains {ch!r}"
    return None


def check_env(command: str, env: Mapping[str, str]) -> CniArgs:
    """The parsed CNI_ARGS; raise code 4 naming every missing or invalid variable at once."""
    missing = [k for k in NEEDS[command] if not env.get(k)]
    invalid = [f"{k} (contains a NUL byte)" for k in ENV_VARS if "\x00" in env.get(k, "")]  # never via exec
    cid = env.get("CNI_CONTAINERID", "")
    if cid and "\x00" not in cid and not f.valid_name(cid):
        invalid.append(f'CNI_CONTAINERID "{cid}" (must match {f.NAME_PATTERN})')
    ifname = env.get("CNI_IFNAME")
    problem = ifname_problem(ifname) if ifname and "\x00" not in ifname else None
    if problem:
        invalid.append(f'CNI_IFNAME "{ifname}" {problem}')
    args = CniArgs()
    try:
        args = parse_args(env.get("CNI_ARGS", "").replace("\x00", ""))
    except EnvError as e:
        invalid.append(e.msg)
    parts = []
    if missing:
        parts.append("missing " + ", ".join(missing))
    if invalid:
        parts.append("invalid " + "; ".join(invalid))
    if parts:
        raise EnvError("; ".join(parts))
    return args


def check_not_own_netns(netns: str, env: Mapping[str, str]) -> None:
    """CNI_NETNS must not be the plugin's own namespace (code 8): a DEL there would remove host links."""
    if not netns or env.get("CNI_NETNS_OVERRIDE", "").lower() in ("1", "true"):
        return
    try:
        target, own = netns_stat(netns), os.stat("/proc/thread-self/ns/net")
    except OSError:
        return  # missing or unreadable: the plugin reports it in context
    if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
        raise CniError(f"CNI_NETNS {netns} is the plugin's own network namespace", code=Code.INVALID_NETNS)


def parse_request(command: str, env: Mapping[str, str], stdin: bytes) -> Request:
    args = check_env(command, env)
    conf = _decode(stdin)
    version = conf.get("cniVersion")
    if version is None or version == "":
        version = spec.DEFAULT
    version = f.typed(version, str, "cniVersion")
    try:
        spec.gate(command, version)
        f.name(f.req(conf, "name", str, ""), "name")
        f.opt(conf, "type", str, "")
        netns = env.get("CNI_NETNS", "")
        check_not_own_netns(netns, env)
    except CniError as e:
        # the error object speaks the config's version, unless that is one we do not speak
        e.version = version if version in spec.SUPPORTED else spec.LATEST  # type: ignore[attr-defined]
        raise
    return Request(
        command=command,
        version=version,
        conf=conf,
        stdin=stdin,
        container_id=env.get("CNI_CONTAINERID", ""),
        netns=netns,
        ifname=env.get("CNI_IFNAME", ""),
        args=args,
        path=tuple(p for p in env.get("CNI_PATH", "").split(":") if p),
        env=env,
    )


def _decode(stdin: bytes) -> dict[str, Any]:
    from cni import jsonio

    if not stdin.strip():
        raise DecodeError("stdin: empty network configuration")
    conf = jsonio.loads(stdin, "network configuration")
    if not isinstance(conf, dict):
        raise DecodeError(f"network configuration: expected a JSON object, got {type(conf).__name__}")
    return conf


def version_text() -> bytes:
    from cni import jsonio

    return jsonio.dumps({"cniVersion": spec.LATEST, "supportedVersions": list(spec.SUPPORTED)}) + b"\n"


def _printable(text: str) -> str:
    """Text safe for JSON: bytes that were not UTF-8 (in env vars or paths) become U+FFFD."""
    return text.encode(errors="surrogateescape").decode(errors="replace")


def error_text(err: CniError, version: str) -> bytes:
    from cni import jsonio

    obj = {"cniVersion": version, "code": int(err.code), "msg": _printable(err.msg)}
    return jsonio.dumps({**obj, "details": _printable(err.details)}) + b"\n"


def dispatch(module: Any, req: Request) -> bytes:
    """Call the plugin function for req.command; return what goes to stdout."""
    from cni.types.result import to_wire

    wire = outcome(module, req, to_wire)
    if wire is None:
        return b""
    from cni import jsonio

    return jsonio.dumps(wire) + b"\n"


def outcome[T](module: Any, req: Request, form: Callable[[Any, str], T]) -> T | None:
    """Call the plugin function for req.command (not implemented means success, as in the reference
    skel); on ADD its result in the request's version through `form` (the wire form to print, or the
    Result an in-process caller takes: cni.delegate), the ADD undone when that version cannot carry
    it."""
    fn = getattr(module, FUNCTIONS[req.command], None)
    if fn is None:
        return None
    result = fn(req)
    if req.command != "ADD":
        return None
    try:
        return form(result, req.version)
    except CniError:
        _rollback(module, req)
        raise


def _rollback(module: Any, req: Request) -> None:
    """The result cannot be given in the requested version: undo the ADD before failing."""

    try:
        module.delete(replace(req, command="DEL"))
    except Exception as e:  # reported in the log; the original error is what the caller sees
        log.error("rollback after failed result conversion: %s", e)


def run(plugin: str, env: Mapping[str, str], stdin: IO[bytes], stdout: IO[bytes], about: str = "") -> int:
    """Execute one CNI call; returns the process exit code."""
    command = env.get("CNI_COMMAND", "")
    if not command:
        text = about or f"pycni {plugin}"
        os.write(2, f"{text}\nCNI protocol versions supported: {', '.join(spec.SUPPORTED)}\n".encode())
        return 0
    version = spec.LATEST
    try:
        if command == "VERSION":
            stdout.write(version_text())
            return 0
        if command not in FUNCTIONS:
            raise EnvError(
                f'CNI_COMMAND: unknown command "{command}" (expected one of {", ".join(spec.COMMANDS)})'
            )
        try:
            data = stdin.read()
        except OSError as e:
            msg = f"stdin: cannot read the network configuration: {e.strerror}"
            raise CniError(msg, code=Code.IO_FAILURE) from None
        req = parse_request(command, env, data)
        version = req.version
        module = _load(plugin)
        out = dispatch(module, req)
        if out:
            faults.point("result")  # tests: the ADD is complete, its result not yet printed
        stdout.write(out)
        return 0
    except CniError as e:
        log.debug("%s %s failed: code %d: %s", plugin, command, int(e.code), e)
        stdout.write(error_text(e, getattr(e, "version", version)))
        return 1
    except Exception as e:  # anything unexpected: code 999, one traceback in the log
        log.error("%s %s: unexpected error\n%s", plugin, command, log.traceback_text())
        stdout.write(error_text(CniError(f"internal error: {e}"), version))
        return 1


def _load(plugin: str) -> Any:
    from cni.registry import module_for

    name = module_for(plugin)
    if name is None:
        raise ConfigError(f'type: unknown plugin "{plugin}"')
    return importlib.import_module(name)
