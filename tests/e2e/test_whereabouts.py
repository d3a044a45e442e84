"""Our IPAM end to end: under Debian's macvlan through real libcni (the cnidriver), and under our own
macvlan (run like a runtime by tests/nsutil). The IPAM is found on CNI_PATH as `whereabouts`, a wrapper
that runs `python -m cni whereabouts` from this checkout."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam.store.local import LocalStore
from tests.ipamutil import write_wrappers
from tests.nsutil import REPO, Topology, sh

DRIVER = REPO / ".venv" / "bin" / "cnidriver"
ARGS = "IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"


@pytest.fixture(scope="module")
def driver() -> Path:
    if not DRIVER.exists():
        subprocess.run(["bash", str(REPO / "tests/e2e/driver/build.sh"), str(DRIVER)], check=True)
    return DRIVER


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    """A CNI_PATH dir with `whereabouts` (and `pymacvlan`, our macvlan) running from source."""
    return write_wrappers(tmp_path / "bin", {"whereabouts": "whereabouts", "pymacvlan": "macvlan"})


@pytest.fixture
def ipam(tmp_path: Path) -> Iterator[dict[str, Any]]:
    flat = tmp_path / "whereabouts.conf"
    flat.write_text("{}")
    yield {
        "type": "whereabouts",
        "range": "198.51.100.0/24",
        "exclude": ["198.51.100.1"],
        "ipRanges": [{"range": "2001:db8:e2e::/64"}],
        "gateway": "198.51.100.1",
        "datastore": "local",
        "local_db": str(tmp_path / "state" / "ipam.db"),
        "configuration_path": str(flat),
    }


def allocations(ipam: dict[str, Any]) -> dict[str, tuple[str, str]]:
    store = LocalStore(ipam["local_db"])
    try:
        return {
            f"{pool.range}#{k}": (a.podref, a.container_id)
            for pool in store.iter_pools()
            for k, a in pool.allocations.items()
        }
    finally:
        store.close()


def libcni(
    topo: Topology,
    driver: Path,
    bindir: Path,
    cmd: str,
    conflist: Path,
    cid: str,
    netns: str,
    pod: str,
    tmp: Path,
) -> Any:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("CNI_")},
        "CNI_PATH": f"{bindir}:/usr/lib/cni",
        "CNI_CACHE_DIR": str(tmp / "cache"),
        "CNI_ARGS": ARGS.format(pod=pod),
    }
    proc = subprocess.run(
        ["ip", "netns", "exec", topo.host, str(driver), cmd, str(conflist), cid, netns, "net1"],
        env=env,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, (cmd, proc.stdout, proc.stderr)
    return jsonio.loads(proc.stdout) if proc.stdout.strip() else None


@pytest.mark.parametrize("macvlan", ["macvlan", "pymacvlan"])
def test_under_macvlan_through_libcni(
    topo: Topology, driver: Path, bindir: Path, ipam: dict[str, Any], tmp_path: Path, macvlan: str
) -> None:
    """`macvlan` is Debian's (/usr/lib/cni), `pymacvlan` ours: both delegate to our whereabouts."""
    conflist = tmp_path / "net.conflist"
    conflist.write_bytes(
        jsonio.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "e2e-wb",
                "plugins": [{"type": macvlan, "master": topo.uplink, "mode": "bridge", "ipam": ipam}],
            }
        )
    )
    pods = [(topo.pod(f"p{i}"), f"e2e{i}{'a' * 20}", f"pod-{i}") for i in (1, 2)]
    results = [libcni(topo, driver, bindir, "add", conflist, cid, ns, pod, tmp_path) for ns, cid, pod in pods]
    got = [[ip["address"] for ip in r["ips"]] for r in results]
    assert got == [["198.51.100.2/24", "2001:db8:e2e::1/64"], ["198.51.100.3/24", "2001:db8:e2e::2/64"]]
    assert results[0]["ips"][0]["gateway"] == "198.51.100.1"
    for (ns, _, _), addrs in zip(pods, got, strict=True):
        assert sorted(topo.addrs(ns, "net1")) == sorted(addrs)
    held = allocations(ipam)
    assert sorted(held.values()) == sorted([("e2e/pod-1", pods[0][1])] * 2 + [("e2e/pod-2", pods[1][1])] * 2)
    ping = sh(
        "ip",
        "netns",
        "exec",
        os.path.basename(pods[0][0]),
        "ping",
        "-c",
        "1",
        "-W",
        "3",
        "198.51.100.3",
        check=False,
    )
    assert ping.returncode == 0, ping.stdout + ping.stderr
    for ns, cid, pod in pods:
        libcni(topo, driver, bindir, "check", conflist, cid, ns, pod, tmp_path)
    for ns, cid, pod in pods:
        libcni(topo, driver, bindir, "del", conflist, cid, ns, pod, tmp_path)
        libcni(topo, driver, bindir, "del", conflist, cid, ns, pod, tmp_path)  # idempotent
        assert topo.link(ns, "net1") is None
    assert allocations(ipam) == {}


def test_under_our_macvlan_from_nsutil(topo: Topology, bindir: Path, ipam: dict[str, Any]) -> None:
    conf = {"cniVersion": "1.1.0", "name": "e2e-ours", "type": "macvlan", "master": topo.uplink, "ipam": ipam}
    path = f"{bindir}:/usr/lib/cni"
    pod = topo.pod()
    add = topo.run(
        "macvlan", "ADD", conf, netns=pod, container_id="ours1", path=path, cni_args=ARGS.format(pod="ours")
    )
    assert add.ok, (add.out, add.stderr)
    assert [ip["address"] for ip in add.out["ips"]] == ["198.51.100.2/24", "2001:db8:e2e::1/64"]
    assert sorted(topo.addrs(pod, "net1")) == ["198.51.100.2/24", "2001:db8:e2e::1/64"]
    check = topo.run(
        "macvlan", "CHECK", {**conf, "prevResult": add.out}, netns=pod, container_id="ours1", path=path
    )
    assert check.ok, check.out
    status = topo.run("macvlan", "STATUS", conf, path=path)
    assert status.ok, status.out
    again = topo.run(
        "macvlan",
        "ADD",
        conf,
        netns=topo.pod("q"),
        container_id="ours2",
        path=path,
        cni_args=ARGS.format(pod="ours2"),
    )
    assert again.ok and again.out["ips"][0]["address"] == "198.51.100.3/24"
    gc = topo.run(
        "macvlan",
        "GC",
        {**conf, "cni.dev/valid-attachments": [{"containerID": "ours1", "ifname": "net1"}]},
        path=path,
        env={"NODENAME": os.uname().nodename},
    )
    assert gc.ok, gc.out
    assert {v[1] for v in allocations(ipam).values()} == {"ours1"}
    assert topo.run("macvlan", "DEL", conf, netns=pod, container_id="ours1", path=path).ok
    assert topo.run("macvlan", "DEL", conf, netns=pod, container_id="ours1", path=path).ok
    assert allocations(ipam) == {}
