"""What an attachment looks like inside its namespace, as plain data two plugins can be compared on:
link kind, macvlan mode, MTU, flags, MAC, addresses, routes and sysctls.

Normalisations (each one is something that must differ between two runs, never a behaviour):
- the MAC the kernel picks at random is replaced by "<mac>" after checking the result reports it;
- the IPv6 link-local address is replaced by "<eui64 of mac>" when it is the EUI-64 address of the
  link's MAC (the kernel derives it from the MAC the link had when it first went up, addr_gen_mode
  eui64), else by "<eui64 of an earlier mac>" (tuning changed the MAC afterwards);
- an IPv6 address's `tentative` flag is dropped: it is DAD's progress at the moment we look, which
  depends on timing (both plugins wait for DAD only when an IPv6 gateway is configured);
- `sandbox` in results is "<netns>" after checking it is the CNI_NETNS of that run (each side gets its
  own pod namespace, so the paths differ);
- the ifindex is not recorded at all (the kernel numbers links per namespace in creation order);
- routes in table `local` are left out: the kernel makes them for the link's own addresses (compared
  already), and one of them carries the link-local address."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable
from typing import Any

from cni import jsonio
from tests.nsutil import sh

ADDR_KEYS = ("family", "local", "prefixlen", "scope", "broadcast", "nodad", "optimistic", "dadfailed",
             "noprefixroute", "mngtmpaddr", "deprecated")
ROUTE_KEYS = ("dst", "gateway", "dev", "protocol", "scope", "prefsrc", "metric", "flags", "pref",
              "table", "type")


def _ip_json(ns: str, *args: str) -> list[dict[str, Any]]:
    out = sh("ip", "-j", "-d", "-n", os.path.basename(ns), *args, check=False).stdout
    return list(jsonio.loads(out)) if out.strip() else []


def eui64_link_local(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02
    iid = bytes([*b[:3], 0xFF, 0xFE, *b[3:]])
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + iid))


def sysctls(ns: str, keys: Iterable[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for key in keys:
        proc = sh("ip", "netns", "exec", os.path.basename(ns), "cat", f"/proc/sys/{key.replace('.', '/')}",
                  check=False)
        out[key] = proc.stdout.strip() if proc.returncode == 0 else None
    return out


def _addresses(ns: str, ifname: str, mac: str) -> list[dict[str, Any]]:
    found = []
    for dev in _ip_json(ns, "addr", "show", "dev", ifname):
        for a in dev.get("addr_info", []):
            entry = {k: a[k] for k in ADDR_KEYS if k in a}
            if a.get("scope") == "link" and a.get("family") == "inet6":
                derived = a["local"] == eui64_link_local(mac)
                entry["local"] = "<eui64 of mac>" if derived else "<eui64 of an earlier mac>"
            found.append(entry)
    return sorted(found, key=lambda e: (e["family"], str(e["local"])))


def _routes(ns: str, ifname: str) -> list[dict[str, Any]]:
    found = []
    for family in ("-4", "-6"):
        for r in _ip_json(ns, family, "route", "show", "table", "all", "dev", ifname):
            if r.get("table") != "local":  # the kernel's routes for the link's own addresses
                found.append({k: r[k] for k in ROUTE_KEYS if k in r})
    return sorted(found, key=lambda e: (str(e.get("table", "")), str(e["dst"]), str(e.get("gateway", ""))))


def link_state(ns: str, ifname: str, *, random_mac: bool, sysctl_keys: Iterable[str] = ()) -> dict[str, Any]:
    """The attachment `ifname` in namespace `ns` as comparable data; {} when the link does not exist."""
    links = _ip_json(ns, "link", "show", "dev", ifname)
    if not links:
        return {}
    link = links[0]
    info = link.get("linkinfo", {})
    data = info.get("info_data", {})
    mac = link["address"]
    return {
        "kind": info.get("info_kind"),
        "mode": data.get("mode"),
        "bcqueuelen": data.get("bcqueuelen"),
        "mtu": link["mtu"],
        "flags": sorted(link["flags"]),
        "operstate": link["operstate"],
        "qdisc": link.get("qdisc"),
        "txqlen": link.get("txqlen", 0),
        "promiscuity": link.get("promiscuity"),
        "allmulti": link.get("allmulti"),
        "mac": "<mac>" if random_mac else mac,
        "real_mac": mac,  # popped by the comparison; kept for the result check
        "master": link.get("link_index"),
        "link_netnsid": link.get("link_netnsid"),
        "addr_gen_mode": link.get("inet6_addr_gen_mode"),
        "addresses": _addresses(ns, ifname, mac),
        "routes": _routes(ns, ifname),
        "sysctl": sysctls(ns, sysctl_keys),
    }


def normalise_result(result: Any, netns: str, real_mac: str, random_mac: bool) -> Any:
    """The ADD result with the per-run values replaced (see the module docstring)."""
    if not isinstance(result, dict):
        return result
    out = jsonio.loads(jsonio.dumps(result))
    for iface in out.get("interfaces", []):
        assert iface.get("sandbox") == netns, f"result sandbox {iface.get('sandbox')} is not {netns}"
        iface["sandbox"] = "<netns>"
        mac = iface.get("mac", "")
        assert mac.lower() == real_mac.lower(), f"result MAC {mac} is not the link's {real_mac}"
        if random_mac:
            iface["mac"] = "<mac>"
    return out


def differences(ref: Any, ours: Any, path: str = "") -> list[str]:
    """Field by field: every place where the two differ, as 'path: reference=.. pycni=..'."""
    if isinstance(ref, dict) and isinstance(ours, dict):
        out = []
        for key in sorted(set(ref) | set(ours)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in ref or key not in ours:
                a, b = ref.get(key, "<absent>"), ours.get(key, "<absent>")
                out.append(f"{sub}: reference={a!r} pycni={b!r}")
            else:
                out.extend(differences(ref[key], ours[key], sub))
        return out
    if isinstance(ref, list) and isinstance(ours, list) and len(ref) == len(ours):
        pairs = enumerate(zip(ref, ours, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{path}[{i}]")]
    return [] if ref == ours else [f"{path}: reference={ref!r} pycni={ours!r}"]
