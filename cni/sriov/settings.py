"""The PF-side half of an SR-IOV attachment, as attach.Hooks: snapshot the VF's settings before any
change (only the kinds the config sets: with none, the PF is never asked), apply them in a fixed
order with one undo step each, restore them from the snapshot on DEL, and compare them on CHECK."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from cni import faults, log
from cni.device.records import Attachment
from cni.errors import CheckError, CniError, Code
from cni.sriov.sysfs import Sysfs
from cni.sriov.vf import APPLY_ORDER, RESTORE_ORDER, Setting, VfControl, VfState
from cni.undo import Undo

MAC_TRIES, MAC_WAIT = 20, 0.1


def plan_to_json(plan: tuple[Setting, ...]) -> list[dict[str, Any]]:
    return [{"kind": s.kind, "values": list(s.values)} for s in plan]


def plan_from_json(items: list[dict[str, Any]]) -> tuple[Setting, ...]:
    return tuple(Setting(str(i["kind"]), tuple(i["values"])) for i in items)


class VfHooks:
    def __init__(self, control: VfControl, pf: str = "", vf: int = -1, plan: tuple[Setting, ...] = (),
                 fs: Sysfs | None = None):
        self.control = control
        self.pf, self.vf = pf, vf
        self.plan = tuple(sorted(plan, key=lambda s: APPLY_ORDER.index(s.kind)))
        self.fs = fs

    def snapshot(self, att: Attachment) -> Attachment:
        original = self.control.read(self.pf, self.vf) if self.plan else None
        extra = {"pf": self.pf, "vf": self.vf, "plan": plan_to_json(self.plan),
                 "original": original.to_dict() if original else None}
        return replace(att, extra=extra)

    def apply(self, att: Attachment, undo: Undo) -> None:
        """Each setting, then its undo step (a refused request changed nothing to put back)."""
        original = _original(att)
        for setting in self.plan:
            self.control.set(self.pf, self.vf, setting)
            undo.push(f"restore VF {self.vf} {setting.kind} on {self.pf}", self._set,
                      Setting.of(setting.kind, original))
            if setting.kind == "mac":
                self._wait_mac(str(setting.values[0]))
            faults.point(f"vf-{setting.kind}")

    def _set(self, setting: Setting) -> None:
        if not setting.restorable():
            return
        self.control.set(self.pf, self.vf, setting)
        if setting.kind == "mac":
            self._wait_mac(str(setting.values[0]))

    def _wait_mac(self, mac: str) -> None:
        """Some drivers apply the PF-side MAC asynchronously: read it back until it shows."""
        for _ in range(MAC_TRIES):
            if self.control.read(self.pf, self.vf).mac.lower() == mac.lower():
                return
            time.sleep(MAC_WAIT)
        raise CniError(f"PF {self.pf}: VF {self.vf} MAC did not become {mac}", code=Code.NETLINK)

    def restore(self, att: Attachment) -> None:
        """Put back every setting ADD planned, from the snapshot; each one even if another fails."""
        plan = plan_from_json(att.extra.get("plan") or [])
        if not plan:
            return
        pf = self._current_pf(att)
        if pf is None:
            log.warning("VF %s (%d of PF %s) no longer exists; no VF settings to restore", att.pci,
                        att.extra["vf"], att.extra["pf"])
            return
        self.pf, self.vf = pf, int(att.extra["vf"])
        original, kinds = _original(att), {s.kind for s in plan}
        errors = []
        for kind in RESTORE_ORDER:
            if kind not in kinds:
                continue
            try:
                self._set(Setting.of(kind, original))
            except CniError as e:
                log.error("restore VF %d %s on %s: %s", self.vf, kind, self.pf, e)
                errors.append(f"{kind}: {e}")
        if errors:
            raise CniError(f"PF {self.pf}: VF {self.vf} not fully restored", "; ".join(errors),
                           code=Code.ROLLBACK_INCOMPLETE)

    def _current_pf(self, att: Attachment) -> str | None:
        """The PF's netdev name now (it may have been renamed since ADD); None when the VF is gone
        (VFs disabled, PF driver unloaded). Without a sysfs view: the recorded name."""
        recorded = str(att.extra["pf"])
        if self.fs is None or not att.pci:
            return recorded
        if not self.fs.pci_exists(att.pci):
            return None
        pf_pci = self.fs.physfn(att.pci)
        names = self.fs.pci_netdevs(pf_pci) if pf_pci else []
        if not names or self.fs.vf_index(pf_pci or "", att.pci) != att.extra["vf"]:
            return None
        return recorded if recorded in names else names[0]

    def check(self, att: Attachment) -> None:
        plan = plan_from_json(att.extra.get("plan") or [])
        if not plan:
            return
        pf, vf = str(att.extra["pf"]), int(att.extra["vf"])
        now = self.control.read(pf, vf)
        for want in plan:
            have = Setting.of(want.kind, now)
            if have.values != want.values:
                raise CheckError(f"PF {pf}: VF {vf} {want.kind} is {have.describe()}, "
                                 f"expected {want.describe()}")


def _original(att: Attachment) -> VfState:
    raw = att.extra.get("original")
    return VfState.from_dict(raw) if raw else VfState()
