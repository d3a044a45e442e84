"""Hypothesis strategies for hostile CNI input: a valid configuration with one or more fields
mutated, removed or added; raw stdin that is not a configuration at all; hostile CNI_* variables."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

# Keys whose value is a host path: only wrong types or relative paths are generated for them (never a
# real absolute path, the fuzz must not write anywhere outside its lab), and they are never removed or
# set to null or "" (that selects the default: the node's real state directories).
PATH_KEYS = {"stateDir", "local_db", "logFile", "log_file", "configuration_path", "kubeconfig", "state"}


def not_a_default_or_real_path(value: Any) -> bool:
    """null and "" select the default path (the node's real state: `local_db` is `"" or default`), an
    absolute string a real one: neither may be generated for a path key."""
    return value is not None and value != "" and not (isinstance(value, str) and os.path.isabs(value))


# Store selectors for stores this suite does not fuzz (their helpers do): never added.
STORE_KEYS = {"kubernetes", "etcd_host", "etcd_username", "etcd_password", "etcd_key_file",
              "etcd_cert_file", "etcd_ca_cert_file", "datastore"}

KNOWN_KEYS = {
    "macvlan": ["master", "mode", "mtu", "mac", "linkInContainer", "bcqueuelen", "dad", "dns", "ipam",
                "runtimeConfig", "args", "prevResult", "cniVersion", "name", "type", "logLevel"],
    "host-device": ["device", "hwaddr", "kernelpath", "pciBusID", "deviceID", "runtimeConfig", "dad", "mtu",
                    "dns", "ipam", "args", "prevResult", "cniVersion", "name", "logLevel"],
    "sriov": ["deviceID", "pciBusID", "vlan", "vlanQoS", "vlanProto", "mac", "spoofchk", "trust",
              "link_state", "min_tx_rate", "max_tx_rate", "mtu", "runtimeConfig", "dns", "ipam", "args",
              "prevResult", "cniVersion", "logLevel"],
    "whereabouts": ["cniVersion", "name", "ipam", "runtimeConfig", "args", "prevResult", "dns"],
    "ipam": ["range", "range_start", "range_end", "exclude", "ipRanges", "gateway", "routes", "dns",
             "addresses", "enable_overlapping_ranges", "network_name", "log_level", "node_slice_size",
             "leader_lease_duration", "sleep_for_race", "reconciler_cron_expression", "type"],
}

HOSTILE_STRINGS = [
    # CIDRs and ranges
    "198.51.100.0/33", "300.1.1.1/24", "2001:db8::/129", "198.51.100.10-198.51.100.5/24",
    "198.51.100.5-2001:db8::1/24", "0.0.0.0/0", "::/0", "198.51.100.7/32", "198.51.100.6/31",
    "2001:db8::/128", "2001:db8::/1", "198.51.100.0/24 ", " 198.51.100.0/24", "198.51.100.0/-1",
    "198.51.100.0/0x18", "198.51.100.256", "198.51.100.1-", "-/24", "198.18.0.0/15",
    "2001:db8::-2001:db8::ffff/64", "::ffff:198.51.100.1/120", "198.51.100.1%eth0/24", "1e400",
    # interface names
    "", " ", ".", "..", "a" * 15, "a" * 16, "a/b", "a:b", "eth0", "lo", "net1", "x\ty", "ü" * 8,
    "\udcff\udcfe", "\x00", "-", "*",
    # MACs, PCI addresses, paths
    "02:00:00:00:aa:01", "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "00:00:00:00:00:00",
    "02-00-00-00-aa-01", "02:00:00:00:aa", "zz:00:00:00:00:00",
    "0000:af:06.0", "0000:af:06.4", "0000:af:06.9", "0000:af:00.1", "0000:3b:00.0", "af:06.0",
    "0000:af:06", "../../../etc", "/sys/devices/../../etc/passwd", "mlx5_core.sf.4", "mlx5_core.sf.99",
    # versions, modes, enums
    "1.0.0", "0.1.0", "0.2.0", "1.1.0", "9.9.9", "1.0", "bridge", "passthru", "802.1ad", "on", "off",
    "optimistic", "auto", "enable", "disable", "debug", "nonsense",
]
ABSURD_INTS = [0, -1, 1, 67, 68, 4094, 4095, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63,
               2**64, -(2**63), 10**30]

leaves = st.one_of(
    st.none(), st.booleans(), st.sampled_from(ABSURD_INTS), st.integers(), st.floats(allow_nan=False),
    st.sampled_from(HOSTILE_STRINGS), st.text(max_size=40),
)
json_values = st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(st.text(max_size=10), kids,
                                                                          max_size=4)), max_leaves=12)


def deep(n: int) -> Any:
    out: Any = 0
    for i in range(n):
        out = [out] if i % 2 else {"a": out}
    return out


hostile_values = st.one_of(
    json_values,
    st.integers(1, 1200).map(deep),  # orjson refuses beyond 1024 levels
    st.integers(1, 300_000).map(lambda n: "x" * n),
    st.integers(1, 3000).map(lambda n: list(range(n))),
)


@dataclass(frozen=True)
class Mutation:
    op: str  # "set", "del", "add"
    path: tuple[str | int, ...]
    value: Any = None

    @property
    def field(self) -> str:
        """The name an error message must contain: the last string key on the path."""
        return next((p for p in reversed(self.path) if isinstance(p, str)), "")

    def __repr__(self) -> str:
        shown = repr(self.value)
        return f"{self.op} {'.'.join(map(str, self.path))} = {shown[:120]}"


def paths(obj: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    out: list[tuple[str | int, ...]] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out += paths(v, (*prefix, k))
    return out


def _parent(conf: Any, path: tuple[str | int, ...]) -> Any:
    cur = conf
    for p in path[:-1]:
        cur = cur[p]
    return cur


@st.composite
def mutation(draw: st.DrawFn, conf: dict[str, Any], plugin: str) -> Mutation:
    choices = [p for p in paths(conf) if p[-1] not in ("type",) or len(p) > 1]
    op = draw(st.sampled_from(["set", "set", "set", "del", "add"]))
    if op == "add":
        where = draw(st.sampled_from(["top", "ipam"])) if plugin != "whereabouts" else "ipam"
        keys = KNOWN_KEYS["ipam" if where == "ipam" else plugin]
        key = draw(st.sampled_from([k for k in keys if k not in STORE_KEYS]))
        path: tuple[str | int, ...] = ("ipam", key) if where == "ipam" else (key,)
        return Mutation("set", path, draw(hostile_values))
    path = draw(st.sampled_from(choices))
    last = path[-1]
    if isinstance(last, str) and last in PATH_KEYS:
        value = draw(st.one_of(json_values.filter(not_a_default_or_real_path), st.just("relative/dir")))
        return Mutation("set", path, value)
    if op == "del":
        return Mutation("del", path)
    return Mutation("set", path, draw(hostile_values))


def apply(conf: dict[str, Any], muts: list[Mutation]) -> dict[str, Any]:
    out = copy.deepcopy(conf)
    for m in muts:
        try:
            parent = _parent(out, m.path)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced a container on this path
        if not isinstance(parent, dict | list):
            continue
        key = m.path[-1]
        has = (isinstance(parent, dict) and key in parent) or (
            isinstance(parent, list) and isinstance(key, int) and key < len(parent))
        if m.op == "del" and has:
            del parent[key]  # type: ignore[arg-type]
        elif m.op == "set" and (has or (isinstance(parent, dict) and isinstance(key, str))):
            parent[key] = m.value  # type: ignore[index]
    return out


# ---- raw stdin ----------------------------------------------------------------------------------------


def raw_stdin(valid: bytes) -> st.SearchStrategy[bytes]:
    """Bytes that are not a valid configuration: garbage, truncated, invalid UTF-8 inside a valid
    document, deep nesting, non-object JSON, duplicated keys."""
    return st.one_of(
        st.binary(max_size=200),
        st.integers(0, max(len(valid) - 1, 0)).map(lambda n: valid[:n]),
        st.tuples(st.integers(1, max(len(valid) - 2, 1)), st.binary(min_size=1, max_size=4))
        .map(lambda t: valid[: t[0]] + t[1] + valid[t[0]:]),
        st.sampled_from([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])
        .map(lambda bad: valid.replace(b'"name":"', b'"name":"' + bad)),
        st.integers(100, 200_000).map(lambda n: b"[" * n + b"]" * n),
        st.integers(100, 200_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
        st.sampled_from([b"null", b"[]", b"1", b'"x"', b"true", b"{}", b" ", b"\n", b"{" + b" " * 10]),
        st.just(valid[:-1] + b', "name": 1}'),
        st.integers(1, 4).map(lambda mb: valid[:-1] + b', "pad": "' + b"x" * (mb << 20) + b'"}'),
    )


# ---- environment --------------------------------------------------------------------------------------

env_text = st.one_of(
    st.sampled_from(HOSTILE_STRINGS),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
    st.binary(min_size=1, max_size=20).filter(lambda b: b"\x00" not in b).map(os.fsdecode),
    st.integers(1, 5000).map(lambda n: "c" * n),
)
ENV_KEYS = ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"]
CNI_ARGS = st.one_of(
    env_text,
    st.lists(st.tuples(st.sampled_from(["K8S_POD_NAME", "K8S_POD_NAMESPACE", "K8S_POD_UID", "IP", "MAC",
                                        "IgnoreUnknown", "K8S_POD_INFRA_CONTAINER_ID", "X"]), env_text),
             max_size=5).map(lambda kv: ";".join(f"{k}={v}" for k, v in kv)),
)
