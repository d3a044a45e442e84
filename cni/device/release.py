"""DEL and GC for device plugins: restore from the record (never from the DEL-time config or the
in-pod name), skip devices that now belong to another attachment, then release the IPAM. A missing
record, namespace or device is success (logged)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import replace

from cni import delegate, log, netns
from cni.device import move
from cni.device.conf import DeviceConf, Hooks, hooks_for
from cni.device.records import Attachment, Records, netns_id, same_attachment
from cni.errors import CniError, NetnsError
from cni.plugins import rail
from cni.types.netconf import Request


def delete(req: Request, conf: DeviceConf) -> None:
    recs = Records(conf.state_dir)
    rail.remove_for(req)  # while the device is still in the pod
    att = recs.load(req.container_id, req.ifname)
    failure: CniError | None = None
    if att is None:
        log.info("DEL %s/%s: no record of this attachment (deleted already, or ADD never began); "
                 "releasing the IPAM only", req.container_id, req.ifname)
    else:
        try:
            with recs.lock(att.key, att.key):
                att = recs.load(req.container_id, req.ifname)
                if att is not None:
                    detach(recs, att, req.netns, hooks_for(att.plugin))
        except CniError as e:  # the record stays: the next DEL tries again
            failure, att = e, None
    if conf.ipam is not None:
        delegate.delete(req)
    if failure is not None:
        raise failure
    if att is not None:
        recs.remove(att)


def detach(recs: Records, att: Attachment, netns_path: str, hooks: Hooks | None) -> str | None:
    """Restore the device and its VF settings, unless it now belongs to another attachment; then
    mark the record released (only the IPAM release is left). Returns the name the netdev has at
    home, if it was brought there."""
    home = None
    if att.state == "released":
        return None
    owner = recs.owner(att.key)
    if owner is not None and not same_attachment(owner, att):
        log.warning("%s/%s: %s now belongs to %s/%s; left alone", att.container_id, att.ifname, att.key,
                    owner.get("containerID"), owner.get("ifname"))
    else:
        if hooks is not None:
            hooks.restore(att)
        if att.netdev is not None:
            home = _device_home(att, netns_path)
        recs.unclaim(att)
    recs.save(replace(att, state="released"))
    return home


def _device_home(att: Attachment, netns_path: str) -> str | None:
    dev = att.netdev
    assert dev is not None
    with _pod_ns(att, netns_path) as pod_fd:
        name = move.bring_home(att, pod_fd, None)
    if name is None:
        log.warning("%s/%s: device %s found neither in the pod nor at home (destroyed with its "
                    "namespace?); nothing to bring back", att.container_id, att.ifname, dev.name)
    else:
        log.info("%s/%s: device %s is home as %s", att.container_id, att.ifname, dev.name, name)
    return name


@contextlib.contextmanager
def _pod_ns(att: Attachment, netns_path: str) -> Iterator[int | None]:
    """The pod namespace if it still exists: CNI_NETNS, else the recorded path if it still is the
    namespace of the ADD (paths are reused)."""
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
    """Bring home the devices of this network's attachments the runtime no longer lists, then GC the
    IPAM. Every failure is reported; none stops the rest."""
    recs = Records(conf.state_dir)
    valid = req.valid_attachments()
    if valid is None:
        log.warning("GC without cni.dev/valid-attachments: device records left alone")
    stale = [a for a in recs.all() if valid is not None and a.plugin == plugin and a.network == req.name
             and (a.container_id, a.ifname) not in valid]
    errors: list[str] = []
    codes: list[int] = []
    for att in stale:
        try:
            with recs.lock(att.key, att.key):
                current = recs.load(att.container_id, att.ifname)  # as it is now, under the lock
                if current is not None:
                    detach(recs, current, "", hooks_for(current.plugin))
                    recs.remove(current)
            log.info("GC: %s/%s released %s", att.container_id, att.ifname, att.key)
        except CniError as e:
            errors.append(f"{att.container_id}/{att.ifname}: {e}")
            codes.append(int(e.code))
    if conf.ipam is not None:
        try:
            delegate.gc(req)
        except CniError as e:
            errors.append(f"ipam: {e}")
            codes.append(int(e.code))
    if errors:  # the first failure's code: a bad ipam section stays code 7, an outage code 11
        raise CniError("GC incomplete: " + "; ".join(errors), code=codes[0])
