"""macvlan: a MAC-VLAN child of an uplink (RoCE shared mode), created directly in the pod."""

from __future__ import annotations

from cni import delegate, faults, ifconfig, log, netns, skel
from cni.errors import (
    CheckError,
    CniError,
    Code,
    ConfigError,
    InterfaceExistsError,
    NetnsError,
    NetnsGoneError,
    NotAvailableError,
)
from cni.netlink import links, routes
from cni.netlink.socket import EEXIST, Netlink, NetlinkError, opened
from cni.plugins import common, rail
from cni.types import fields as f
from cni.types.netconf import Request, requested_mac, require_prev_result
from cni.types.result import DNS, Interface, Result
from cni.types.valueclass import field, replace, valueclass
from cni.undo import Undo

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

MODES = ("bridge", "private", "vepa", "passthru")
MIN_MTU = 68
MAX_MTU = 65535  # no master has more; the real upper bound, the master's MTU, is checked at ADD
MTU_RULE = f"must be between {MIN_MTU} and the master's MTU (0 or absent: the master's MTU)"


@valueclass
class MacvlanConf:
    master: str = ""
    mode: str = "bridge"
    mtu: int = 0
    mac: str | None = None
    link_in_container: bool = False
    bcqueuelen: int = 0
    dad: str = "on"
    dns: DNS = field(default_factory=DNS)
    ipam: dict[str, Any] | None = None
    rail: rail.RailConf = field(default_factory=rail.RailConf)

    @staticmethod
    def from_request(req: Request) -> MacvlanConf:
        c = req.conf
        mac = f.mac(c["mac"], "mac") if c.get("mac") not in (None, "") else None
        mtu = f.opt(c, "mtu", int, "", 0)
        if mtu and not MIN_MTU <= mtu <= MAX_MTU:
            raise ConfigError(f"mtu: {mtu} out of range: {MTU_RULE}")
        master = f.opt(c, "master", str, "", "")
        problem = skel.ifname_problem(master) if master else None
        if problem:
            raise ConfigError(f"master: {f.show(master)} {problem}")
        return MacvlanConf(
            master=master,
            mode=f.choice(c, "mode", "", MODES, "bridge"),
            mtu=mtu,
            mac=requested_mac(req, mac),
            link_in_container=common.opt_bool(c, "linkInContainer"),
            bcqueuelen=f.int_range(c, "bcqueuelen", "", 0, 2**32 - 1, 0),
            dad=f.choice(c, "dad", "", ifconfig.DAD_MODES, "on"),
            dns=req.dns(),
            ipam=req.ipam(),
            rail=rail.RailConf.from_conf(c, req.ifname),
        )


def _where(conf: MacvlanConf, req: Request) -> str:
    return (
        f"the container network namespace {req.netns}"
        if conf.link_in_container
        else "the host network namespace"
    )


def find_master(nl: Netlink, conf: MacvlanConf, req: Request) -> links.Link:
    name = conf.master
    if not name:
        index = routes.default_route_oif(nl)
        master = links.get(nl, index=index) if index else None
        if master is None:
            raise ConfigError(f"master: not set, and there is no default route in {_where(conf, req)}")
        return master
    master = links.get(nl, name)
    if master is None:
        raise ConfigError(f'master: interface "{name}" not found in {_where(conf, req)}')
    return master


def add(req: Request) -> Result:
    common.setup_logging(req.conf, "macvlan")
    conf = MacvlanConf.from_request(req)
    with netns.opened(req.netns) as ns_fd, opened(ns_fd) as pod_nl:
        if conf.link_in_container:
            return _add(req, conf, ns_fd, pod_nl, pod_nl)
        with opened(None) as host_nl:
            return _add(req, conf, ns_fd, pod_nl, host_nl)


def _add(req: Request, conf: MacvlanConf, ns_fd: int, pod_nl: Netlink, master_nl: Netlink) -> Result:
    master = find_master(master_nl, conf, req)
    if conf.mtu > master.mtu:
        raise ConfigError(
            f"mtu: {conf.mtu} is larger than the MTU of master {master.name}: must be between {MIN_MTU} "
            f"and {master.mtu} (0 or absent: {master.mtu})"
        )
    if links.get(pod_nl, req.ifname) is not None:
        raise InterfaceExistsError(f'CNI_IFNAME "{req.ifname}" already exists in {req.netns}')
    tmp = temp_name(req)
    _remove_stale_temp(pod_nl, tmp, req)
    with Undo() as undo:
        links.create_macvlan(
            master_nl,
            tmp,
            master.index,
            conf.mode,
            mtu=conf.mtu,
            mac=conf.mac,
            bcqueuelen=conf.bcqueuelen,
            netns_fd=None if conf.link_in_container else ns_fd,
        )
        created = links.get(pod_nl, tmp)
        assert created is not None, "macvlan vanished right after creation"
        undo.push(f"delete macvlan {req.ifname}", links.delete, pod_nl, created.index)
        faults.point("link")
        try:
            links.set_name(pod_nl, created.index, req.ifname)
        except NetlinkError as e:
            if e.errno == EEXIST:
                raise InterfaceExistsError(
                    f'CNI_IFNAME "{req.ifname}" already exists in {req.netns}'
                ) from None
            raise
        faults.point("rename")
        link = links.get(pod_nl, index=created.index)
        assert link is not None
        iface = Interface(name=req.ifname, mac=link.mac, sandbox=req.netns, mtu=link.mtu)
        if conf.ipam is None:
            links.set_up(pod_nl, link.index)
            result = rail.apply(ns_fd, link.index, Result(interfaces=(iface,), dns=conf.dns), conf.rail,
                                req.version, undo)
            undo.commit()
            return result
        # pushed first: the spec asks for a DEL after a failed ADD too, and an IPAM that exited 0 with
        # output we cannot use may still hold an allocation
        undo.push("release the IPAM allocation", _release_after_failed_add, req)
        ipam_result = common.ipam_add(req)
        faults.point("ipam")
        # The config's dns replaces whatever the IPAM returned, even when empty, as in the reference
        # (`result.DNS = n.DNS`): runtimes write resolv.conf from it, so passing the IPAM's through
        # would change pods that move from the Go plugin to this one.
        result = replace(ipam_result.with_interface(iface), dns=conf.dns)
        ifconfig.configure(ns_fd, link.index, result, dad=conf.dad)
        faults.point("configure")
        result = rail.apply(ns_fd, link.index, result, conf.rail, req.version, undo)
        faults.point("rail")
        undo.commit()
    log.info(
        "ADD %s/%s: macvlan on %s, %d address(es)", req.container_id, req.ifname, master.name, len(result.ips)
    )
    return result


def _release_after_failed_add(req: Request) -> None:
    """DEL to the IPAM after a failed ADD. An IPAM that refuses the configuration (code 7) refused it
    on ADD as well and holds nothing: that is no incomplete rollback."""
    try:
        delegate.delete(req)
    except CniError as e:
        if e.code != Code.INVALID_CONFIG:
            raise
        log.debug("IPAM DEL after the failed ADD: %s", e)


def temp_name(req: Request) -> str:
    """The name the link has in the pod before its rename to CNI_IFNAME: fixed per attachment, so a
    DEL after an ADD that died before the rename finds it (zlib: importing hashlib costs every call)."""
    import zlib

    return f"pc{zlib.crc32(f'{req.container_id}/{req.ifname}'.encode(errors='surrogateescape')):08x}"


def _remove_stale_temp(nl: Netlink, tmp: str, req: Request) -> bool:
    """A macvlan under this attachment's temporary name is what a killed ADD left: remove it."""
    link = links.get(nl, tmp)
    if link is None or link.name != tmp or link.kind != "macvlan":
        return False
    log.warning("%s/%s: removing %s left by an interrupted ADD", req.container_id, req.ifname, tmp)
    links.delete(nl, link.index)
    return True


def delete(req: Request) -> None:
    """Remove the link if it is ours (a macvlan), then release IPAM. Missing netns or link: fine.
    A CNI_NETNS that is no network namespace is an error, reported after the IPAM release: no retry
    can ever reach that link, and the address must not leak (the reference releases first too)."""
    common.setup_logging(req.conf, "macvlan")
    unreachable: NetnsError | None = None
    rail.remove_for(req)
    try:
        _delete_link(req)
    except NetnsGoneError as e:
        log.info("DEL %s: %s; nothing to remove there", req.container_id, e.msg)
    except NetnsError as e:
        unreachable = e
    if req.ipam() is not None:
        delegate.delete(req)
    if unreachable is not None:
        raise unreachable


def _delete_link(req: Request) -> None:
    if not req.netns:
        return
    with netns.opened(req.netns) as ns_fd, opened(ns_fd) as nl:
        _remove_stale_temp(nl, temp_name(req), req)
        link = links.get(nl, req.ifname)
        if link is None:
            log.debug("DEL %s: %s already gone", req.container_id, req.ifname)
        elif link.name != req.ifname:  # the kernel also finds a link by an alternative name
            log.warning("DEL %s: %s is an altname of %s; left alone", req.container_id, req.ifname, link.name)
        elif link.kind != "macvlan":
            kind = link.kind or "plain"
            log.warning("DEL %s: %s is a %s link, not ours; left alone", req.container_id, req.ifname, kind)
        else:
            links.delete(nl, link.index)


def check(req: Request) -> None:
    common.setup_logging(req.conf, "macvlan")
    conf = MacvlanConf.from_request(req)
    with netns.opened(req.netns) as ns_fd, opened(ns_fd) as pod_nl:
        if conf.ipam is not None:
            delegate.check(req)
        prev = require_prev_result(req)
        idx, iface = common.our_interface(prev, req)
        if conf.link_in_container:
            master = find_master(pod_nl, conf, req)
        else:
            with opened(None) as host_nl:
                master = find_master(host_nl, conf, req)
        link = links.get(pod_nl, req.ifname)
        if link is None:
            raise CheckError(f"{req.ifname}: not found in {req.netns}")
        _check_link(link, conf, iface, master)
        common.check_ips_and_routes(pod_nl, link.index, req.ifname, prev, idx)
        rail.check(ns_fd, link.index, req.ifname, prev, idx, conf.rail)


def _check_link(link: links.Link, conf: MacvlanConf, iface: Interface, master: links.Link) -> None:
    name = link.name
    if link.kind != "macvlan":
        raise CheckError(f"{name}: is a {link.kind or 'plain'} link, expected macvlan")
    if link.macvlan_mode != conf.mode:
        raise CheckError(
            f"{name}: macvlan mode {link.macvlan_mode} does not match the configured {conf.mode}"
        )
    if iface.mac and link.mac.lower() != iface.mac.lower():
        raise CheckError(f"{name}: MAC {link.mac} does not match prevResult {iface.mac}")
    if link.parent != master.index:
        raise CheckError(f"{name}: its master is link {link.parent}, not {master.name} ({master.index})")
    # No MTU check: a plugin chained after us (tuning) may change it, and CHECK must allow that.


def status(req: Request) -> None:
    conf = MacvlanConf.from_request(req)
    if not conf.link_in_container:
        with opened(None) as nl:
            try:
                find_master(nl, conf, req)
            except ConfigError as e:
                raise NotAvailableError(e.msg) from None
    if conf.ipam is not None:
        delegate.status(req)


def gc(req: Request) -> None:
    """macvlan keeps no state outside the pod; GC only reaches the IPAM."""
    if req.ipam() is not None:
        delegate.gc(req)
