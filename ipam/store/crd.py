"""The model <-> whereabouts CRD objects (plain dicts, no client library). The Kubernetes store sends
these objects as they are; the etcd store may store the same JSON. Every object is valid against the
upstream schemas in shared/upstream/whereabouts-crds (`IPPool`, `OverlappingRangeIPReservation`).

What the schema cannot hold goes into annotations (unknown spec fields would be pruned):
- pool: one annotation per allocation, `pycni.io/o-<offset>` = JSON `[stamp, pod_uid, network, node]`
  (trailing empty strings dropped; allocations with nothing to record have none). One annotation per
  entry, so writers of different entries never touch the same value: the Kubernetes store writes a
  pool with a JSON Patch of just the entries it changes (ipam.store.kube). `stamp` is `fingerprint()`
  of the allocation the entry was written for (container id, podref, ifname). Upstream whereabouts
  never touches annotations, so after it frees an offset and hands it to another pod (or takes an
  entry over for a re-ADD with a new container id) the entry still describes the old allocation: an
  entry is attached only to the allocation whose stamp it carries, and our next write of that offset
  replaces or removes it. Kubernetes caps all annotations of an object at 256 KiB, so entries are
  only added while the annotations stay within OWNERS_BUDGET bytes: allocations past the budget lose
  only their pycni extras (the reconciler then compares pod names, GC leaves them alone). With
  overlapping ranges on (the default; node slices too) the engine writes entries without extras at
  all (ipam.engine `Engine.lean_for`): every entry's reservation carries them, and a pool without them
  is cheaper for the API server to write; readers join them back (ipam.model.joined).
- the first format, `pycni.io/owners` (`{"<offset>": [pod_uid, network, node]}`, no stamp), cannot
  tell which allocation it was written for, so it is never attached (its allocations read as upstream
  ones) and our next write of the pool removes it. Older pycni nodes during a rolling upgrade do not
  read the new key, so they never misread it either.
- offsets are exact decimal integers of any size. Upstream whereabouts parses them as int64 and skips
  (logs) larger ones, so it cannot see our allocations past 2**63 in ranges wider than /65, which it
  cannot allocate itself either.
- reservation: `pycni.io/pod-uid`, `pycni.io/network`, `pycni.io/node`; `spec.containerid` (optional
  in the schema, never set by upstream) carries the container id."""

from __future__ import annotations

from collections.abc import Mapping

from cni import jsonio
from ipam.digest import sha256_hex
from ipam.model import Allocation, Pool, Reservation

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

GROUP = "whereabouts.cni.cncf.io"
API_VERSION = f"{GROUP}/v1alpha1"
OWNER_PREFIX = "pycni.io/o-"  # + offset: one allocation's extras
LEGACY_OWNERS = "pycni.io/owners"  # the first format: never attached, removed on our next write
RES_UID, RES_NETWORK, RES_NODE = "pycni.io/pod-uid", "pycni.io/network", "pycni.io/node"
OWNERS_BUDGET = 200 * 1024
# An IPPool is one etcd value, written whole by the API server: etcd refuses a request over its
# --max-request-bytes (1.5 MiB by default; the API server answers 500 "etcdserver: request is too large").
# pycni gives no new address from a pool past SIZE_LIMIT, which leaves room below etcd's default for one
# combined write of many nodes' entries (ipam.turn) and for the request's own bytes (docs/ipam.md "Pool
# size limit"; measured: tests/kubeapi/test_pool_size.py).
STORE_LIMIT = 1536 * 1024
SIZE_LIMIT = STORE_LIMIT - 128 * 1024
TURN_NOTE = "pycni.io/turn"  # a pool several nodes write: the name of its turn (ipam.turn)
WRITER_NOTE = "pycni.io/writer"  # the node that last wrote a pool directly (ipam.store.kube)


def fingerprint(a: Allocation) -> str:
    """Which allocation an owners entry was written for: its container id, podref and ifname."""
    text = f"{a.container_id}\n{a.podref}\n{a.ifname}".encode()
    return sha256_hex(text)[:16]


def owner_entry(a: Allocation) -> list[str] | None:
    """The owners entry of one allocation (None: nothing to record)."""
    extras = [a.pod_uid, a.network, a.node]
    while extras and not extras[-1]:
        extras.pop()
    return [fingerprint(a), *extras] if extras else None


def owner_key(offset: str) -> str:
    return OWNER_PREFIX + offset


def note_size(key: str, value: str) -> int:
    return len(key) + len(value)


def encode_owners(allocations: Mapping[str, Allocation], budget: int = OWNERS_BUDGET) -> dict[str, str]:
    """The owners annotations of these allocations (lowest offsets first, within `budget` bytes)."""
    out: dict[str, str] = {}
    size = 0
    for key in sorted(allocations, key=lambda k: (len(k), k)):
        entry = owner_entry(allocations[key])
        if entry is None:
            continue
        note, value = owner_key(key), jsonio.dumps(entry).decode()
        if size + note_size(note, value) > budget:
            break
        out[note] = value
        size += note_size(note, value)
    return out


def decode_owners(annotations: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """offset -> [stamp, pod_uid, network, node]. Tolerant: an annotation someone mangled costs the
    extras, never the allocations."""
    out: dict[str, list[str]] = {}
    for note, text in (annotations or {}).items():
        if not note.startswith(OWNER_PREFIX) or not isinstance(text, str):
            continue
        try:
            raw = jsonio.loads(text, note)
        except Exception:
            continue
        if isinstance(raw, list) and raw:
            out[note[len(OWNER_PREFIX):]] = [*(str(x) for x in raw[:4]), "", "", ""][:4]
    return out


def attach(a: Allocation, entry: list[str] | None) -> Allocation:
    """`a` with the extras of `entry` if the entry was written for it; else `a` as upstream sees it."""
    if entry is None or entry[0] != fingerprint(a):
        return a
    return a._replace(pod_uid=entry[1], network=entry[2], node=entry[3])


def entry_bytes(a: Allocation, key: int = 8) -> int:
    """At most how many bytes allocation `a` adds to a pool object as stored (compact JSON), with an offset
    of `key` digits: its member of spec.allocations and, when it has extras, its owners annotation (pools
    hold one only within OWNERS_BUDGET). Counted, not encoded: names and ids are ASCII."""
    # "k":{"id":"","podref":"","ifname":""},
    n = 37 + key + len(a.container_id) + len(a.podref) + len(a.ifname)
    if a.has_extras():  # "pycni.io/o-k":"[\"stamp\",\"uid\",\"network\",\"node\"]",
        n += 38 + key + 16 + len(a.pod_uid) + len(a.network) + len(a.node)
    return n


def pool_to_object(pool: Pool, namespace: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": pool.name, "namespace": namespace}
    if pool.version is not None:
        meta["resourceVersion"] = pool.version
    owners = encode_owners(pool.allocations)
    if owners:
        meta["annotations"] = owners
    allocations = {
        k: {"id": a.container_id, "podref": a.podref, "ifname": a.ifname} for k, a in pool.allocations.items()
    }
    spec = {"range": pool.range, "allocations": allocations}
    return {"apiVersion": API_VERSION, "kind": "IPPool", "metadata": meta, "spec": spec}


def pool_from_object(obj: dict[str, Any], version: str | None = None) -> Pool:
    """`version` overrides metadata.resourceVersion (the etcd store uses mod_revision)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    owners = decode_owners(meta.get("annotations"))
    allocations = {}
    for key, entry in (spec.get("allocations") or {}).items():
        plain = Allocation(*(str(entry.get(k, "")) for k in ("id", "podref", "ifname")))
        allocations[str(key)] = attach(plain, owners.get(str(key)))
    version = version if version is not None else meta.get("resourceVersion")
    shared = TURN_NOTE in (meta.get("annotations") or {})
    return Pool(str(meta.get("name", "")), str(spec.get("range", "")), allocations, version, shared)


def reservation_to_object(res: Reservation, namespace: str) -> dict[str, Any]:
    o = res.owner
    meta: dict[str, Any] = {"name": res.name, "namespace": namespace}
    if res.version is not None:
        meta["resourceVersion"] = res.version
    notes = {k: v for k, v in ((RES_UID, o.pod_uid), (RES_NETWORK, o.network), (RES_NODE, o.node)) if v}
    if notes:
        meta["annotations"] = notes
    spec = {"containerid": o.container_id, "podref": o.podref, "ifname": o.ifname}
    kind = "OverlappingRangeIPReservation"
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": meta, "spec": spec}


def reservation_from_object(obj: dict[str, Any], version: str | None = None) -> Reservation:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    notes = meta.get("annotations") or {}
    owner = Allocation(*(str(spec.get(k, "")) for k in ("containerid", "podref", "ifname")),
                       *(str(notes.get(k, "")) for k in (RES_UID, RES_NETWORK, RES_NODE)))  # fmt: skip
    version = version if version is not None else meta.get("resourceVersion")
    return Reservation(str(meta.get("name", "")), owner, version)
