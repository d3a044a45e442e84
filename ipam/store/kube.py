"""The Kubernetes store: the whereabouts CRDs `IPPool` and `OverlappingRangeIPReservation`
(whereabouts.cni.cncf.io/v1alpha1) in the kubeconfig context's namespace, named as upstream names
them (ipam.store.names) and shaped by ipam.store.crd, so a cluster running whereabouts switches
without losing an allocation (and back).

A pool is created with POST (409 AlreadyExists -> Conflict) and changed with a JSON Patch of the
entries an update touches, guarded per entry against the snapshot the update was computed from (kept
per version from `get_pool`, else read again): the store `merges` (ipam.store.base), and everything
else in the object (labels, foreign annotations, owner references) is never rewritten. A failed guard
is 422 -> Conflict. Reservations are compare-and-swap on resourceVersion (PUT; DELETE with a
precondition).

Errors: no answer, 401/403 (after one re-read of the token file), 410 and 5xx are StoreUnavailable
(code 11); 429, 504 and an answer that does not come within the read timeout are StoreBusy (retried
for the whole deadline); 404 is "absent". Lists page with `limit`/`continue`. Every request is checked
against ipam.rbac first (the role this process acts as): an access the manifests do not grant fails
in tests, not in a cluster."""

from __future__ import annotations

import _thread  # threading.Lock is _thread.allocate_lock; importing threading would cost every call
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator

from cni import jsonio, log
from cni.errors import CniError, Code
from ipam import kubeapi, rbac
from ipam.config import StoreConfig
from ipam.kubeapi import ApiError, Client
from ipam.model import Allocation, Pool, PoolUpdate, PoolView, Reservation
from ipam.store import crd, kubecall
from ipam.store.base import Conflict, Store, StoreUnavailable
from ipam.store.kubecall import PATCH_TEST_FAILED

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any

VERSION = "v1alpha1"
POOLS, RESERVATIONS = "ippools", "overlappingrangeipreservations"
JSON_PATCH = "application/json-patch+json"
# kept on every pool we create or annotate, so its annotations never become empty (the server drops an
# empty map, and re-creating it is the one patch that writers of different entries would race on)
MARKER = {"pycni.io/pool": "owners: pycni.io/o-<offset>"}
# appended to every pool patch: clears the object's managedFields (the server's documented way to strip
# them: an entry list of one empty entry). Field tracking of a pool with thousands of entries adds much
# to what the server spends on each write and to what every reader downloads; nothing reads a pool's
# field ownership (figures: docs/benchmarks.md).
UNTRACKED = {"op": "add", "path": "/metadata/managedFields", "value": [{}]}
SNAPSHOTS = 8  # pool snapshots a handle keeps for the commits computed from them
# objects per list request: a pool can be ~1.5 MB (the API server's object limit), a reservation ~1 KB
PAGES = {"ippools": 20, "overlappingrangeipreservations": 500}


class KubeStore(Store):
    merges = True  # commit_pool: a guarded JSON Patch of the changed entries (ipam.store.base)
    def __init__(self, client: Client, namespace: str, role: str | None = None, page: int = 0) -> None:
        """`page`: objects per list request for every kind (0: PAGES)."""
        self.client, self.namespace, self.page = client, namespace, page
        self.role = role or rbac.acting()
        # the pools this handle read or created, by (name, version): (pool, metadata). A commit is
        # guarded against the snapshot it was computed from, so it needs that snapshot's entries.
        self._seen: dict[tuple[str, str], tuple[Pool | None, dict[str, Any]]] = {}  # -> (pool, object)
        self._bytes: dict[tuple[str, str], int] = {}  # the same snapshots' sizes as answered (admit)
        self._res_meta: dict[str, dict[str, Any]] = {}
        self._scope = (str(getattr(getattr(client, "conf", None), "server", "")), namespace)
        self.turn_limit = 120.0  # how long a write through a turn may wait (the retry limit)
        self.contended = False  # the last write through a turn waited for another writer
        self._watch: Client | None = None

    # ---- requests ---------------------------------------------------------------------------------

    def _call(
        self,
        verb: str,
        resource: str,
        name: str = "",
        body: Any = None,
        query: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """One API request; None for 404. Conflict for 409; StoreUnavailable when the API cannot serve."""
        rbac.require(self.role, crd.GROUP, resource, verb)
        method = {"get": "GET", "list": "GET", "create": "POST", "update": "PUT", "delete": "DELETE",
                  "patch": "PATCH"}[verb]
        path = kubeapi.path_of(crd.GROUP, VERSION, self.namespace, resource, "" if verb == "create" else name)
        what = f"{verb} {resource}/{name}" if name else f"{verb} {resource}"

        def own(e: ApiError) -> CniError | None:  # a guard (`test`) that failed: the write's Conflict
            if verb == "patch" and e.status == 422 and e.message == PATCH_TEST_FAILED:
                return Conflict(f"kubernetes: {what}: {e.message or e.reason}")
            return None

        content = JSON_PATCH if verb == "patch" else ""
        return kubecall.request(self.client, method, path, what, body, query, content, own)

    def _list(self, resource: str) -> Iterator[dict[str, Any]]:
        token = ""
        while True:
            limit = self.page or PAGES[resource]
            doc = self._call("list", resource, query={"limit": limit, "continue": token})
            if doc is None:
                raise StoreUnavailable(
                    f"kubernetes: list {resource}: not served (are the whereabouts CRDs installed?)"
                )
            yield from doc.get("items") or []
            token = str((doc.get("metadata") or {}).get("continue") or "")
            if not token:
                return

    # ---- pools ------------------------------------------------------------------------------------

    def get_pool(self, name: str) -> Pool | None:
        return self._get_pool(name)

    def recent_pool(self, name: str, version: str) -> Pool | None:
        """A GET with `resourceVersion`: the API server answers from its watch cache once that holds
        `version` or newer, without reading etcd and decoding the stored object (a fraction of the
        server's CPU: docs/benchmarks.md, `tests/bench/pool_write_cost.py`). A cache that does not
        catch up within the server's 3 s (504: a version from before the cluster's etcd was restored),
        or a version the server cannot parse (500): the pool as stored."""
        try:
            return self._get_pool(name, {"resourceVersion": version})
        except StoreUnavailable:
            return self._get_pool(name)

    def _get_pool(self, name: str, query: dict[str, Any] | None = None) -> Pool | None:
        obj = self._call("get", POOLS, name, query=query)
        if obj is None:
            return None
        pool = crd.pool_from_object(obj)
        self._keep(obj, pool, self.client.received)
        return pool

    def _keep(self, obj: dict[str, Any], pool: Pool | None = None, size: int = 0) -> str:
        """Remember a pool object as read or as returned by a write (its version; "" if it has none): the
        snapshot commits are guarded against, and the one `written()` hands out. A written object is
        turned into a Pool only if a commit is computed from it (`pool` None until then). `size`: the
        bytes of the answer that held it (0: not alone in it, a list)."""
        meta = obj.get("metadata") or {}
        version = str(meta.get("resourceVersion") or "")
        if version:
            key = (str(meta.get("name", "")), version)
            self._seen[key] = (pool, obj)
            if size:
                self._bytes[key] = size
            while len(self._seen) > SNAPSHOTS:
                oldest = next(iter(self._seen))
                del self._seen[oldest]
                self._bytes.pop(oldest, None)
        return version

    def admit(self, view: PoolView, entry: Allocation, earlier: int) -> None:
        """Code 100 (`too_large`) when pool `view`, as this handle read or wrote it, would pass
        crd.SIZE_LIMIT with `entry` and the `earlier` new entries of the same write added, each counted as
        large as `entry` (crd.entry_bytes). The pool's size is that of the server's answer that held it:
        nothing is encoded, but a snapshot taken from a list once, and near the limit the object's
        managedFields (a pool upstream or a create wrote), which our write clears (UNTRACKED)."""
        key = (view.name, str(view.version))
        seen = self._seen.get(key)
        if seen is None:  # (a pool not stored yet, or a snapshot no longer kept)
            return
        size = self._bytes.get(key) or self._bytes.setdefault(key, len(jsonio.dumps(seen[1])))
        grown = (earlier + 1) * crd.entry_bytes(entry)
        if size + grown <= crd.SIZE_LIMIT:
            return
        tracked = (seen[1].get("metadata") or {}).get("managedFields")
        if tracked and size - len(jsonio.dumps(tracked)) + grown <= crd.SIZE_LIMIT:
            return
        raise too_large(view.name, view.count(), size)

    def written(self, name: str, version: str) -> Pool | None:
        """Pool `name` at `version` as this handle read or wrote it: commits from it are guarded against
        the object kept with it."""
        seen = self._seen.get((name, version))
        if seen is not None and seen[0] is None:
            seen = self._seen[(name, version)] = (crd.pool_from_object(seen[1]), seen[1])
        return None if seen is None else seen[0]

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        if pool.version is None:
            new = Pool(pool.name, pool.range, update.apply({}))
            body = crd.pool_to_object(new, self.namespace)
            mine = {crd.WRITER_NOTE: update.writer} if update.writer else {}
            notes = body["metadata"].get("annotations") or {}
            body["metadata"]["annotations"] = {**MARKER, **mine, **notes}
            return self._written(pool.name, self._call("create", POOLS, pool.name, body))
        _, notes, ops = self._patch(pool, update)  # (a shared pool's turn: post_pool, asked first)
        if not ops:
            return str(pool.version)
        if update.whole:
            ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion", "value": pool.version})
        if update.writer and notes.get(crd.WRITER_NOTE) != update.writer:
            ops += _writer_ops(ops, notes, update.writer)
        written = self._call("patch", POOLS, pool.name, [*ops, UNTRACKED])
        if written is None:  # deleted meanwhile
            raise Conflict(f"kubernetes: pool {pool.name}: deleted since version {pool.version}")
        return self._written(pool.name, written)

    def _patch(self, pool: Pool, update: PoolUpdate) -> tuple[Pool, dict[str, Any], list[dict[str, Any]]]:
        """The snapshot `pool` was read as (read again if another handle read it), its annotations, and
        the guarded JSON Patch of `update` against it (patch_ops)."""
        base = self.written(pool.name, str(pool.version))
        if base is None:  # a snapshot another handle read: usable only while it is still current
            base = self.get_pool(pool.name)
            if base is None or base.version != pool.version:
                raise Conflict(f"kubernetes: pool {pool.name}: changed since version {pool.version}")
        obj = self._seen[(pool.name, str(pool.version))][1]
        notes = (obj.get("metadata") or {}).get("annotations") or {}
        return base, notes, patch_ops(base, notes, update)

    def post_pool(self, pool: Pool, update: PoolUpdate) -> Callable[[], str] | None:
        """A node's write of a pool other nodes write too (`shared`): through the pool's turn (ipam.turn:
        taken and written now when it is free, else this write's intent posted and the wait returned).
        None: a write of its own (a pool this node alone writes, a write of the owners notes, a store
        without the turn's Leases, or not a node's ADD or DEL)."""
        if pool.version is None or not update.writer:
            return None
        base, notes, ops = self._patch(pool, update)
        if not ops or not shared(base, notes, update.writer) or _touches_notes(ops):
            return None
        if update.whole:  # decided on a snapshot, which other nodes' writes outdate: on a read
            raise Conflict(f"kubernetes: pool {pool.name}: shared, decided on a snapshot")
        from ipam import turn
        from ipam.store.kubeturn import Forbidden, KubeTurn

        me = f"{update.writer}/{os.getpid()}/{os.urandom(4).hex()}"
        writer = turn.Writer(KubeTurn(self, pool.name), me, limit=self.turn_limit)
        try:
            ticket = writer.start(ops)
        except Forbidden as e:
            if not _Known.said_forbidden:
                _Known.said_forbidden = True
                log.warning("pool %s: shared by several nodes, but %s: written directly (grant leases as "
                            "bundler/manifests/rbac.yaml does)", pool.name, e)  # fmt: skip
            return None
        self.contended = writer.waited
        return ticket.wait

    def read_pool_object(self, name: str, at_least: str = "") -> dict[str, Any] | None:
        """Pool `name` as an object (kept as a snapshot): at least as new as version `at_least` from the
        server's cache, or as stored ("", or a cache that cannot serve that version)."""
        obj = None
        if at_least:
            try:
                obj = self._call("get", POOLS, name, query={"resourceVersion": at_least})
            except StoreUnavailable:
                at_least = ""
        if not at_least:
            obj = self._call("get", POOLS, name)
        if obj is not None:
            self._keep(obj, size=self.client.received)
        return obj

    def patch_pool_object(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A guarded JSON Patch of pool `name` (the turn's round): the object after it (kept as a
        snapshot). Conflict when a test failed or the pool is gone."""
        written = self._call("patch", POOLS, name, [*ops, UNTRACKED])
        if written is None:
            raise Conflict(f"kubernetes: pool {name}: deleted")
        self._keep(written, size=self.client.received)
        return written

    def watcher(self, read: float) -> Client:
        """A client for watches (a connection of its own) whose reads wait `read` seconds."""
        if self._watch is None or self._watch.timeout[1] < read:
            if self._watch is not None:
                self._watch.close()
            self._watch = Client(self.client.conf, (self.client.timeout[0], read))
        return self._watch

    def _written(self, name: str, obj: dict[str, Any] | None) -> str:
        """The version of the pool object a create or patch returned (kept as a snapshot)."""
        if obj is not None:
            self._keep(obj, size=self.client.received)
        return _version_of((obj or {}).get("metadata") or {}, f"pool {name}")

    def iter_pools(self) -> Iterator[Pool]:
        """Every pool, as listed; each is kept as a snapshot (`_keep`), so a commit computed from the pool
        just yielded (the reconciler's, the pod watch's) needs no GET first."""
        for obj in self._list(POOLS):
            pool = crd.pool_from_object(obj)
            self._keep(obj, pool)
            yield pool

    # ---- reservations -----------------------------------------------------------------------------

    def get_reservation(self, name: str) -> Reservation | None:
        obj = self._call("get", RESERVATIONS, name)
        if obj is None:
            self._res_meta.pop(name, None)
            _Known.forget((*self._scope, name))
            return None
        self._res_meta[name] = obj.get("metadata") or {}
        res = crd.reservation_from_object(obj)
        _Known.remember((*self._scope, name), res)
        return res

    def known_reservation(self, name: str) -> Reservation | None:
        """Reservation `name` as this process last wrote or read it (not a request; possibly stale: a
        delete with its version then fails as a Conflict)."""
        return _Known.get((*self._scope, name))

    def put_reservation(self, res: Reservation) -> str:
        body = crd.reservation_to_object(res, self.namespace)
        if res.version is None:
            obj = self._call("create", RESERVATIONS, res.name, body)
        else:
            meta = self._res_meta.get(res.name) or {}
            if meta.get("resourceVersion") == res.version:
                body["metadata"] = _merged_meta(
                    meta, body["metadata"], (crd.RES_UID, crd.RES_NETWORK, crd.RES_NODE)
                )
            obj = self._call("update", RESERVATIONS, res.name, body)
            if obj is None:
                raise Conflict(f"kubernetes: reservation {res.name}: deleted since version {res.version}")
        meta = (obj or {}).get("metadata") or {}
        version = _version_of(meta, f"reservation {res.name}")
        self._res_meta[res.name] = meta
        _Known.remember((*self._scope, res.name), Reservation(res.name, res.owner, version))
        return version

    def delete_reservation(self, res: Reservation) -> None:
        if res.version is None:
            if self.get_reservation(res.name) is not None:
                raise Conflict(f"kubernetes: reservation {res.name}: exists, and no version was given")
            return
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"resourceVersion": res.version},
        }
        try:
            self._call("delete", RESERVATIONS, res.name, options)  # 404: already gone, success
        finally:
            _Known.forget((*self._scope, res.name))
        self._res_meta.pop(res.name, None)

    def iter_reservations(self) -> Iterator[Reservation]:
        for obj in self._list(RESERVATIONS):
            yield crd.reservation_from_object(obj)

    # ---- health -----------------------------------------------------------------------------------

    def ping(self) -> None:
        if self._call("list", POOLS, query={"limit": 1}) is None:
            raise StoreUnavailable("kubernetes: ippools are not served (are the whereabouts CRDs installed?)")

    def close(self) -> None:
        self.client.close()
        if self._watch is not None:
            self._watch.close()


class _Known:
    """Reservations as this process last wrote or read them, per (server, namespace, name). In the agent
    an attachment's ADD and DEL run in one process: the DEL deletes the reservation with the version it
    knows (a precondition) instead of reading it first. Bounded (least recently used goes); an entry
    that went stale costs one Conflict and the read it saved."""

    LIMIT = 65536
    said_forbidden = False  # a turn refused for want of Leases: logged once per process
    lock = _thread.allocate_lock()
    entries: OrderedDict[tuple[str, str, str], Reservation] = OrderedDict()

    @classmethod
    def remember(cls, key: tuple[str, str, str], res: Reservation) -> None:
        with cls.lock:
            cls.entries[key] = res
            cls.entries.move_to_end(key)
            while len(cls.entries) > cls.LIMIT:
                cls.entries.popitem(last=False)

    @classmethod
    def forget(cls, key: tuple[str, str, str]) -> None:
        with cls.lock:
            cls.entries.pop(key, None)

    @classmethod
    def get(cls, key: tuple[str, str, str]) -> Reservation | None:
        with cls.lock:
            return cls.entries.get(key)


def too_large(name: str, entries: int, size: int) -> CniError:
    """Code 100: an ADD refused by `KubeStore.admit` (pool `name` of `entries` entries, `size` bytes)."""
    return CniError(
        f"pool {name} is too large for another entry: {entries} entries, {size:,} bytes as stored; pycni "
        f"adds none past {crd.SIZE_LIMIT:,} bytes (etcd refuses requests over {crd.STORE_LIMIT:,} bytes by "
        "default)",
        "use a smaller range, or node_slice_size for a pool per node (docs/ipam.md#pool-size-limit)",
        code=Code.POOL_EXHAUSTED,
    )


def _version_of(meta: dict[str, Any], what: str) -> str:
    version = str(meta.get("resourceVersion") or "")
    if not version:
        raise StoreUnavailable(f"kubernetes: {what}: the server returned no resourceVersion")
    return version


def shared(base: Pool, notes: dict[str, Any], writer: str) -> bool:
    """Whether pool `base` (its annotations `notes`) is written by other nodes than `writer`: it has a
    turn, or was last written directly by another node, or holds entries without saying who wrote them
    (upstream whereabouts', or pycni's from before the turn)."""
    last = notes.get(crd.WRITER_NOTE)
    return base.shared or (bool(last) and last != writer) or (not last and bool(base.allocations))


def _touches_notes(ops: list[dict[str, Any]]) -> bool:
    """Whether a patch changes the pool's owners notes (extras of entries on a store without
    reservations): such writes keep to the budget of their own read and are not combined."""
    return any(str(op.get("path", "")).startswith("/metadata/annotations/pycni.io~1o-") for op in ops)


def _writer_ops(ops: list[dict[str, Any]], notes: dict[str, Any], writer: str) -> list[dict[str, Any]]:
    """The operations that record `writer` as the pool's last direct writer (ipam.store.kube `shared`)."""
    for op in ops:
        if op.get("path") == "/metadata/annotations" and op.get("op") == "add":  # the map made by ops
            op["value"] = {**op["value"], crd.WRITER_NOTE: writer}
            return []
    if not notes:
        value = {**MARKER, crd.WRITER_NOTE: writer}
        return [{"op": "test", "path": "/metadata/annotations", "value": None},
                {"op": "add", "path": "/metadata/annotations", "value": value}]
    return [{"op": "add", "path": _pointer("metadata", "annotations", crd.WRITER_NOTE), "value": writer}]


def _pointer(*parts: str) -> str:
    """A JSON Pointer (RFC 6901) to /parts..."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def patch_ops(base: Pool, notes: dict[str, Any], update: PoolUpdate) -> list[dict[str, Any]]:
    """The JSON Patch (RFC 6902) that applies `update` to the pool as it was read (`base`, its
    annotations `notes`), guarded entry by entry: a new entry must still be absent, a replaced or
    removed one must still name the container it named. The server applies it to the pool as it is
    then, so writers of other entries never conflict with it; a failed guard is 422 (Conflict)."""
    ops: list[dict[str, Any]] = []

    def guard(key: str, old: Allocation | None) -> dict[str, Any]:
        if old is None:
            return {"op": "test", "path": _pointer("spec", "allocations", key), "value": None}
        return {"op": "test", "path": _pointer("spec", "allocations", key, "id"), "value": old.container_id}

    for key in sorted(update.remove - update.put.keys()):
        old = base.allocations.get(key)
        if old is not None:
            ops += [guard(key, old), {"op": "remove", "path": _pointer("spec", "allocations", key)}]
    for key, a in update.put.items():
        old = base.allocations.get(key)
        entry = {"id": a.container_id, "podref": a.podref, "ifname": a.ifname}
        change = {"op": "add" if old is None else "replace", "path": _pointer("spec", "allocations", key)}
        ops += [guard(key, old), {**change, "value": entry}]
    return ops + _note_ops(notes, update)


def _note_ops(notes: dict[str, Any], update: PoolUpdate) -> list[dict[str, Any]]:
    """The owners annotations of the changed entries (ipam.store.crd), within the budget; the first
    format's annotation goes."""
    ops: list[dict[str, Any]] = []
    gone = [crd.LEGACY_OWNERS] if crd.LEGACY_OWNERS in notes else []
    gone += [crd.owner_key(k) for k in sorted(update.remove) if crd.owner_key(k) in notes]
    size = sum(crd.note_size(k, str(v)) for k, v in notes.items() if k not in gone)
    added: dict[str, str] = {}
    for key, a in update.put.items():
        note, entry = crd.owner_key(key), crd.owner_entry(a)
        if entry is not None:
            value = jsonio.dumps(entry).decode()
            if size + crd.note_size(note, value) <= crd.OWNERS_BUDGET:
                added[note] = value
                size += crd.note_size(note, value)
                continue
        if note in notes and note not in gone:
            gone.append(note)
    ops += [{"op": "remove", "path": _pointer("metadata", "annotations", k)} for k in gone if k not in added]
    if added and not notes:  # a pool without annotations (upstream's): the map, with our marker
        ops += [{"op": "test", "path": "/metadata/annotations", "value": None},
                {"op": "add", "path": "/metadata/annotations", "value": MARKER}]  # fmt: skip
    ops += [{"op": "add", "path": _pointer("metadata", "annotations", k), "value": v}
            for k, v in added.items()]
    return ops


def _merged_meta(stored: dict[str, Any], ours: dict[str, Any], owned: tuple[str, ...]) -> dict[str, Any]:
    """Our metadata over what is stored: labels, foreign annotations, owner references and finalizers
    are kept; annotations we own are ours (removed when we have none); managedFields are left to the
    server."""
    meta = {k: v for k, v in stored.items() if k not in ("managedFields", "annotations")}
    meta.update({k: v for k, v in ours.items() if k != "annotations"})
    notes = {k: v for k, v in (stored.get("annotations") or {}).items() if k not in owned}
    notes.update(ours.get("annotations") or {})
    if notes:
        meta["annotations"] = notes
    return meta


def open_store(conf: StoreConfig) -> KubeStore:
    kube = kubeapi.load_kubeconfig(conf.kubernetes.kubeconfig)
    return KubeStore(Client(kube), kube.namespace)
