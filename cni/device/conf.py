"""What the device plugins share besides the flow: their common settings, the device an ADD asked
for, and the hooks SR-IOV adds for the PF-side VF settings."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Protocol

from cni import ifconfig
from cni.device.records import Attachment
from cni.device.statedir import DEFAULT_DIR
from cni.errors import ConfigError
from cni.plugins.rail import RailConf
from cni.types import fields as f
from cni.types.netconf import Request
from cni.types.result import DNS
from cni.undo import Undo

MIN_MTU = 68
MAX_MTU = 65535  # the device's own maximum is the kernel's to check, at ADD


@dataclass(frozen=True)
class DeviceConf:
    """stateDir (absolute; the same for every network that shares devices), dad, dns, ipam, and the
    pod-side MTU (0: the device's own; what users chain `tuning` for, which a lone plugin cannot), its
    rail options (cni.plugins.rail)."""

    state_dir: str = DEFAULT_DIR
    dad: str = "on"
    dns: DNS = field(default_factory=DNS)
    ipam: dict[str, Any] | None = None
    mtu: int = 0
    rail: RailConf = field(default_factory=RailConf)

    @staticmethod
    def from_request(req: Request) -> DeviceConf:
        state_dir = f.opt(req.conf, "stateDir", str, "", DEFAULT_DIR)
        if not os.path.isabs(state_dir):
            raise ConfigError(f'stateDir: "{state_dir}" is not an absolute path')
        dad = f.choice(req.conf, "dad", "", ifconfig.DAD_MODES, "on")
        mtu = f.opt(req.conf, "mtu", int, "", 0)
        if mtu and not MIN_MTU <= mtu <= MAX_MTU:
            raise ConfigError(f"mtu: {mtu} out of range [{MIN_MTU}, {MAX_MTU}] "
                              "(0 or absent: the device's own)")
        rails = RailConf.from_conf(req.conf, req.ifname)
        return DeviceConf(state_dir, dad, req.dns(), req.ipam(), mtu, rails)


@dataclass(frozen=True)
class Target:
    """The device an ADD asked for. `netdev` empty: a userspace-driver device (nothing is moved)."""

    key: str  # ownership and lock key: "pci-<address>", "aux-<id>" or "net-<name>"
    what: str  # how messages name it: 'VF 0000:af:06.0', 'pciBusID "0000:3b:00.0"'
    pci: str = ""
    netdev: str = ""
    driver: str = ""


class Hooks(Protocol):
    """Extra state an attachment changes besides its netdev (SR-IOV: the PF-side VF settings)."""

    def snapshot(self, att: Attachment) -> Attachment: ...

    def apply(self, att: Attachment, undo: Undo) -> None: ...

    def restore(self, att: Attachment) -> None: ...

    def check(self, att: Attachment) -> None: ...


def hooks_for(plugin: str) -> Hooks | None:
    """Hooks that work from a record alone (DEL, GC, CHECK, recovering a stale owner)."""
    if plugin == "sriov":
        from cni.sriov import sysfs
        from cni.sriov.settings import VfHooks
        from cni.sriov.vf import control

        return VfHooks(control(), fs=sysfs.open_sysfs())
    return None
