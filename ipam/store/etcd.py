"""The etcd store: the whereabouts CRD objects (ipam.store.crd) as JSON values in etcd v3, spoken through
etcd's JSON gateway (ipam.store.etcdgw).

Keys: `<prefix>ippools/<pool name>` and `<prefix>overlappingrangeipreservations/<reservation name>`
(names from ipam.store.names; PREFIX by default). A value is the object the Kubernetes store would
send, without namespace and resourceVersion. `version` is the key's mod_revision.

Every write is one txn comparing the key: create = `create_revision == 0`, replace and delete =
`mod_revision == version`; a failed compare is Conflict and changes nothing. A pool is one object, so
a commit rewrites it whole: the handle keeps the object it last read and, when the version still
matches, applies the update to it without reading again. The pool's `pycni.io/o-<offset>` annotations
here hold every allocation's extras (etcd has no 256 KiB annotation cap; its request cap,
--max-request-bytes, 1.5 MiB by default, bounds a pool to ~8,000 allocations; raise it for more).

Everything the server or the network does wrong is StoreUnavailable (code 11) with etcd's message."""

from __future__ import annotations

import os
from collections.abc import Iterator

from cni import jsonio
from ipam.config import StoreConfig
from ipam.model import Pool, PoolUpdate, Reservation
from ipam.store import crd
from ipam.store.base import Conflict, Store, StoreUnavailable
from ipam.store.etcdgw import (
    Gateway,
    Rejected,
    TokenCache,
    b64,
    parse_endpoints,
    prefix_end,
    tls_context,
    unb64,
)

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

PREFIX = "/pycni/whereabouts/"
POOLS, RESERVATIONS = "ippools/", "overlappingrangeipreservations/"
POOL_PAGE = 16  # pools can be megabytes each: iterate a few at a time
RESERVATION_PAGE = 500
CREATE = {"target": "CREATE", "create_revision": "0", "result": "EQUAL"}  # the key must not exist


def open_store(conf: StoreConfig) -> EtcdStore:
    e = conf.etcd
    tls = bool(e.ca_cert_file or e.cert_file or e.key_file)
    endpoints = parse_endpoints(e.host, tls)
    context = tls_context(e.ca_cert_file, e.cert_file, e.key_file) if tls else None
    cache = None
    if e.username:
        identity = [*map(str, endpoints), e.username, e.password]
        cache = TokenCache(os.path.dirname(conf.local_db), identity)
    return EtcdStore(Gateway(endpoints, context, e.username, e.password, cache))


class _Read:
    """A key as last read: its mod_revision and the decoded object."""

    __slots__ = ("key", "obj", "revision")

    def __init__(self, key: bytes, revision: str, obj: dict[str, Any]) -> None:
        self.key, self.revision, self.obj = key, revision, obj


class EtcdStore(Store):
    def __init__(self, gateway: Gateway, prefix: str = PREFIX) -> None:
        self.gw = gateway
        self.prefix = prefix.encode()
        self._last: _Read | None = None  # the pool object read last (commit_pool applies to it)

    def _key(self, kind: str, name: str) -> bytes:
        return self.prefix + kind.encode() + name.encode()

    def _call(self, method: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.gw.call(method, body)
        except Rejected as e:
            raise StoreUnavailable(f"etcd: {e.message}") from None

    def _get(self, key: bytes) -> _Read | None:
        kvs = self._call("kv/range", {"key": b64(key)}).get("kvs") or []
        return _read(kvs[0]) if kvs else None

    def _txn(self, key: bytes, compare: dict[str, Any], put: dict[str, Any] | None) -> tuple[bool, str]:
        """(succeeded, header revision): `put` the object (None: delete the key) iff `compare` holds."""
        op: dict[str, Any] = {"request_delete_range": {"key": b64(key)}}
        if put is not None:
            op = {"request_put": {"key": b64(key), "value": b64(jsonio.dumps(put))}}
        failure = [{"request_range": {"key": b64(key), "keys_only": True}}]
        answer = self._call(
            "kv/txn", {"compare": [{"key": b64(key), **compare}], "success": [op], "failure": failure}
        )
        succeeded = bool(answer.get("succeeded"))
        if not succeeded:
            rng = ((answer.get("responses") or [{}])[0]).get("response_range") or {}
            return False, "" if not rng.get("kvs") else "exists"
        return True, str((answer.get("header") or {}).get("revision", ""))

    def _iter(self, kind: str, page: int) -> Iterator[_Read]:
        start, end = self._key(kind, ""), prefix_end(self._key(kind, ""))
        while True:
            answer = self._call("kv/range", {"key": b64(start), "range_end": b64(end), "limit": page})
            kvs = answer.get("kvs") or []
            for kv in kvs:
                yield _read(kv)
            if not kvs or not answer.get("more"):
                return
            start = unb64(kvs[-1]["key"]) + b"\0"

    # ---- pools ----------------------------------------------------------------------------------------

    def get_pool(self, name: str) -> Pool | None:
        read = self._get(self._key(POOLS, name))
        self._last = read
        return None if read is None else crd.pool_from_object(read.obj, read.revision)

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        key = self._key(POOLS, pool.name)
        if pool.version is None:
            obj = {"apiVersion": crd.API_VERSION, "kind": "IPPool", "metadata": {"name": pool.name},
                   "spec": {"range": pool.range, "allocations": {}}}  # fmt: skip
            compare: dict[str, Any] = CREATE
        else:
            last = self._last
            read = last if last is not None and last.key == key and last.revision == pool.version else None
            read = read or self._get(key)
            if read is None or read.revision != pool.version:
                raise Conflict(f"pool {pool.name}: changed since version {pool.version}")
            obj = read.obj
            compare = _unchanged(pool.version)
        self._last = None
        _apply(obj, update)
        ok, revision = self._txn(key, compare, obj)
        if not ok:
            raise Conflict(f"pool {pool.name}: changed since version {pool.version}")
        self._last = _Read(key, revision, obj)
        return revision

    def iter_pools(self) -> Iterator[Pool]:
        for read in self._iter(POOLS, POOL_PAGE):
            yield crd.pool_from_object(read.obj, read.revision)

    # ---- reservations ---------------------------------------------------------------------------------

    def get_reservation(self, name: str) -> Reservation | None:
        read = self._get(self._key(RESERVATIONS, name))
        return None if read is None else crd.reservation_from_object(read.obj, read.revision)

    def put_reservation(self, res: Reservation) -> str:
        obj = crd.reservation_to_object(Reservation(res.name, res.owner), "")
        del obj["metadata"]["namespace"]
        compare = CREATE if res.version is None else _unchanged(res.version)
        ok, revision = self._txn(self._key(RESERVATIONS, res.name), compare, obj)
        if not ok:
            raise Conflict(f"reservation {res.name}: changed since version {res.version}")
        return revision

    def delete_reservation(self, res: Reservation) -> None:
        compare = _unchanged(res.version or "0")
        ok, exists = self._txn(self._key(RESERVATIONS, res.name), compare, None)
        if not ok and exists:
            raise Conflict(f"reservation {res.name}: changed since version {res.version}")

    def iter_reservations(self) -> Iterator[Reservation]:
        for read in self._iter(RESERVATIONS, RESERVATION_PAGE):
            yield crd.reservation_from_object(read.obj, read.revision)

    def ping(self) -> None:
        start = self._key("", "")
        self._call(
            "kv/range",
            {"key": b64(start), "range_end": b64(prefix_end(start)), "limit": 1, "keys_only": True},
        )

    def close(self) -> None:
        self._last = None
        self.gw.close()


def _unchanged(version: str) -> dict[str, Any]:
    """The txn compare of a key still at `version`."""
    return {"target": "MOD", "mod_revision": version, "result": "EQUAL"}


def _read(kv: dict[str, Any]) -> _Read:
    key = unb64(kv["key"])
    try:
        obj = jsonio.loads(unb64(kv.get("value", "")), f"etcd key {key!r}")
    except Exception:
        obj = None
    if not isinstance(obj, dict):
        raise StoreUnavailable(f"etcd key {key.decode(errors='replace')}: not a JSON object")
    return _Read(key, str(kv.get("mod_revision", "")), obj)


def _apply(obj: dict[str, Any], update: PoolUpdate) -> None:
    """Apply `update` to a stored IPPool object in place: spec.allocations and the owners annotation
    (all entries: ipam.store.crd's budget exists for Kubernetes' annotation cap only)."""
    spec = obj.setdefault("spec", {})
    allocations = spec.get("allocations")
    if not isinstance(allocations, dict):
        allocations = spec["allocations"] = {}
    meta = obj.setdefault("metadata", {})
    notes = dict(meta.get("annotations")) if isinstance(meta.get("annotations"), dict) else {}
    notes.pop(crd.LEGACY_OWNERS, None)
    for key in update.remove:
        allocations.pop(key, None)
        notes.pop(crd.owner_key(key), None)
    for key, a in update.put.items():
        allocations[key] = {"id": a.container_id, "podref": a.podref, "ifname": a.ifname}
        entry = crd.owner_entry(a)
        if entry:
            notes[crd.owner_key(key)] = jsonio.dumps(entry).decode()
        else:
            notes.pop(crd.owner_key(key), None)
    if notes:
        meta["annotations"] = notes
    else:
        meta.pop("annotations", None)
