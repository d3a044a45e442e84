"""Our plugins through libcni 1.3 (cnitool 1.3.0 from ../shared/upstream): cniVersion 1.1.0 ADD, CHECK,
DEL, GC and STATUS, which Debian's libcni 1.1.2 (the e2e driver) cannot send.

cnitool reads the conflist named on its command line from NETCONFPATH, finds plugins on CNI_PATH, takes
the interface from CNI_IFNAME and derives the container ID from the netns path. Its libcni result cache
is the fixed /var/lib/cni: it runs in a private mount namespace whose /var/lib is the test's own
directory (tests/e2e/node.py), inside the test's host network namespace.

GC as cnitool 1.3.0 sends it: it calls GCNetworkList without arguments, so libcni's list of valid
attachments is empty. libcni then DELs every attachment of the network in its cache (none is valid) and
sends GC to each plugin without `cni.dev/valid-attachments`; our plugins release nothing on such a GC
(nothing says what is still in use), so an attachment libcni has no cache entry for stays."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from ipam.store.local import LocalStore
from tests import kubeup
from tests.e2e import bundle_driver
from tests.e2e.node import Node
from tests.nsutil import Call, Topology

VERSION = "1.1.0"
RESULTS = "/var/lib/cni/results"  # libcni's cache, as cnitool leaves it at its default
NO_LIST = "GC without cni.dev/valid-attachments"  # what our plugins log on such a GC (stderr)


class Cnitool:
    def __init__(self, topo: Topology, tmp: Path) -> None:
        reason = kubeup.shared_missing("unpack")
        if reason:
            pytest.skip(reason)
        self.topo, self.tmp = topo, tmp
        self.binary = kubeup.unpack("cnitool") / "cnitool"
        self.netconf = tmp / "net.d"
        self.netconf.mkdir()
        self.node = Node(tmp / "node")
        self.cni_path = f"{bundle_driver.plugin_dir(tmp)}:{bundle_driver.REFERENCE}"

    def conflist(self, name: str, plugin: dict[str, Any]) -> dict[str, Any]:
        doc = {"cniVersion": VERSION, "name": name, "plugins": [plugin]}
        (self.netconf / f"{name}.conflist").write_bytes(jsonio.dumps(doc))
        return doc

    def run(self, verb: str, net: str, netns: str, ifname: str = "net1") -> Call:
        env = self.node.env({k: v for k, v in os.environ.items() if not k.startswith("CNI_")})
        env.update(NETCONFPATH=str(self.netconf), CNI_PATH=self.cni_path, CNI_IFNAME=ifname)
        cmd = self.node.command("ip", "netns", "exec", self.topo.host, str(self.binary), verb, net, netns)
        proc = subprocess.run(cmd, env=env, capture_output=True, check=False, timeout=300)
        out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
        return Call(proc.returncode, out, proc.stderr.decode(errors="replace"))

    def cached(self) -> list[str]:
        return self.node.files(RESULTS)


def container_id(netns: str) -> str:
    """What cnitool passes as CNI_CONTAINERID: a hash of the netns path."""
    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


def cache_entry(net: str, netns: str, ifname: str = "net1") -> str:
    return f"{net}-{container_id(netns)}-{ifname}"


@pytest.fixture
def tool(topo: Topology, tmp_path: Path) -> Iterator[Cnitool]:
    t = Cnitool(topo, tmp_path)
    with t.node.agent() as agent:
        yield t
    if agent is not None:
        assert agent.served(), f"the node's agent served nothing ({agent.log})"


def local_ipam(tmp: Path, first: str) -> dict[str, Any]:
    flat = tmp / "whereabouts.conf"
    flat.write_text("{}")  # never a flat file of the machine's
    return {"type": "whereabouts", "range": "198.51.100.0/24", "range_start": first,
            "datastore": "local", "local_db": str(tmp / "ipam.db"), "configuration_path": str(flat)}


def local_allocations(ipam: dict[str, Any]) -> dict[str, str]:
    """address offset -> container id, from the local store."""
    store = LocalStore(ipam["local_db"])
    try:
        return {k: a.container_id for pool in store.iter_pools() for k, a in pool.allocations.items()}
    finally:
        store.close()


def offset(address: str, cidr: str = "198.51.100.0/24") -> str:
    ip = ipaddress.ip_interface(address).ip
    return str(int(ip) - int(ipaddress.ip_network(cidr).network_address))


def check_add(tool: Cnitool, add: Call, netns: str, want: str, kind: str) -> dict[str, Any]:
    """A 1.1.0 result for one interface in `netns` with address `want`, matching the pod."""
    assert add.ok, (add.out, add.stderr)
    assert add.out["cniVersion"] == VERSION
    (iface,) = [i for i in add.out["interfaces"] if i.get("sandbox")]
    assert (iface["name"], iface["sandbox"]) == ("net1", netns)
    link = tool.topo.link(netns, "net1")
    assert link is not None and link["address"] == iface["mac"]
    assert iface["mtu"] == link["mtu"]  # a 1.1.0-only field
    assert link["linkinfo"]["info_kind"] == kind
    assert [ip["address"] for ip in add.out["ips"]] == [want]
    assert tool.topo.addrs(netns, "net1") == [want]
    return iface


def test_macvlan_whereabouts_local(tool: Cnitool, tmp_path: Path) -> None:
    topo = tool.topo
    ipam = local_ipam(tmp_path, "198.51.100.10")
    tool.conflist("mvl", {"type": "macvlan", "master": topo.uplink, "mode": "bridge", "ipam": ipam})
    status = tool.run("status", "mvl", "/none")
    assert status.ok, status.stderr
    a, b = topo.pod("a"), topo.pod("b")

    check_add(tool, tool.run("add", "mvl", a), a, "198.51.100.10/24", "macvlan")
    check_add(tool, tool.run("add", "mvl", b), b, "198.51.100.11/24", "macvlan")
    for pod in (a, b):
        check = tool.run("check", "mvl", pod)
        assert check.ok, check.stderr
    assert local_allocations(ipam) == {"10": container_id(a), "11": container_id(b)}
    assert tool.cached() == sorted([cache_entry("mvl", a), cache_entry("mvl", b)])

    # the runtime loses b's cache entry: libcni no longer knows that attachment
    tool.node.path(f"{RESULTS}/{cache_entry('mvl', b)}").unlink()
    gc = tool.run("gc", "mvl", a)
    assert gc.ok, gc.stderr
    assert gc.stderr.count(NO_LIST) == 1, gc.stderr  # the GC reached our IPAM (through macvlan)
    assert topo.link(a, "net1") is None, "libcni DELs a cached attachment cnitool did not list as valid"
    assert tool.cached() == []
    assert local_allocations(ipam) == {"11": container_id(b)}, "a GC without a valid list frees nothing"
    assert topo.link(b, "net1") is not None

    for _ in range(2):
        delete = tool.run("del", "mvl", b)
        assert delete.ok, delete.stderr
        assert topo.link(b, "net1") is None
        assert local_allocations(ipam) == {}
    assert {link["ifname"] for link in topo.links(topo.host)} >= {topo.uplink}

    # STATUS: the master is gone
    tool.conflist("mvl-gone", {"type": "macvlan", "master": f"{topo.tag}gone", "ipam": ipam})
    status = tool.run("status", "mvl-gone", "/none")
    assert status.rc == 1 and f"{topo.tag}gone" in status.stderr, (status.rc, status.stderr)


def test_macvlan_whereabouts_on_the_real_server(tool: Cnitool, tenant: kubeup.Tenant) -> None:
    topo = tool.topo
    forwarder = kubeup.Forwarder(tenant.server, topo.host)
    try:
        ipam = {"type": "whereabouts", "range": "198.18.64.0/24", "range_start": "198.18.64.20",
                "kubernetes": {"kubeconfig": str(tenant.node)},
                "local_db": str(tool.tmp / "state" / "whereabouts.db")}
        tool.conflist("kmv", {"type": "macvlan", "master": topo.uplink, "ipam": ipam})
        assert tool.run("status", "kmv", "/none").ok
        a, b = topo.pod("a"), topo.pod("b")
        check_add(tool, tool.run("add", "kmv", a), a, "198.18.64.20/24", "macvlan")
        check_add(tool, tool.run("add", "kmv", b), b, "198.18.64.21/24", "macvlan")
        assert tool.run("check", "kmv", a).ok  # (through the agent: after the ADDs' pool write)
        pool = tenant.pools()["198.18.64.0-24"]
        assert {k: v["id"] for k, v in pool.items()} == {"20": container_id(a), "21": container_id(b)}
        assert sorted(tenant.reservations()) == ["198.18.64.20", "198.18.64.21"]

        tool.node.path(f"{RESULTS}/{cache_entry('kmv', b)}").unlink()
        gc = tool.run("gc", "kmv", a)
        assert gc.ok, gc.stderr
        assert gc.stderr.count(NO_LIST) == 1, gc.stderr
        assert topo.link(a, "net1") is None
        assert {k: v["id"] for k, v in tenant.pools()["198.18.64.0-24"].items()} == {"21": container_id(b)}
        assert sorted(tenant.reservations()) == ["198.18.64.21"]

        for _ in range(2):
            delete = tool.run("del", "kmv", b)
            assert delete.ok, delete.stderr
            assert topo.link(b, "net1") is None
            assert tenant.pools()["198.18.64.0-24"] == {}
            assert tenant.reservations() == {}
    finally:
        forwarder.close()


def device(topo: Topology, name: str) -> dict[str, Any] | None:
    link = topo.link(topo.host, name)
    if link is None:
        return None
    return {"name": link["ifname"], "mtu": link["mtu"], "mac": link["address"], "up": "UP" in link["flags"],
            "alias": link.get("ifalias", "")}


def records(state: Path) -> list[str]:
    d = state / "attachments"
    return sorted(os.listdir(d)) if d.is_dir() else []


def test_host_device(tool: Cnitool, tmp_path: Path) -> None:
    topo = tool.topo
    nics = [topo.add_uplink(f"nic{n}", mtu=9000) for n in range(2)]
    before = {nic: device(topo, nic) for nic in nics}
    state = tmp_path / "state"
    ipam = local_ipam(tmp_path, "198.51.100.40")
    for n, nic in enumerate(nics):
        tool.conflist(f"hd{n}", {"type": "host-device", "device": nic, "stateDir": str(state), "ipam": ipam})
        assert tool.run("status", f"hd{n}", "/none").ok
    a, b = topo.pod("a"), topo.pod("b")
    check_add(tool, tool.run("add", "hd0", a), a, "198.51.100.40/24", "veth")
    check_add(tool, tool.run("add", "hd1", b), b, "198.51.100.41/24", "veth")
    assert tool.run("check", "hd0", a).ok and tool.run("check", "hd1", b).ok
    assert all(device(topo, nic) is None for nic in nics)
    assert records(state) == sorted([f"{container_id(a)}:net1", f"{container_id(b)}:net1"])

    # GC of network hd0: libcni DELs its one cached attachment; hd1's is another network's
    gc = tool.run("gc", "hd0", a)
    assert gc.ok, gc.stderr
    assert gc.stderr.count(NO_LIST) == 2, gc.stderr  # host-device's and the IPAM's
    assert device(topo, nics[0]) == before[nics[0]], "the device is home as it was"
    assert device(topo, nics[1]) is None
    assert records(state) == [f"{container_id(b)}:net1"]
    assert local_allocations(ipam) == {"41": container_id(b)}

    for _ in range(2):
        delete = tool.run("del", "hd1", b)
        assert delete.ok, delete.stderr
        assert device(topo, nics[1]) == before[nics[1]]
        assert topo.link(b, "net1") is None
        assert records(state) == []
        assert local_allocations(ipam) == {}

    # STATUS: the state dir is unusable (a file where the directory should be)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    tool.conflist("hd-bad", {"type": "host-device", "device": nics[0], "stateDir": str(blocked / "x"),
                             "ipam": ipam})
    status = tool.run("status", "hd-bad", "/none")
    assert status.rc == 1, (status.rc, status.stderr)
