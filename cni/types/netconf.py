"""The request a plugin sees: the CNI_* environment and the network configuration from stdin."""

from __future__ import annotations

from collections.abc import Mapping

from cni.errors import ConfigError, EnvError
from cni.types import fields as f
from cni.types.args import CniArgs
from cni.types.result import DNS, Result, parse, parse_dns
from cni.types.valueclass import field, valueclass

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any


@valueclass
class Request:
    """One CNI invocation. `conf` is the decoded stdin; `env` the full environment (for delegates)."""

    command: str
    version: str
    conf: dict[str, Any]
    stdin: bytes
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    args: CniArgs = field(default_factory=CniArgs)
    path: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.conf.get("name", ""))

    @property
    def type(self) -> str:
        return str(self.conf.get("type", ""))

    def ipam(self) -> dict[str, Any] | None:
        """The ipam section, or None when absent, `{}` or without a type (L2 only)."""
        section = f.opt(self.conf, "ipam", dict, "")
        if not section:
            return None
        kind = f.opt(section, "type", str, "ipam", "")
        return section if kind else None

    def runtime_config(self) -> dict[str, Any]:
        return dict(f.opt(self.conf, "runtimeConfig", dict, "", {}))

    def cni_args(self) -> dict[str, Any]:
        """args.cni (structured args; they win over the CNI_ARGS copies)."""
        args = f.opt(self.conf, "args", dict, "", {})
        return dict(f.opt(args, "cni", dict, "args", {}))

    def dns(self) -> DNS:
        return parse_dns(self.conf.get("dns"), "dns")

    def prev_result(self) -> Result | None:
        raw = self.conf.get("prevResult")
        if raw is None or raw == {}:
            return None
        return parse(raw, self.version, "prevResult")

    def valid_attachments(self) -> set[tuple[str, str]] | None:
        """GC: (containerID, ifname) pairs still in use, from either attachment key; None if absent."""
        found = None
        for key in ("cni.dev/valid-attachments", "cni.dev/attachments"):
            items = self.conf.get(key)
            if items is None:
                continue
            f.typed(items, list, key)
            found = found or set()
            for i, item in enumerate(items):
                path = f.join(key, i)
                f.typed(item, dict, path)
                found.add((f.req(item, "containerID", str, path), f.req(item, "ifname", str, path)))
        return found


def requested_mac(req: Request, configured: str | None) -> str | None:
    """MAC precedence: config < CNI_ARGS MAC < args.cni.mac < runtimeConfig.mac."""
    mac = configured
    if req.args.get("MAC"):
        try:
            mac = f.mac(req.args.get("MAC"), "CNI_ARGS MAC")
        except ConfigError as e:
            raise EnvError(e.msg) from None  # an environment variable: code 4
    cni_mac = req.cni_args().get("mac")
    if cni_mac:
        mac = f.mac(cni_mac, "args.cni.mac")
    rt_mac = req.runtime_config().get("mac")
    if rt_mac:
        mac = f.mac(rt_mac, "runtimeConfig.mac")
    return mac


def require_prev_result(req: Request) -> Result:
    prev = req.prev_result()
    if prev is None:
        raise ConfigError("prevResult: required for CHECK")
    return prev
