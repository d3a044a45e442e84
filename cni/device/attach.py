"""The ADD/DEL/CHECK/STATUS/GC flow shared by host-device and sriov: lock the device, check who owns
it, snapshot it durably before any change, move it in (or not, for userspace-driver devices), run the
IPAM, and undo every step when one fails; DEL finds everything by the record and is idempotent.

The plugins contribute the device (`Target`) and, for SR-IOV, `Hooks` that snapshot, apply, restore
and check the PF-side VF settings."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from cni import delegate, faults, ifconfig, log, netns
from cni.device import move
from cni.device.records import Attachment, Netdev, Records, netns_id, owner_alive, same_attachment
from cni.device.store import DEFAULT_DIR
from cni.errors import (
    CheckError,
    CniError,
    ConfigError,
    DeviceBusyError,
    InterfaceExistsError,
    NetnsError,
)
from cni.netlink import links
from cni.netlink.socket import opened
from cni.plugins import common
from cni.types import fields as f
from cni.types.netconf import Request, require_prev_result
from cni.types.result import DNS, Interface, Result
from cni.undo import Undo


@dataclass(frozen=True)
class DeviceConf:
    """Settings both device plugins share."""

    state_dir: str = DEFAULT_DIR
    dad: str = "on"
    dns: DNS = field(default_factory=DNS)
    ipam: dict[str, Any] | None = None

    @staticmethod
    def from_request(req: Request) -> DeviceConf:
        state_dir = f.opt(req.conf, "stateDir", str, "", DEFAULT_DIR)
        if not os.path.isabs(state_dir):
            raise ConfigError(f'stateDir: "{state_dir}" is not an absolute path')
        return DeviceConf(state_dir, f.choice(req.conf, "dad", "", ifconfig.DAD_MODES, "on"), req.dns(),
                          req.ipam())


@dataclass(frozen=True)
class Target:
    """The device an ADD asked for. `netdev` empty: a userspace-driver device (nothing is moved)."""

    key: str
    what: str  # how messages name it: 'VF 0000:af:06.0', 'device eth3'
    pci: str = ""
    netdev: str = ""
    driver: str = ""


class Hooks(Protocol):
    def snapshot(self, att: Attachment) -> Attachment: ...

    def apply(self, att: Attachment, undo: Undo) -> None: ...

    def restore(self, att: Attachment) -> None: ...

    def check(self, att: Attachment) -> None: ...


def hooks_for(plugin: str, env: Any) -> Hooks | None:
    """Restore-only hooks for a record (of either plugin), e.g. when recovering a stale one."""
    if plugin == "sriov":
        from cni.sriov.settings import VfHooks
        from cni.sriov.vf import control

        return VfHooks(control(env))
    return None


# ---- ADD ------------------------------------------------------------------------------------------


def add(req: Request, plugin: str, conf: DeviceConf, target: Target, hooks: Hooks | None,
        mac: str | None = None) -> Result:
    recs = Records(conf.state_dir)
    with netns.opened(req.netns) as pod_fd:
        with opened(pod_fd) as pod:
            if links.get(pod, req.ifname) is not None:
                raise InterfaceExistsError(f'CNI_IFNAME "{req.ifname}" already exists in {req.netns}')
        with recs.lock(target.key, target.what):
            _recover_leftovers(recs, req, target)
            att = _snapshot(req, plugin, target, hooks)
            recs.claim(att)
            recs.save(att)
            with netns.temporary() as temp_fd, Undo() as undo:
                undo.push("forget the attachment", recs.forget, att)
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


def _recover_leftovers(recs: Records, req: Request, target: Target) -> None:
    """Before taking the device: undo what a crashed ADD of this attachment left, and free the
    device from an owner whose namespace is gone. A live owner makes the device busy."""
    own = recs.load(req.container_id, req.ifname)
    if own is not None:
        log.warning("ADD %s/%s: a record of this attachment exists (state %s); restoring it first",
                    req.container_id, req.ifname, own.state)
        detach(recs, own, "", hooks_for(own.plugin, req.env))
        recs.remove(own)
    owner = recs.owner(target.key)
    if owner is None:
        return
    held = recs.load(str(owner.get("containerID")), str(owner.get("ifname")))
    if held is not None and owner_alive(owner):
        raise DeviceBusyError(
            f"{target.what} is attached to container {owner.get('containerID')} "
            f"(ifname {owner.get('ifname')}, netns {owner.get('netns')}, pod {owner.get('podRef') or '?'})"
            "; a device serves one attachment at a time")
    log.warning("%s: owner %s/%s is gone (netns %s); recovering the device", target.what,
                owner.get("containerID"), owner.get("ifname"), owner.get("netns"))
    if held is not None:
        detach(recs, held, "", hooks_for(held.plugin, req.env))
        recs.remove(held)
    else:
        recs.dir.remove("owners", target.key)


def _attach(req: Request, conf: DeviceConf, recs: Records, att: Attachment, pod_fd: int, temp_fd: int,
            undo: Undo, mac: str | None) -> Result:
    index = 0
    if att.netdev is not None:
        link = move.move_in(att, temp_fd, pod_fd, req.ifname, mac)
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
            result = replace(result, dns=conf.dns)
        if index:
            ifconfig.configure(pod_fd, index, result, dad=conf.dad)
            faults.point("configure")
    elif index:
        move.set_up_in(pod_fd, index)
    recs.save(replace(att, state="attached"))
    faults.point("record")
    return result


# ---- DEL and GC ---------------------------------------------------------------------------------


def delete(req: Request, plugin: str, conf: DeviceConf) -> None:
    """Bring the device home as it was and release the IPAM. Idempotent: a missing record, netns or
    device is success (logged)."""
    recs = Records(conf.state_dir)
    att = recs.load(req.container_id, req.ifname)
    if att is None:
        log.info("DEL %s/%s: no record of this attachment (already deleted, or ADD never began); "
                 "releasing the IPAM only", req.container_id, req.ifname)
    else:
        with recs.lock(att.key, att.key):
            att = recs.load(req.container_id, req.ifname)
            if att is not None:
                detach(recs, att, req.netns, hooks_for(att.plugin, req.env))
    if conf.ipam is not None:
        delegate.delete(req)
    if att is not None:
        recs.remove(att)


def detach(recs: Records, att: Attachment, netns_path: str, hooks: Hooks | None) -> None:
    """Restore the device and its VF settings unless the device now belongs to someone else;
    then mark the record released (only the IPAM release is left)."""
    if att.state == "released":
        return
    owner = recs.owner(att.key)
    if owner is not None and not same_attachment(owner, att):
        log.warning("%s/%s: device %s now belongs to %s/%s; left alone", att.container_id, att.ifname,
                    att.key, owner.get("containerID"), owner.get("ifname"))
    else:
        if hooks is not None:
            hooks.restore(att)
        if att.netdev is not None:
            _device_home(att, netns_path)
        recs.unclaim(att)
    recs.save(replace(att, state="released"))


def _device_home(att: Attachment, netns_path: str) -> None:
    dev = att.netdev
    assert dev is not None
    with _pod_ns(att, netns_path) as pod_fd:
        name = move.bring_home(att, pod_fd, None)
    if name is None:
        log.warning("%s/%s: device %s found neither in the pod nor at home (destroyed with its "
                    "namespace?); nothing to bring back", att.container_id, att.ifname, dev.name)
    else:
        log.info("%s/%s: device %s is home as %s", att.container_id, att.ifname, dev.name, name)


@contextlib.contextmanager
def _pod_ns(att: Attachment, netns_path: str) -> Iterator[int | None]:
    """The pod namespace if it still exists: CNI_NETNS, else the recorded path if it is the same
    namespace as at ADD (a path can be reused)."""
    path = netns_path
    if not path and att.netns and netns_id(att.netns) == att.netns_id:
        path = att.netns
    fd = None
    if path:
        try:
            fd = netns.open_netns(path)
        except NetnsError as e:
            log.info("%s/%s: %s; looking for the device at home", att.container_id, att.ifname, e.msg)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def gc(req: Request, plugin: str, conf: DeviceConf) -> None:
    """Bring home the devices of this network's attachments the runtime no longer lists; then GC
    the IPAM. Every failure is reported, none stops the rest."""
    recs = Records(conf.state_dir)
    valid = req.valid_attachments()
    errors: list[str] = []
    if valid is None:
        log.warning("GC without cni.dev/valid-attachments: device records left alone")
    for att in recs.all() if valid is not None else ():
        if att.plugin != plugin or att.network != req.name or (att.container_id, att.ifname) in (valid or ()):
            continue
        try:
            with recs.lock(att.key, att.key):
                detach(recs, att, "", hooks_for(att.plugin, req.env))
                recs.remove(att)
            log.info("GC: %s/%s released %s", att.container_id, att.ifname, att.key)
        except CniError as e:
            errors.append(f"{att.container_id}/{att.ifname}: {e}")
    if conf.ipam is not None:
        try:
            delegate.gc(req)
        except CniError as e:
            errors.append(f"ipam: {e}")
    if errors:
        raise CniError("GC incomplete: " + "; ".join(errors))


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
        hooks = hooks_for(att.plugin, req.env)
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
            common.check_ips_and_routes(pod, link.index, req.ifname, prev, idx)


def status(req: Request, conf: DeviceConf) -> None:
    from cni.errors import NotAvailableError

    try:
        Records(conf.state_dir).usable()
    except CniError as e:
        raise NotAvailableError(e.msg) from None
    if conf.ipam is not None:
        delegate.status(req)
