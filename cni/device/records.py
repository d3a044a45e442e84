"""What a device plugin remembers between ADD and DEL, in a StateDir:

  attachments/<containerID>:<ifname>  the snapshot taken before any change (plus what ADD did)
  owners/<device key>                 which attachment holds a device (a VF, a NIC)
  locks/<device key>                  serialises every operation on one device

A container ID cannot contain ':' and an interface name cannot either, so file names are unique."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from cni import jsonio, log, netns
from cni.device.statedir import StateDir
from cni.errors import CniError
from cni.netlink.links import Link

VERSION = 1


@dataclass(frozen=True)
class Netdev:
    """A host netdev as it was before ADD touched it."""

    name: str
    index: int
    mac: str = ""
    mtu: int = 0
    up: bool = False
    alias: str = ""
    altnames: tuple[str, ...] = ()
    perm_mac: str = ""
    parent: str = ""

    @staticmethod
    def of(link: Link) -> Netdev:
        return Netdev(link.name, link.index, link.mac, link.mtu, link.up, link.alias, link.altnames,
                      link.perm_mac, link.parent_dev)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Netdev:
        return Netdev(**{**_known(Netdev, d), "altnames": tuple(d.get("altnames", ()))})


@dataclass(frozen=True)
class Attachment:
    plugin: str
    network: str
    container_id: str
    ifname: str
    netns: str
    key: str  # the device's ownership key: "pci-<address>", "aux-<id>" or "net-<name>"
    pci: str = ""
    driver: str = ""
    netns_id: str = ""  # "<st_dev>:<st_ino>" of CNI_NETNS at ADD
    pod_uid: str = ""
    pod_ref: str = ""
    state: str = "adding"  # adding -> attached -> released (device home, IPAM release pending)
    netdev: Netdev | None = None  # None: userspace-driver device, nothing is moved
    pod_index: int = 0
    pod_mac: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def userspace(self) -> bool:
        return self.netdev is None

    @property
    def marker(self) -> str:
        """The alias the device carries while attached: how DEL recognises it anywhere."""
        return f"pycni:{self.container_id}:{self.ifname}"

    @property
    def file(self) -> str:
        return f"{self.container_id}:{self.ifname}"

    def owner(self) -> dict[str, str]:
        return {"plugin": self.plugin, "network": self.network, "containerID": self.container_id,
                "ifname": self.ifname, "netns": self.netns, "netnsID": self.netns_id,
                "podUID": self.pod_uid, "podRef": self.pod_ref}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["version"] = VERSION
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Attachment:
        netdev = d.get("netdev")
        return replace(Attachment(**_known(Attachment, d)),
                       netdev=Netdev.from_dict(netdev) if netdev else None)


def _known(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def same_attachment(owner: dict[str, Any], att: Attachment) -> bool:
    return owner.get("containerID") == att.container_id and owner.get("ifname") == att.ifname


def netns_id(path: str) -> str:
    try:
        st = netns.stat(path)
    except OSError:
        return ""
    return f"{st.st_dev}:{st.st_ino}"


def owner_alive(owner: dict[str, Any]) -> bool:
    """The owner's namespace still exists (the same one, not a reused path)."""
    current = netns_id(str(owner.get("netns", "")))
    return bool(current) and current == owner.get("netnsID", current)


class Records:
    def __init__(self, top: str) -> None:
        self.dir = StateDir(top)

    def load(self, container_id: str, ifname: str) -> Attachment | None:
        name = f"{container_id}:{ifname}"
        raw = self.dir.read("attachments", name)
        if raw is None:
            return None
        try:
            return Attachment.from_dict(jsonio.loads(raw, f"attachment record {name}"))
        except (CniError, TypeError, ValueError, AttributeError) as e:
            log.error("attachment record %s is unreadable (%s); moved aside as %s.corrupt", name, e, name)
            self.dir.rename("attachments", name, f"{name}.corrupt")
            return None

    def save(self, att: Attachment) -> None:
        self.dir.write("attachments", att.file, jsonio.dumps(att.to_dict(), indent=True))

    def remove(self, att: Attachment) -> None:
        self.dir.remove("attachments", att.file)

    def all(self) -> list[Attachment]:
        out = []
        for name in self.dir.names("attachments"):
            cid, sep, ifname = name.partition(":")
            if sep and not name.endswith(".corrupt"):
                att = self.load(cid, ifname)
                if att is not None:
                    out.append(att)
        return out

    def owner(self, key: str) -> dict[str, Any] | None:
        raw = self.dir.read("owners", key)
        if raw is None:
            return None
        try:
            value = jsonio.loads(raw, f"owner record {key}")
        except CniError as e:
            log.error("owner record %s is unreadable (%s); treated as free", key, e)
            return None
        return value if isinstance(value, dict) else None

    def claim(self, att: Attachment) -> None:
        self.dir.write("owners", att.key, jsonio.dumps(att.owner(), indent=True))

    def unclaim(self, att: Attachment) -> None:
        """Drop the ownership record if it is this attachment's (never another's)."""
        owner = self.owner(att.key)
        if owner is None or same_attachment(owner, att):
            self.dir.remove("owners", att.key)

    def forget(self, att: Attachment) -> None:
        self.unclaim(att)
        self.remove(att)

    def lock(self, key: str, what: str) -> Any:
        return self.dir.lock(key, what)

    def usable(self) -> None:
        """Raise StateError unless every subdirectory can be created and opened."""
        for sub in ("attachments", "owners", "locks"):
            with self.dir.subdir(sub):
                pass
