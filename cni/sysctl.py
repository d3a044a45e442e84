"""Per-namespace sysctls under /proc/sys/net. /proc/sys/net shows the namespace of the thread that
opens the file, so call these while entered in the target namespace."""

from __future__ import annotations

import os

from cni import log


def write(key: str, value: str, *, quiet: bool = True) -> bool:
    """Write net.* sysctl `key` ('ipv4/conf/net1/arp_notify'); False (logged) when it fails."""
    path = f"/proc/sys/net/{key}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
    except OSError as e:
        if not quiet:
            raise
        log.debug("sysctl %s=%s: %s", key, value, e.strerror)
        return False
    return True


def read(key: str) -> str | None:
    try:
        with open(f"/proc/sys/net/{key}") as fh:
            return fh.read().strip()
    except OSError:
        return None
