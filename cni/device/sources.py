"""The device a device plugin (or a DRA driver) allocated, from every channel that carries it into a
plugin config, in one order: `runtimeConfig.deviceID` (capability `deviceID`), the top-level `deviceID`
and `pciBusID` (Multus writes both in every plugin of a list; dra-driver-sriov's standalone mode writes
`deviceID`), then the device-info file named by `runtimeConfig.CNIDeviceInfoFile` (capability
`CNIDeviceInfoFile`; k8snetworkplumbingwg device-info spec 1.1.0: Multus copies the device plugin's file
there before the call).

Sources that name a device must agree (PCI addresses compared normalised, other ids as written); a
disagreement is code 7 naming both sources and both values. The device-info file is read only when the
capability names it: absent (no device plugin file for this attachment, or not visible to this process)
it names nothing; of a type without a PCI address (vhost-user, memif) it names nothing; unreadable or
malformed it is a code 7 error when it is the only source, else a warning and the others decide. When
it is the only source given and names nothing, the plugin's error (`required`) names the file looked
for and what was found there, not a field the user never set. Its
PCI address is compared only with a PCI address: an auxiliary device id (host-device) is not a PCI
address the file could repeat."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from cni import log
from cni.errors import CniError, ConfigError
from cni.sriov.sysfs import normalize_pci
from cni.types import fields as f
from cni.types.netconf import Request

INFO_FIELD = "runtimeConfig.CNIDeviceInfoFile"
PATH_MAX = 4096
MAX_INFO_BYTES = 64 * 1024  # a device-info object is a few hundred bytes
PCI_INFO_TYPES = ("pci", "vdpa")  # the spec's types that carry a "pci-address" (vdpa: optionally)


@dataclass(frozen=True)
class Named:
    """One source naming a device: `field` as messages show it, `value` as given."""

    field: str
    value: str

    def key(self) -> str:
        return normalize_pci(self.value) or self.value

    def describe(self) -> str:
        return f"{self.field} {f.show(self.value)}"


def device_id(req: Request) -> Named | None:
    """The device the sources agree on (the first source that names it), None when none does."""
    return _resolved(req)[0]


def required(req: Request, none_given: str, others: str) -> Named:
    """The device the sources agree on; code 7 when none names it: `none_given` (the plugin's own
    message) when none was given at all; when the device-info file was the only one, the file looked
    for, what was found there (nothing, a type without a PCI device) and the plugin's `others`."""
    named, looked = _resolved(req)
    if named is not None:
        return named
    if looked:
        raise ConfigError(f"{looked}, and no other field names the device ({others})")
    raise ConfigError(none_given)


def _resolved(req: Request) -> tuple[Named | None, str]:
    """(the device the sources agree on or None, why a device-info file that was given named none)."""
    given = _id_fields(req)
    for other in given[1:]:
        _agree(given[0], other)
    info, problem, looked = _info_file(req)
    if problem:
        if not given:
            raise ConfigError(problem)
        log.warning("%s; the device comes from %s", problem, given[0].describe())
    first = given[0] if given else info
    if given and info is not None:
        if normalize_pci(given[0].value) is not None:
            _agree(given[0], info)
        else:
            log.debug("%s is not a PCI address: %s not compared", given[0].describe(), info.describe())
    return first, looked


def _agree(first: Named, other: Named) -> None:
    if first.key() != other.key():
        raise ConfigError(f"{other.field}: {f.show(other.value)} disagrees with {first.describe()}: "
                          "every source of the device must name the same one")


def _id_fields(req: Request) -> list[Named]:
    rc = req.runtime_config()
    out = []
    for source, key, path in ((rc, "deviceID", "runtimeConfig"), (req.conf, "deviceID", ""),
                              (req.conf, "pciBusID", "")):
        value = f.opt(source, key, str, path, "")
        if value:
            out.append(Named(f.join(path, key), str(value)))
    return out


def _info_file(req: Request) -> tuple[Named | None, str, str]:
    """(what the file names, None if nothing; the problem that made it unusable, or ""; why a usable
    or absent file names nothing, or "")."""
    path = f.opt(req.runtime_config(), "CNIDeviceInfoFile", str, "runtimeConfig", "")
    if not path:
        return None, "", ""
    # the whole path (Multus' are over 100 characters, unique at the end), unless it is no path at all
    where = f'{INFO_FIELD}: "{path}"' if len(path) <= PATH_MAX else f"{INFO_FIELD}: {f.show(path)}"
    if not os.path.isabs(path):
        return None, f"{where} is not an absolute path", ""
    if "\0" in path:
        return None, f"{where} holds a NUL byte", ""
    try:
        data = _read_regular(path)
    except FileNotFoundError:
        log.debug("%s: no such file; it names no device", where)
        return None, "", f"{where}: no such file"
    except OSError as e:
        return None, f"{where}: cannot read it: {e.strerror or e}", ""
    if data is None:
        return None, f"{where}: not a regular file", ""
    if len(data) > MAX_INFO_BYTES:
        return None, f"{where}: larger than {MAX_INFO_BYTES} bytes, not a device-info file", ""
    try:
        pci, kind = _pci_address(data)
    except CniError as e:
        return None, f"{where}: {e.msg}", ""
    if pci is None:
        log.debug("%s names no PCI device", where)
        return None, "", f'{where}: its type "{kind}" names no PCI device'
    return Named(INFO_FIELD, pci), "", ""


def _read_regular(path: str) -> bytes | None:
    """Up to MAX_INFO_BYTES + 1 bytes of a regular file; None for anything else (a FIFO, a device:
    opened without blocking, never read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks = []
        left = MAX_INFO_BYTES + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _pci_address(data: bytes) -> tuple[str | None, str]:
    """(the device's PCI address in a device-info object (spec 1.1.0 section 3), None for a type
    without one; the type). ConfigError (its message is what is wrong) for anything else."""
    from cni import jsonio

    try:
        info = jsonio.loads(data, "device-info")
    except CniError:
        raise ConfigError("not a JSON device-info object") from None
    if not isinstance(info, dict):
        raise ConfigError("not a JSON device-info object")
    kind = info.get("type")
    if not isinstance(kind, str) or not kind:
        raise ConfigError('no "type" (a device-info object names its type)')
    if kind not in PCI_INFO_TYPES:
        return None, kind
    section = info.get(kind)
    if not isinstance(section, dict):
        raise ConfigError(f'type "{kind}" without a "{kind}" object')
    address = section.get("pci-address")
    if address is None and kind == "vdpa":  # optional for vdpa
        return None, kind
    if not isinstance(address, str) or normalize_pci(address) is None:
        raise ConfigError(f'{kind}.pci-address: {f.show(address)} is not a PCI address')
    return address, kind
