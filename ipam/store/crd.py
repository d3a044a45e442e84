"""The model <-> whereabouts CRD objects (plain dicts, no client library). The Kubernetes store sends
these objects as they are; the etcd store may store the same JSON. Every object is valid against the
upstream schemas in shared/upstream/whereabouts-crds (`IPPool`, `OverlappingRangeIPReservation`).

What the schema cannot hold goes into annotations (unknown spec fields would be pruned):
- pool: `pycni.io/owners` = JSON `{"<offset>": [pod_uid, network, node], ...}` (trailing empty strings
  dropped; offsets with nothing to record left out). Kubernetes caps all annotations of an object at
  256 KiB, so the encoder stops adding entries at OWNERS_BUDGET bytes: allocations past the budget
  lose only their pycni extras (the reconciler then compares pod names, GC leaves them alone).
- offsets are exact decimal integers of any size. Upstream whereabouts parses them as int64 and skips
  (logs) larger ones, so it cannot see our allocations past 2**63 in ranges wider than /65, which it
  cannot allocate itself either.
- reservation: `pycni.io/pod-uid`, `pycni.io/network`, `pycni.io/node`; `spec.containerid` (optional
  in the schema, never set by upstream) carries the container id."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cni import jsonio
from ipam.store.base import Allocation, Pool, Reservation

GROUP = "whereabouts.cni.cncf.io"
API_VERSION = f"{GROUP}/v1alpha1"
OWNERS = "pycni.io/owners"
RES_UID, RES_NETWORK, RES_NODE = "pycni.io/pod-uid", "pycni.io/network", "pycni.io/node"
OWNERS_BUDGET = 200 * 1024


def _extras(a: Allocation) -> list[str]:
    extras = [a.pod_uid, a.network, a.node]
    while extras and not extras[-1]:
        extras.pop()
    return extras


def encode_owners(allocations: Mapping[str, Allocation]) -> str | None:
    """The pool annotation value, or None when there is nothing to record."""
    out: dict[str, list[str]] = {}
    size = 2
    for key in sorted(allocations, key=lambda k: (len(k), k)):
        extras = _extras(allocations[key])
        if not extras:
            continue
        cost = len(key) + sum(len(x) + 3 for x in extras) + 6
        if size + cost > OWNERS_BUDGET:
            break
        out[key] = extras
        size += cost
    return jsonio.dumps(out).decode() if out else None


def decode_owners(text: str | None) -> dict[str, list[str]]:
    """Tolerant: an annotation someone mangled costs the extras, never the allocations."""
    if not text:
        return {}
    try:
        raw = jsonio.loads(text, OWNERS)
    except Exception:
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: [str(x) for x in v[:3]] for k, v in raw.items() if isinstance(v, list)}


def pool_to_object(pool: Pool, namespace: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": pool.name, "namespace": namespace}
    if pool.version is not None:
        meta["resourceVersion"] = pool.version
    owners = encode_owners(pool.allocations)
    if owners:
        meta["annotations"] = {OWNERS: owners}
    allocations = {
        k: {"id": a.container_id, "podref": a.podref, "ifname": a.ifname} for k, a in pool.allocations.items()
    }
    spec = {"range": pool.range, "allocations": allocations}
    return {"apiVersion": API_VERSION, "kind": "IPPool", "metadata": meta, "spec": spec}


def pool_from_object(obj: dict[str, Any], version: str | None = None) -> Pool:
    """`version` overrides metadata.resourceVersion (the etcd store uses mod_revision)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    owners = decode_owners((meta.get("annotations") or {}).get(OWNERS))
    allocations = {}
    for key, entry in (spec.get("allocations") or {}).items():
        extras = [*owners.get(key, []), "", "", ""][:3]
        allocations[str(key)] = Allocation(
            str(entry.get("id", "")), str(entry.get("podref", "")), str(entry.get("ifname", "")), *extras
        )
    return Pool(
        str(meta.get("name", "")),
        str(spec.get("range", "")),
        allocations,
        version if version is not None else meta.get("resourceVersion"),
    )


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
    owner = Allocation(
        str(spec.get("containerid", "")),
        str(spec.get("podref", "")),
        str(spec.get("ifname", "")),
        str(notes.get(RES_UID, "")),
        str(notes.get(RES_NETWORK, "")),
        str(notes.get(RES_NODE, "")),
    )
    return Reservation(
        str(meta.get("name", "")), owner, version if version is not None else meta.get("resourceVersion")
    )
