"""Moving a host netdev into a pod and home again without name collisions, and finding it again.

Into the pod: host -> a private temporary namespace (where no name can collide) -> set the marker
alias, drop altnames, rename to CNI_IFNAME, set the MAC and MTU -> pod. Home: wherever the device is (pod,
temporary namespace or already home) -> a fresh temporary namespace -> original name, alias, MTU and
MAC -> host (under a free temporary name if the original is taken, reported) -> altnames, admin state.
The device is recognised by what the record holds (marker alias, bus device, pod ifindex, permanent
MAC), never by its in-pod name alone."""

from __future__ import annotations

import os
import secrets

from cni import faults, log, netns
from cni.device.records import Attachment, Netdev
from cni.errors import CniError, ConfigError, InterfaceExistsError
from cni.netlink import links
from cni.netlink.socket import EEXIST, EINVAL, Netlink, NetlinkError, opened


def _unique(found: list[links.Link]) -> links.Link | None:
    return found[0] if len(found) == 1 else None


def find(nl: Netlink, att: Attachment, where: str) -> links.Link | None:
    """The attachment's device in the namespace of `nl` ('pod', 'temp' or 'host')."""
    candidates = [link for link in links.dump(nl) if link.name != "lo"]
    if where == "temp":  # our private namespace holds nothing else
        return _unique(candidates)
    for rule in _RULES:
        found = _unique([link for link in candidates if rule(link, att, where)])
        if found is not None:
            return found
    return None


def _by_marker(link: links.Link, att: Attachment, where: str) -> bool:
    return link.alias == att.marker


def _by_bus_device(link: links.Link, att: Attachment, where: str) -> bool:
    return bool(att.pci) and link.parent_dev == att.pci


def _by_pod_index(link: links.Link, att: Attachment, where: str) -> bool:
    """Its index in the pod (stable while it stays there), confirmed by its MAC or name."""
    same = link.mac == att.pod_mac or link.name == att.ifname
    return where == "pod" and link.index == att.pod_index and same


def _untouched(link: links.Link, att: Attachment, where: str) -> bool:
    dev = att.netdev
    return where == "host" and dev is not None and (link.index, link.name) == (dev.index, dev.name)


def _by_perm_mac(link: links.Link, att: Attachment, where: str) -> bool:
    dev = att.netdev
    return dev is not None and bool(dev.perm_mac) and link.perm_mac == dev.perm_mac


_RULES = (_by_marker, _by_bus_device, _by_pod_index, _untouched, _by_perm_mac)


def move_in(att: Attachment, temp_fd: int, pod_fd: int, ifname: str, mac: str | None,
            mtu: int = 0) -> links.Link:
    """Move the snapshot's device into the pod as `ifname` (with `mtu` when not 0); returns it as the
    pod sees it (down)."""
    dev = att.netdev
    assert dev is not None
    with opened(None) as host:
        link = links.get(host, index=dev.index)
        if link is None or link.name != dev.name:
            raise CniError(f"device {dev.name} (index {dev.index}) vanished from the host namespace")
        links.set_netns(host, link.index, temp_fd)
    faults.point("move-temp")
    with opened(temp_fd) as tmp:
        index = _prepare(tmp, att, ifname, mac, mtu)
        try:
            links.set_netns(tmp, index, pod_fd)
        except NetlinkError as e:
            if e.errno == EEXIST:
                raise InterfaceExistsError(f'CNI_IFNAME "{ifname}" already exists in {att.netns}') from None
            raise
    faults.point("move-pod")
    with opened(pod_fd) as pod:
        moved = links.get(pod, ifname)
    if moved is None:
        raise CniError(f"{ifname} vanished right after the move into {att.netns}")
    return moved


def _prepare(tmp: Netlink, att: Attachment, ifname: str, mac: str | None, mtu: int) -> int:
    link = find(tmp, att, "temp")
    assert link is not None, "device missing from its temporary namespace"
    links.set_alias(tmp, link.index, att.marker)
    for alt in link.altnames:  # an altname could collide in the pod
        links.delete_altname(tmp, link.index, alt)
    faults.point("alias")
    links.set_name(tmp, link.index, ifname)
    faults.point("rename")
    if mac:
        links.set_mac(tmp, link.index, mac)
        faults.point("mac")
    if mtu and mtu != link.mtu:
        try:
            links.set_mtu(tmp, link.index, mtu)
        except NetlinkError as e:
            if e.errno != EINVAL:
                raise
            raise ConfigError(f"mtu: {mtu} refused by {att.netdev.name if att.netdev else ifname}: "
                              f"{e.msg.split(': ', 1)[-1]}") from None
    return link.index


def bring_home(att: Attachment, pod_fd: int | None, temp_fd: int | None) -> str | None:
    """Return the device to the plugin's namespace as it was; the name it now has there, or None
    when it is in none of the places looked at (destroyed with its namespace, or moved away)."""
    for where, fd in (("pod", pod_fd), ("temp", temp_fd)):
        if fd is None:
            continue
        with opened(fd) as nl:
            link = find(nl, att, where)
        if link is not None:
            return _home_from(att, fd, link)
    with opened(None) as host:
        link = find(host, att, "host")
        if link is None:
            return None
        return _restore_at_home(host, att, link)


def _home_from(att: Attachment, src_fd: int, link: links.Link) -> str:
    dev = att.netdev
    assert dev is not None
    home = netns.current()
    try:
        with netns.temporary() as tmp_fd:
            with opened(src_fd) as src:
                links.set_netns(src, link.index, tmp_fd)
            with opened(tmp_fd) as tmp:
                moved = find(tmp, att, "temp")
                assert moved is not None
                _reset(tmp, moved, dev)
                name = _move_to_free_name(tmp, moved.index, dev.name, home)
    finally:
        os.close(home)
    with opened(None) as host:
        back = links.get(host, name)
        assert back is not None
        return _restore_at_home(host, att, back)


def _reset(nl: Netlink, link: links.Link, dev: Netdev) -> None:
    """Name, alias, MTU and MAC back to the snapshot (in a namespace where the name is free)."""
    if link.name != dev.name:
        links.set_name(nl, link.index, dev.name)
    links.set_alias(nl, link.index, dev.alias)
    if dev.mtu and link.mtu != dev.mtu:
        links.set_mtu(nl, link.index, dev.mtu)
    if dev.mac and link.mac.lower() != dev.mac.lower():
        links.set_mac(nl, link.index, dev.mac)


def _move_to_free_name(tmp: Netlink, index: int, name: str, home_fd: int) -> str:
    """Move to the host under `name`, or under a free temporary name when `name` is taken there."""
    for _attempt in range(5):
        try:
            links.set_netns(tmp, index, home_fd)
            return name
        except NetlinkError as e:
            if e.errno != EEXIST:
                raise
        taken = name
        name = "pycni" + secrets.token_hex(4)
        links.set_name(tmp, index, name)
        log.warning("device %s came home as %s: the name %s is taken in the host namespace", taken, name,
                    taken)
    raise CniError(f"cannot find a free name in the host namespace for device {name}")


def _restore_at_home(host: Netlink, att: Attachment, link: links.Link) -> str:
    """Finish the restore in the host namespace: name (when free), alias, MTU, MAC, altnames, up."""
    dev = att.netdev
    assert dev is not None
    name = link.name
    if name != dev.name:
        if links.get(host, dev.name) is None:
            links.set_up(host, link.index, False)
            links.set_name(host, link.index, dev.name)
            name = dev.name
        elif not _is_temporary(name):  # a temporary name was reported when it was given
            log.warning("device %s is home as %s: the name %s is taken", dev.name, name, dev.name)
    fresh = links.get(host, index=link.index)
    assert fresh is not None
    if fresh.alias != dev.alias or fresh.mtu != dev.mtu or fresh.mac.lower() != dev.mac.lower():
        _reset(host, fresh, Netdev(name, fresh.index, dev.mac, dev.mtu, alias=dev.alias))
    for alt in dev.altnames:
        if alt not in fresh.altnames:
            try:
                links.add_altname(host, link.index, alt)
            except NetlinkError as e:
                log.warning("device %s: altname %s not restored: %s", name, alt, e)
    if fresh.up != dev.up:
        links.set_up(host, link.index, dev.up)
    return name


def _is_temporary(name: str) -> bool:
    return name.startswith("pycni") and len(name) == 13


def set_up_in(pod_fd: int, index: int) -> None:
    with opened(pod_fd) as pod:
        links.set_up(pod, index)

