"""ADD, CHECK and STATUS shared by host-device and sriov: lock the device, check who owns it, snapshot
it durably before any change, move it in (or not, for userspace-driver devices), run the IPAM, and
undo every step when one fails. The plugins contribute the device (`Target`) and, for SR-IOV, `Hooks`
for the PF-side VF settings. DEL and GC are in cni.device.release."""

from __future__ import annotations

from dataclasses import replace

from cni import delegate, faults, ifconfig, log, netns
from cni.device import move
from cni.device.conf import DeviceConf, Hooks, Target, hooks_for
from cni.device.records import Attachment, Netdev, Records, netns_id, owner_alive, same_attachment
from cni.device.release import detach
from cni.errors import (
    CheckError,
    CniError,
    ConfigError,
    DeviceBusyError,
    InterfaceExistsError,
    NotAvailableError,
)
from cni.netlink import links
from cni.netlink.socket import opened
from cni.plugins import common, rail
from cni.types import valueclass
from cni.types.netconf import Request, require_prev_result
from cni.types.result import Interface, Result
from cni.undo import Undo

# ---- ADD ------------------------------------------------------------------------------------------


def add(req: Request, plugin: str, conf: DeviceConf, target: Target, hooks: Hooks | None,
        mac: str | None = None) -> Result:
    if conf.mtu and not target.netdev:
        raise ConfigError(f"mtu: {target.what} is bound to {target.driver}: no network interface to set "
                          "it on")
    recs = Records(conf.state_dir)
    with netns.opened(req.netns) as pod_fd:
        with opened(pod_fd) as pod:
            if links.get(pod, req.ifname) is not None:
                raise InterfaceExistsError(f'CNI_IFNAME "{req.ifname}" already exists in {req.netns}')
        with recs.lock(target.key, target.what):
            home = _recover_leftovers(recs, req, target)
            if home and target.netdev:  # bringing it home may have renamed it
                target = replace(target, netdev=home)
            att = _snapshot(req, plugin, target, hooks)
            recs.claim(att)
            try:
                recs.save(att)
            except BaseException:  # e.g. a container id too long for a file name: no stray owner
                recs.unclaim(att)
                raise
            with netns.temporary() as temp_fd, Undo() as undo:
                undo.push("forget the attachment", _forget_unless_stranded, recs, att, undo)
                if not att.userspace:
                    undo.push(f"bring {target.what} home", move.bring_home, att, pod_fd, temp_fd)
                faults.point("snapshot")
                if hooks is not None:
                    hooks.apply(att, undo)
                result = _attach(req, conf, recs, att, pod_fd, temp_fd, undo, mac)
                undo.commit()
    log.info("ADD %s/%s: %s attached, %d address(es)", req.container_id, req.ifname, target.what,
             len(result.ips))
    return result


def _forget_unless_stranded(recs: Records, att: Attachment, undo: Undo) -> None:
    """The last rollback step: drop the records, unless an earlier step failed to put something
    back; then the records stay, so the DEL that follows a failed ADD can finish the job."""
    if undo.failed:
        log.error("%s/%s: rollback incomplete; the record stays for DEL", att.container_id, att.ifname)
        return
    recs.forget(att)


def _snapshot(req: Request, plugin: str, target: Target, hooks: Hooks | None) -> Attachment:
    netdev = None
    if target.netdev:
        with opened(None) as host:
            link = links.get(host, target.netdev)
        if link is None:
            raise ConfigError(f"{target.what}: interface {target.netdev} not found in the host network "
                              "namespace")
        netdev = Netdev.of(link)
    att = Attachment(plugin=plugin, network=req.name, container_id=req.container_id, ifname=req.ifname,
                     netns=req.netns, key=target.key, pci=target.pci, driver=target.driver,
                     netns_id=netns_id(req.netns), pod_uid=req.args.pod_uid, pod_ref=req.args.pod_ref,
                     netdev=netdev)
    return hooks.snapshot(att) if hooks is not None else att


def _recover_leftovers(recs: Records, req: Request, target: Target) -> str | None:
    """Before taking the device: undo what a crashed ADD of this attachment left, and free the
    device from an owner whose namespace is gone. A live owner makes the device busy. Returns the
    name the target's netdev got at home, if it was brought there."""
    home = None
    own = recs.load(req.container_id, req.ifname)
    if own is not None:
        log.warning("ADD %s/%s: a record of this attachment exists (state %s); restoring it first",
                    req.container_id, req.ifname, own.state)
        name = detach(recs, own, "", hooks_for(own.plugin))
        home = name if own.key == target.key else None
        recs.remove(own)
    owner = recs.owner(target.key)
    if owner is None:
        return home
    held = recs.load(str(owner.get("containerID")), str(owner.get("ifname")))
    if held is not None and owner_alive(owner):
        raise DeviceBusyError(
            f"{target.what} is attached to container {owner.get('containerID')} "
            f"(ifname {owner.get('ifname')}, netns {owner.get('netns')}, pod {owner.get('podRef') or '?'})"
            "; a device serves one attachment at a time")
    log.warning("%s: owner %s/%s is gone (netns %s); recovering the device", target.what,
                owner.get("containerID"), owner.get("ifname"), owner.get("netns"))
    if held is None:
        recs.dir.remove("owners", target.key)
        return home
    home = detach(recs, held, "", hooks_for(held.plugin))
    recs.remove(held)
    return home


def _attach(req: Request, conf: DeviceConf, recs: Records, att: Attachment, pod_fd: int, temp_fd: int,
            undo: Undo, mac: str | None) -> Result:
    index = 0
    if att.netdev is not None:
        link = move.move_in(att, temp_fd, pod_fd, req.ifname, mac, conf.mtu)
        att = replace(att, pod_index=link.index, pod_mac=link.mac)
        index = link.index
        iface = Interface(req.ifname, link.mac, req.netns, mtu=link.mtu, pci_id=att.pci)
    else:
        iface = Interface(req.ifname, mac or "", req.netns, pci_id=att.pci)
    result = Result(interfaces=(iface,), dns=conf.dns)
    if conf.ipam is not None:
        result = common.ipam_add(req).with_interface(iface)
        undo.push("release the IPAM allocation", delegate.delete, req)
        faults.point("ipam")
        if conf.dns:
            result = valueclass.replace(result, dns=conf.dns)
        if index:
            ifconfig.configure(pod_fd, index, result, dad=conf.dad)
            faults.point("configure")
    elif index:
        move.set_up_in(pod_fd, index)
    if index:
        result = rail.apply(pod_fd, index, result, conf.rail, req.version, undo)
        faults.point("rail")
    recs.save(replace(att, state="attached"))
    faults.point("record")
    return result


# ---- CHECK and STATUS ---------------------------------------------------------------------------


def check(req: Request, conf: DeviceConf) -> None:
    recs = Records(conf.state_dir)
    with netns.opened(req.netns) as pod_fd:
        if conf.ipam is not None:
            delegate.check(req)
        prev = require_prev_result(req)
        idx, iface = common.our_interface(prev, req)
        att = recs.load(req.container_id, req.ifname)
        if att is None or att.state != "attached":
            raise CheckError(f"{req.ifname}: no record of an attached device for this attachment")
        owner = recs.owner(att.key)
        if owner is None or not same_attachment(owner, att):
            raise CheckError(f"{req.ifname}: device {att.key} is no longer owned by this attachment")
        hooks = hooks_for(att.plugin)
        if hooks is not None:
            hooks.check(att)
        if att.netdev is None:
            return
        with opened(pod_fd) as pod:
            link = move.find(pod, att, "pod")
            if link is None:
                raise CheckError(f"{req.ifname}: device {att.netdev.name} not found in {req.netns}")
            if link.name != req.ifname:
                raise CheckError(f"{req.ifname}: device {att.netdev.name} is named {link.name} in the pod")
            if iface.mac and link.mac.lower() != iface.mac.lower():
                raise CheckError(f"{req.ifname}: MAC {link.mac} does not match prevResult {iface.mac}")
            if conf.mtu and link.mtu != conf.mtu:
                raise CheckError(f"{req.ifname}: MTU {link.mtu} does not match mtu {conf.mtu}")
            common.check_ips_and_routes(pod, link.index, req.ifname, prev, idx)
        rail.check(pod_fd, link.index, req.ifname, prev, idx, conf.rail)


def status(req: Request, conf: DeviceConf) -> None:
    try:
        Records(conf.state_dir).usable()
    except CniError as e:
        raise NotAvailableError(e.msg) from None
    if conf.ipam is not None:
        delegate.status(req)
