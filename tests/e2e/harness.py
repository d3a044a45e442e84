"""One attachment's life through libcni (ADD, look, CHECK, DEL, look, DEL again) for one side, and the
field-by-field comparison of two such lives."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import spec
from tests.e2e import linkstate
from tests.e2e.libcni import Driver, Side, write_conflist
from tests.nsutil import Call, Topology

ConfFactory = Callable[[str], dict[str, Any]]  # host-local dataDir -> conflist
ARP_KEYS = ("net.ipv4.conf.{if}.arp_notify", "net.ipv6.conf.{if}.ndisc_notify")


@dataclass
class Session:
    """One attachment (a conflist, a pod namespace, CNI_ARGS...) of one side; `call` runs a libcni verb."""

    driver: Driver
    side: Side
    conflist: Path
    data_dir: Path
    netns: str
    version: str
    ifname: str = "net1"
    container_id: str = "c1"
    cni_args: str = ""
    cap_args: Mapping[str, Any] | None = None

    def call(self, verb: str, **overrides: Any) -> Call:
        kw: dict[str, Any] = {"netns": self.netns, "ifname": self.ifname, "container_id": self.container_id,
                              "cni_args": self.cni_args, "cap_args": self.cap_args, **overrides}
        return self.driver.run(verb, self.conflist, self.side, **kw)

    def allocations(self) -> list[str]:
        """host-local reservations on disk (one file per IP; lock and last_reserved_ip aside)."""
        if not self.data_dir.exists():
            return []
        return sorted(str(p.relative_to(self.data_dir)) for p in self.data_dir.rglob("*")
                      if p.is_file() and p.name != "lock" and not p.name.startswith("last_reserved_ip"))


@dataclass
class Attachment:
    """What one side did with one conflist, as compare() needs it."""

    run: Session
    add: Call
    result: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    check: Call | None = None
    dels: list[Call] = field(default_factory=list)
    after_del: dict[str, Any] = field(default_factory=dict)


@dataclass
class E2E:
    topo: Topology
    driver: Driver
    reference: Side
    pycni: Side
    scratch: Path
    _count: int = 0

    @property
    def sides(self) -> tuple[Side, Side]:
        return self.reference, self.pycni

    def pod(self, side: Side) -> str:
        self._count += 1
        return self.topo.pod(f"{side.label[0]}{self._count}")

    def session(self, side: Side, make: ConfFactory, *, netns: str = "", **kw: Any) -> Session:
        """A conflist from `make` (given this side's own host-local dataDir) in a new pod namespace."""
        data_dir = self.scratch / f"{side.label}-hl"
        conf = make(str(data_dir))
        path = write_conflist(self.scratch, f"{side.label}-{conf['name']}", conf)
        return Session(self.driver, side, path, data_dir, netns or self.pod(side), conf["cniVersion"], **kw)

    def attach(self, side: Side, make: ConfFactory, *, random_mac: bool = True,
               sysctl_keys: tuple[str, ...] = (), **kw: Any) -> Attachment:
        """ADD, snapshot, CHECK (0.4.0+), DEL, snapshot, DEL again."""
        run = self.session(side, make, **kw)
        pod, ifname = run.netns, run.ifname
        keys = tuple(k.format(**{"if": ifname}) for k in (*ARP_KEYS, *sysctl_keys))
        att = Attachment(run, run.call("add"))
        if att.add.ok:
            att.state = linkstate.link_state(pod, ifname, random_mac=random_mac, sysctl_keys=keys)
            att.result = linkstate.normalise_result(att.add.out, pod, att.state["real_mac"], random_mac)
            if spec.at_least(run.version, "0.4.0"):
                att.check = run.call("check")
        att.dels = [run.call("del") for _ in range(2)]
        att.after_del = linkstate.link_state(pod, ifname, random_mac=random_mac)
        return att


# Debian ships containernetworking-plugins 1.1.1 (2022). Where upstream's macvlan changed since, pycni
# follows upstream: such a field is taken out of both snapshots and its two values are asserted.
NDISC = ("sysctl", "net.ipv6.conf.net1.ndisc_notify")
KEEP_ADDR = ("sysctl", "net.ipv6.conf.net1.keep_addr_on_down")
DRIFT_NOTES = {
    ("txqlen",): "1.1.1 builds netlink.LinkAttrs as a struct literal and so sends IFLA_TXQLEN=0; "
                 "containernetworking/plugins#1100 (v1.6.0) keeps the kernel default, as `ip link add` does",
    NDISC: "containernetworking/plugins#974 (v1.4.0) sets ndisc_notify=1 next to arp_notify=1 with IPAM",
    KEEP_ADDR: "containernetworking/plugins#1155 (v1.7.0) sets keep_addr_on_down=1 with an IPv6 address",
}


def _pop(state: dict[str, Any], path: tuple[str, ...]) -> Any:
    *parents, leaf = path
    for key in parents:
        state = state[key]
    return state.pop(leaf, "<not read>")


def _drifts(ref: dict[str, Any], ours: dict[str, Any], result: Any) -> list[str]:
    """Pop the drifted fields; report them when they are not the expected (reference, pycni) pair."""
    ips = [ip.get("address") or ip.get("ip") for ip in (result.get("ips") or [])]
    ips += [result[k]["ip"] for k in ("ip4", "ip6") if k in result]
    expected = {("txqlen",): (0, 1000), NDISC: ("0", "1" if ips else "0")}
    if KEEP_ADDR[1] in ref["sysctl"]:
        expected[KEEP_ADDR] = ("0", "1" if any(":" in ip for ip in ips) else "0")
    out = []
    for path, pair in expected.items():
        got = (_pop(ref, path), _pop(ours, path))
        if got != pair:
            out.append(f"state.{'.'.join(path)}: reference={got[0]!r} pycni={got[1]!r}, expected {pair} "
                       f"({DRIFT_NOTES[path]})")
    return out


def compare(ref: Attachment, ours: Attachment) -> list[str]:
    """Every difference between the two lives; [] when pycni behaved exactly like the reference, apart
    from the upstream drifts above (which are checked, not ignored)."""
    if ref.add.ok != ours.add.ok:
        return [f"ADD: reference rc={ref.add.rc} {ref.add.out} / pycni rc={ours.add.rc} {ours.add.out}"]
    diffs: list[str] = []
    if ref.add.ok:
        rs, os_ = ({**a.state, "sysctl": dict(a.state["sysctl"])} for a in (ref, ours))
        for s in (rs, os_):
            s.pop("real_mac")
        diffs += _drifts(rs, os_, ref.add.out)
        diffs += ["result." + d for d in linkstate.differences(ref.result, ours.result)]
        diffs += ["state." + d for d in linkstate.differences(rs, os_)]
    else:
        codes = (ref.add.out.get("code"), ours.add.out.get("code"))
        diffs += ["error.code" + d for d in linkstate.differences(*codes)]
    dels = [("DEL", x, y) for x, y in zip(ref.dels, ours.dels, strict=True)]
    steps = [("CHECK", ref.check, ours.check), *dels]
    for what, a, b in steps:
        if (a is None) != (b is None) or (a is not None and b is not None and a.ok != b.ok):
            diffs.append(f"{what}: reference={a and (a.rc, a.out)} pycni={b and (b.rc, b.out)}")
    for att in (ref, ours):
        label = att.run.side.label
        if att.after_del:
            diffs.append(f"{label}: link still present after DEL: {att.after_del}")
        if att.run.allocations():
            diffs.append(f"{label}: allocations left after DEL: {att.run.allocations()}")
    return diffs
