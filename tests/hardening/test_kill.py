"""SIGKILL at every step of ADD, then DEL: nothing remains (issue 7, "Faults").

Each plugin runs as a real process with `--faults <step>!` (tests/launch.py, cni/faults.py), which
kills it at that step: no rollback runs. Then the runtime's DEL (no fault) must succeed and leave no link in
the pod, no changed host link, no device record or lock file, no changed VF setting (sriov, fake
sysfs and recording VF seam) and no allocation or reservation; and the next ADD and DEL succeed."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from cni import jsonio
from tests.concurrency.stores import NAMES, target_for
from tests.hardening.conftest import TALLY
from tests.hardening.fuzzlab import FuzzLab, run_process

pytestmark = pytest.mark.root  # namespaces, links, mounts

DEVICE_STEPS = ["snapshot", "move-temp", "move-pod", "alias", "rename", "ipam", "configure", "record",
                "result"]
STEPS = {
    "macvlan": ["link", "rename", "ipam", "configure", "result"],
    "host-device": DEVICE_STEPS,
    "sriov": ["vf-vlan", "vf-mac", "vf-spoofchk", *DEVICE_STEPS[:4], "mac", *DEVICE_STEPS[4:]],
    "whereabouts": ["store-reserve", "store-commit", "result"],
}
# Steps where the device sits in the plugin's anonymous temporary namespace: the kill destroys that
# namespace, which sends a physical device back to the initial namespace (DEL finds it there by its
# marker, bus device or permanent MAC) but destroys a virtual one, such as the veth stand-ins here.
IN_TEMP_NS = {"move-temp", "alias", "rename", "mac"}
CASES = [(plugin, step) for plugin, steps in STEPS.items() if plugin != "whereabouts" for step in steps]



@pytest.fixture(scope="module", params=NAMES)
def store_lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzLab]:
    """The IPAM on each store target of tests/concurrency/stores.py (a store joins by its entry;
    kubernetes: the session's real kube-apiserver, a namespace of this module's own)."""
    tmp = tmp_path_factory.mktemp(f"kill-{request.param}")
    with target_for(request.param, tmp, request) as target:
        made = FuzzLab(tmp, target=target)
        try:
            yield made
        finally:
            made.close()


@pytest.mark.parametrize("step", STEPS["whereabouts"])
def test_ipam_sigkill_at_step_then_del(store_lab: FuzzLab, step: str) -> None:
    kill_then_del(store_lab, "whereabouts", step)


@pytest.mark.parametrize("sandbox", ["same", "new"])
def test_ipam_sigkill_after_the_reservation_then_add_again(store_lab: FuzzLab, sandbox: str) -> None:
    """The runtime retries the killed ADD instead of deleting it: with the same container id, or (the
    kubelet) with a new sandbox of the same pod and interface. The retry ends with one pool entry and one
    reservation per range, both naming the retried container (what the killed ADD reserved is freed:
    ipam.reservations; the local store's transaction left nothing); the old sandbox's DEL leaves them alone,
    the new one's leaves nothing."""
    conf = store_lab.conf("whereabouts", cniVersion="1.0.0")
    conf["ipam"]["ipRanges"] = [{"range": "2001:db8:4::/120"}]
    stdin = jsonio.dumps(conf)
    old = store_lab.env("ADD", CNI_CONTAINERID=f"kill-retry-{sandbox}")
    new = old if sandbox == "same" else {**old, "CNI_CONTAINERID": "kill-retry-new-sandbox"}
    killed = run_process(store_lab, "whereabouts", old, stdin, faults="store-reserve!")
    assert killed.rc == -signal.SIGKILL, killed.raw
    TALLY["faults injected (SIGKILL)"] += 1
    again = run_process(store_lab, "whereabouts", new, stdin)
    assert again.rc == 0 and again.out is not None, again.raw
    from ipam.store.names import reservation_name

    held = _held(store_lab)
    ips, cid = [ip["address"].split("/")[0] for ip in again.out["ips"]], new["CNI_CONTAINERID"]
    network = conf["ipam"].get("network_name", "")
    names = sorted((reservation_name(ip, network), cid) for ip in ips)
    assert held == (sorted((ip, cid) for ip in ips), names)
    if new is not old:
        assert run_process(store_lab, "whereabouts", {**old, "CNI_COMMAND": "DEL"}, stdin).rc == 0
        assert _held(store_lab) == held
    assert run_process(store_lab, "whereabouts", {**new, "CNI_COMMAND": "DEL"}, stdin).rc == 0
    assert store_lab.leftovers() == []


def _held(lab: FuzzLab) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(address, container id) of every pool entry, (name, container id) of every reservation."""
    import ipaddress

    store = lab.open_store()
    try:
        entries = sorted((str(ipaddress.ip_network(p.range).network_address + int(k)), a.container_id)
                         for p in store.iter_pools() for k, a in p.allocations.items())  # fmt: skip
        return entries, sorted((r.name, r.owner.container_id) for r in store.iter_reservations())
    finally:
        store.close()


@pytest.mark.parametrize(("plugin", "step"), CASES, ids=[f"{p}-{s}" for p, s in CASES])
def test_sigkill_at_step_then_del(lab: FuzzLab, plugin: str, step: str) -> None:
    kill_then_del(lab, plugin, step)


def kill_then_del(lab: FuzzLab, plugin: str, step: str) -> None:
    conf = lab.conf(plugin, cniVersion="1.0.0")
    if plugin == "whereabouts":
        conf["ipam"]["ipRanges"] = [{"range": "2001:db8:4::/120"}]  # two ranges: killed between them too
    stdin = jsonio.dumps(conf)
    env = lab.env("ADD", CNI_CONTAINERID=f"kill-{plugin}-{step}")
    killed = run_process(lab, plugin, env, stdin, faults=f"{step}!")
    assert killed.rc == -signal.SIGKILL, f"step {step} not reached: rc {killed.rc}, {killed.raw!r}"
    TALLY["faults injected (SIGKILL)"] += 1
    assert killed.out is None  # nothing printed: the runtime sees a crashed plugin
    gone = run_process(lab, plugin, {**env, "CNI_COMMAND": "DEL"}, stdin)
    assert gone.rc == 0, gone.raw
    if plugin in ("host-device", "sriov") and step in IN_TEMP_NS:
        died = lab.restore_standins()
        assert died, f"the stand-in device should have died with the temporary namespace at {step}"
    left = lab.leftovers()
    if left:
        lab.reset()
    assert not left, f"after SIGKILL at {step} and DEL: {left}"
    again = run_process(lab, plugin, env, stdin)  # the next call after recovery succeeds
    assert again.rc == 0, again.raw
    assert run_process(lab, plugin, {**env, "CNI_COMMAND": "DEL"}, stdin).rc == 0
    assert lab.leftovers() == []


def test_add_again_after_a_kill_before_the_rename(lab: FuzzLab) -> None:
    """The runtime may retry ADD instead of DEL: the link a killed ADD left under the attachment's
    temporary name is removed, not a cause of EEXIST."""
    stdin = jsonio.dumps(lab.conf("macvlan"))
    env = lab.env("ADD", CNI_CONTAINERID="kill-readd")
    assert run_process(lab, "macvlan", env, stdin, faults="link!").rc == -signal.SIGKILL
    TALLY["faults injected (SIGKILL)"] += 1
    assert len(lab.pod_links()) == 1
    again = run_process(lab, "macvlan", env, stdin)
    assert again.rc == 0, again.raw
    assert lab.pod_links() == ["net1"]
    assert run_process(lab, "macvlan", {**env, "CNI_COMMAND": "DEL"}, stdin).rc == 0
    assert lab.leftovers() == []
