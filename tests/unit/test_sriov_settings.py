"""PF-side VF settings through the recording seam: the exact requests, their order, and that a
failure at any step puts the VF back exactly as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni.device.records import Attachment
from cni.errors import CheckError, CniError
from cni.sriov.settings import VfHooks
from cni.sriov.vf import Setting, VfState
from cni.undo import Undo
from tests.fakevf import FakeVf

PF = "pf0"
ORIGINAL = VfState(mac="02:00:00:00:0a:02", vlan=7, qos=1, proto="802.1q", spoofchk=1, trust=0,
                   link_state=0, min_tx_rate=0, max_tx_rate=0)
# given out of order on purpose: the hooks apply in a fixed order
PLAN = (Setting("trust", (1,)), Setting("link_state", (1,)), Setting("vlan", (100, 3, "802.1ad")),
        Setting("spoofchk", (0,)), Setting("rate", (10, 1000)), Setting("mac", ("02:aa:bb:cc:dd:ee",)))
APPLY_KINDS = ["vlan", "mac", "rate", "spoofchk", "trust", "link_state"]


def fake(tmp_path: Path, **top: Any) -> tuple[FakeVf, Path]:
    path = tmp_path / "pf.json"
    path.write_text(json.dumps({"pfs": {PF: {"vfs": {"2": ORIGINAL.to_dict()}}}, "calls": [], **top}))
    return FakeVf(str(path)), path


def calls(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text())["calls"])


def vf_now(path: Path) -> VfState:
    return VfState.from_dict(json.loads(path.read_text())["pfs"][PF]["vfs"]["2"])


def att() -> Attachment:
    return Attachment("sriov", "net", "c1", "net1", "/run/netns/x", "pci-0000:af:06.2")


def sets(path: Path) -> list[str]:
    return [c["kind"] for c in calls(path) if c["op"] == "set"]


def test_no_settings_no_pf_requests(tmp_path: Path) -> None:
    control, path = fake(tmp_path)
    hooks = VfHooks(control, PF, 2, ())
    a = hooks.snapshot(att())
    with Undo() as undo:
        hooks.apply(a, undo)
    hooks.restore(a)
    hooks.check(a)
    assert calls(path) == []
    assert a.extra["original"] is None


def test_apply_then_restore_exact_requests(tmp_path: Path) -> None:
    control, path = fake(tmp_path)
    hooks = VfHooks(control, PF, 2, PLAN)
    a = hooks.snapshot(att())
    assert a.extra["original"] == ORIGINAL.to_dict()
    with Undo() as undo:
        hooks.apply(a, undo)
        undo.commit()
    mac_verify = {"op": "read", "pf": PF, "vf": 2}
    assert calls(path) == [
        {"op": "read", "pf": PF, "vf": 2},
        {"op": "set", "pf": PF, "vf": 2, "kind": "vlan", "vlan": 100, "qos": 3, "proto": "802.1ad"},
        {"op": "set", "pf": PF, "vf": 2, "kind": "mac", "mac": "02:aa:bb:cc:dd:ee"},
        mac_verify,
        {"op": "set", "pf": PF, "vf": 2, "kind": "rate", "min_tx_rate": 10, "max_tx_rate": 1000},
        {"op": "set", "pf": PF, "vf": 2, "kind": "spoofchk", "spoofchk": 0},
        {"op": "set", "pf": PF, "vf": 2, "kind": "trust", "trust": 1},
        {"op": "set", "pf": PF, "vf": 2, "kind": "link_state", "link_state": 1},
    ]
    hooks.check(a)
    state = json.loads(path.read_text())
    state["calls"] = []
    path.write_text(json.dumps(state))
    VfHooks(control).restore(a)  # DEL builds its hooks from the record alone
    assert calls(path) == [
        {"op": "set", "pf": PF, "vf": 2, "kind": "vlan", "vlan": 7, "qos": 1, "proto": "802.1q"},
        {"op": "set", "pf": PF, "vf": 2, "kind": "spoofchk", "spoofchk": 1},
        {"op": "set", "pf": PF, "vf": 2, "kind": "mac", "mac": "02:00:00:00:0a:02"},
        mac_verify,
        {"op": "set", "pf": PF, "vf": 2, "kind": "trust", "trust": 0},
        {"op": "set", "pf": PF, "vf": 2, "kind": "rate", "min_tx_rate": 0, "max_tx_rate": 0},
        {"op": "set", "pf": PF, "vf": 2, "kind": "link_state", "link_state": 0},
    ]
    assert vf_now(path) == ORIGINAL


@pytest.mark.parametrize("failing", APPLY_KINDS)
def test_failure_at_each_step_restores_everything(tmp_path: Path, failing: str) -> None:
    control, path = fake(tmp_path, fail={failing: "Invalid argument"})
    hooks = VfHooks(control, PF, 2, PLAN)
    a = hooks.snapshot(att())
    with pytest.raises(CniError, match=f"PF {PF}: set VF 2 {failing}"), Undo() as undo:
        hooks.apply(a, undo)
    assert vf_now(path) == ORIGINAL
    done = APPLY_KINDS[: APPLY_KINDS.index(failing)]
    # the requests up to the refused one, then each applied setting put back, newest first
    assert sets(path) == [*done, failing, *reversed(done)]


def test_unsupported_setting_fails_naming_the_pf(tmp_path: Path) -> None:
    control, path = fake(tmp_path)
    state = json.loads(path.read_text())
    state["pfs"][PF]["unsupported"] = ["vlan"]
    path.write_text(json.dumps(state))
    hooks = VfHooks(control, PF, 2, (Setting("vlan", (10, 0, "802.1q")),))
    a = hooks.snapshot(att())
    with pytest.raises(CniError, match=f"PF {PF}: .*Operation not supported"), Undo() as undo:
        hooks.apply(a, undo)
    assert vf_now(path) == ORIGINAL


def test_restore_continues_past_a_failure_and_reports_it(tmp_path: Path) -> None:
    control, path = fake(tmp_path)
    hooks = VfHooks(control, PF, 2, PLAN)
    a = hooks.snapshot(att())
    with Undo() as undo:
        hooks.apply(a, undo)
        undo.commit()
    state = json.loads(path.read_text())
    state["fail"] = {"spoofchk": "Device or resource busy"}
    path.write_text(json.dumps(state))
    with pytest.raises(CniError, match="not fully restored") as info:
        VfHooks(control).restore(a)
    assert info.value.code == 106 and "spoofchk" in info.value.details
    now = vf_now(path)
    assert (now.vlan, now.mac, now.trust, now.link_state) == (7, ORIGINAL.mac, 0, 0)
    VfHooks(control).restore(a)  # a second DEL finishes the job
    assert vf_now(path) == ORIGINAL


def test_check_reports_a_drifted_setting(tmp_path: Path) -> None:
    control, _ = fake(tmp_path)
    hooks = VfHooks(control, PF, 2, (Setting("vlan", (100, 0, "802.1q")),))
    a = hooks.snapshot(att())
    with Undo() as undo:
        hooks.apply(a, undo)
        undo.commit()
    hooks.check(a)
    control.set(PF, 2, Setting("vlan", (200, 0, "802.1q")))
    with pytest.raises(CheckError, match="vlan is vlan vlan=200"):
        hooks.check(a)


def test_unknown_original_flags_are_not_written_back(tmp_path: Path) -> None:
    control, path = fake(tmp_path)
    state = json.loads(path.read_text())
    state["pfs"][PF]["vfs"]["2"]["trust"] = -1  # the driver cannot tell
    path.write_text(json.dumps(state))
    hooks = VfHooks(control, PF, 2, (Setting("trust", (1,)),))
    a = hooks.snapshot(att())
    with Undo() as undo:
        hooks.apply(a, undo)
        undo.commit()
    VfHooks(control).restore(a)
    assert sets(path) == ["trust"]
