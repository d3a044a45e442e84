"""Supported CNI spec versions and which command needs which version."""

from __future__ import annotations

from cni.errors import VersionError

SUPPORTED: tuple[str, ...] = ("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"
DEFAULT = "0.1.0"  # a config without cniVersion

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
MIN_VERSION = {"CHECK": "0.4.0", "GC": "1.1.0", "STATUS": "1.1.0"}


def parse(version: str) -> tuple[int, int, int]:
    """'1.0.0' -> (1, 0, 0); raises ValueError for anything that is not MAJOR.MINOR.PATCH."""
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid version {version!r}")
    return int(parts[0]), int(parts[1]), int(parts[2])


def at_least(version: str, minimum: str) -> bool:
    return parse(version) >= parse(minimum)


def family(version: str) -> str:
    """Result wire shape: '0.2' (ip4/ip6), '0.4' (ips with version) or '1' (ips without)."""
    v = parse(version)
    if v < (0, 3, 0):
        return "0.2"
    if v < (1, 0, 0):
        return "0.4"
    return "1"


def gate(command: str, version: str) -> None:
    """Raise code 1 unless `version` is supported and allows `command`."""
    if version not in SUPPORTED:
        raise VersionError(
            "incompatible CNI versions",
            f'config is "{version}", plugin supports {", ".join(SUPPORTED)}',
        )
    minimum = MIN_VERSION.get(command)
    if minimum and not at_least(version, minimum):
        raise VersionError(
            f"config version does not allow {command}",
            f'config is "{version}", {command} needs {minimum} or newer',
        )
