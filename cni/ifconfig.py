"""Apply an IPAM result to a link inside its namespace: sysctls, addresses, link up, DAD, routes,
announcements. The link is found by index, so the caller's name for it does not matter."""

from __future__ import annotations

import ipaddress
import time

from cni import announce, netns, sysctl
from cni.errors import CniError, Code
from cni.netlink import addrs, links, routes
from cni.netlink.socket import Netlink, NetlinkError
from cni.types.result import Result

DAD_MODES = ("on", "optimistic", "off")
DAD_TIMEOUT = 5.0


def configure(ns_fd: int, index: int, result: Result, *, dad: str = "on", notify: bool = True) -> None:
    """Configure link `index` in namespace `ns_fd` with `result` (its IPs and routes)."""
    with netns.entered(ns_fd):
        nl = Netlink()
        try:
            _configure(nl, index, result, dad, notify)
        finally:
            nl.close()


def _configure(nl: Netlink, index: int, result: Result, dad: str, notify: bool) -> None:
    link = links.get(nl, index=index)
    if link is None:
        raise CniError(f"link {index} vanished while being configured", code=Code.NETLINK)
    name = link.name
    if notify:
        # IPv6: the kernel announces every address once it is usable (at link-up when DAD is off or
        # optimistic, when DAD completes otherwise); one of ours would be a second NA, or an NA for a
        # tentative address
        sysctl.write(f"ipv6/conf/{name}/ndisc_notify", "1")
    has_v6 = any(ip.version == 6 for ip in result.ips)
    if has_v6:
        for key in (f"ipv6/conf/{name}/disable_ipv6", "ipv6/conf/lo/disable_ipv6"):
            sysctl.write(key, "0")
        sysctl.write(f"ipv6/conf/{name}/keep_addr_on_down", "1")
        if dad == "optimistic":
            sysctl.write(f"ipv6/conf/{name}/optimistic_dad", "1")
    if notify and not link.up:
        # IPv4: with arp_notify set while the link is down, the kernel sends one gratuitous ARP per
        # address at link-up (what the Go reference does); no packet socket of ours, whose close
        # waits for an RCU grace period
        sysctl.write(f"ipv4/conf/{name}/arp_notify", "1")
    flags = {"on": 0, "optimistic": addrs.IFA_F_OPTIMISTIC, "off": addrs.IFA_F_NODAD}[dad]
    for ip in result.ips:
        try:
            addrs.add(nl, index, ip.address, flags if ip.version == 6 else 0)
        except NetlinkError as e:
            raise CniError(f"add address {ip.address} to {name}: {e}", code=Code.NETLINK) from None
    links.set_up(nl, index)
    if dad == "on" and any(ip.version == 6 and ip.gateway for ip in result.ips):
        wait_dad(nl, index, name)
    _add_routes(nl, index, result)
    if notify:
        _announce(name, link, result, dad)


def _announce(name: str, link: links.Link, result: Result, dad: str) -> None:
    """Addresses the kernel does not announce. On a link that was down before the ADD, it announces
    them all at link-up (arp_notify, ndisc_notify above). On a link that was already up it announces
    none of the IPv4 addresses and, of the IPv6 ones, only those that go through DAD: we send the rest,
    then set arp_notify so that the kernel announces later MAC changes without repeating ours now."""
    if not link.up:
        return
    ips = [ip.address.ip for ip in result.ips if ip.version == 4 or dad != "on"]
    if ips:
        announce.announce(name, link.mac, ips)
    sysctl.write(f"ipv4/conf/{name}/arp_notify", "1")


def _add_routes(nl: Netlink, index: int, result: Result) -> None:
    gateways: dict[int, ipaddress.IPv4Address | ipaddress.IPv6Address] = {}
    for ip in result.ips:
        if ip.gateway is not None:
            gateways.setdefault(ip.version, ip.gateway)
    for r in result.routes:
        gw = r.gw if r.gw is not None else gateways.get(r.dst.version)
        try:
            routes.add(
                nl,
                r.dst,
                gw,
                index,
                priority=r.priority,
                table=r.table,
                scope=r.scope,
                mtu=r.mtu,
                advmss=r.advmss,
            )
        except NetlinkError as e:
            raise CniError(f"add route {r.dst} via {gw or 'link'}: {e}", code=Code.NETLINK) from None


def wait_dad(nl: Netlink, index: int, name: str, timeout: float = DAD_TIMEOUT) -> None:
    """Wait until no IPv6 address of the link is tentative; DADFAILED is an error. A timeout is an
    error only when the link is operationally up (without carrier DAD never completes)."""
    deadline = time.monotonic() + timeout
    while True:
        pending = [a for a in addrs.dump(nl, index) if a.address.version == 6]
        failed = [a for a in pending if a.dad_failed]
        if failed:
            raise CniError(
                f"duplicate address detection failed on {name} for {failed[0].address}", code=Code.DAD_FAILED
            )
        if not any(a.tentative for a in pending):
            return
        if time.monotonic() > deadline:
            link = links.get(nl, index=index)
            if link is not None and link.operstate == "UP":
                raise CniError(
                    f"{name}: IPv6 addresses still tentative after {timeout:.0f}s", code=Code.DAD_FAILED
                )
            return
        time.sleep(0.05)
