"""Object names, exactly as upstream whereabouts builds them (pkg/storage/kubernetes/ipam.go), so a
cluster switching from whereabouts finds its pools and reservations under the same names.

- pool: the canonical CIDR text (`spec.range`); a trailing ':' gets a '0'; ':' and '/' become '-';
  prefixed with `<network_name>-` when the network is named. `2001:db8::/64` -> `2001-db8---64`.
- reservation: the IP's canonical text; a trailing ':' gets a '0'; ':' becomes '-'; the same prefix.
  `2001:db8::` -> `2001-db8--0`; IPv4 stays dotted.

Like upstream there is no hashing or truncation; names from '::'-leading addresses start with '-'."""

from __future__ import annotations

import ipaddress


def _prefixed(text: str, network_name: str) -> str:
    return f"{network_name}-{text}" if network_name else text


def pool_name(range_cidr: str, network_name: str = "") -> str:
    """`range_cidr` must be canonical (ipaddress' str of the network, as spec.range holds it)."""
    text = range_cidr + "0" if range_cidr.endswith(":") else range_cidr
    return _prefixed(text.replace(":", "-").replace("/", "-"), network_name)


def reservation_name(ip: str, network_name: str = "") -> str:
    """`ip` must be canonical (ipaddress' str of the address)."""
    text = ip + "0" if ip.endswith(":") else ip
    return _prefixed(text.replace(":", "-"), network_name)


def reservation_address(name: str, network_name: str, version: int) -> str | None:
    """The canonical IP (of IP `version`) that reservation `name` names under `network_name`, or None
    when it names none: the inverse of reservation_name, checked by building the name again."""
    prefix = f"{network_name}-" if network_name else ""
    if not name.startswith(prefix):
        return None
    text = name[len(prefix) :]
    try:
        ip = ipaddress.ip_address(text.replace("-", ":") if version == 6 else text)
    except ValueError:
        return None
    if ip.version != version or reservation_name(str(ip), network_name) != name:
        return None
    return str(ip)


def network_name_of(name: str, range_cidr: str) -> str | None:
    """The network_name a pool called `name` with spec.range `range_cidr` was named under ("" for
    none), or None when the name does not fit the range."""
    try:
        canonical = str(ipaddress.ip_network(range_cidr, strict=False))
    except ValueError:
        return None
    plain = pool_name(canonical)
    if name == plain:
        return ""
    if name.endswith("-" + plain) and len(name) > len(plain) + 1:
        return name[: -len(plain) - 1]
    return None
