"""The Kubernetes store: the whereabouts CRDs `IPPool` and `OverlappingRangeIPReservation`
(whereabouts.cni.cncf.io/v1alpha1) in the kubeconfig context's namespace, named as upstream names
them (ipam.store.names) and shaped by ipam.store.crd, so a cluster running whereabouts switches
without losing an allocation (and back).

Compare-and-swap is resourceVersion: a pool is written with PUT carrying the version it was computed
from (409 -> Conflict), created with POST (409 AlreadyExists -> Conflict); a reservation is deleted
with a resourceVersion precondition. A PUT replaces the whole object, so the store applies the update
to the object it last read at that version (kept from `get_pool`, else read again) and keeps what
others put in its metadata (labels, foreign annotations, owner references).

Errors: no answer, a timeout, 401/403 (after one re-read of the token file), 429 and 5xx are
StoreUnavailable (code 11); 404 is "absent". Lists page with `limit`/`continue`. Every request is
checked against ipam.rbac first (the role this process acts as), so an access that the manifests
do not grant fails in tests, not in a cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from cni.errors import CniError, Code
from ipam import kubeapi, rbac
from ipam.config import StoreConfig
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.store import crd
from ipam.store.base import Conflict, Pool, PoolUpdate, Reservation, StoreUnavailable

VERSION = "v1alpha1"
POOLS, RESERVATIONS = "ippools", "overlappingrangeipreservations"
# objects per list request: a pool can be ~1.5 MB (the API server's object limit), a reservation ~1 KB
PAGES = {"ippools": 20, "overlappingrangeipreservations": 500}


class KubeStore:
    def __init__(self, client: Client, namespace: str, role: str | None = None, page: int = 0) -> None:
        """`page`: objects per list request for every kind (0: PAGES)."""
        self.client, self.namespace, self.page = client, namespace, page
        self.role = role or rbac.acting()
        # the last object read or written per pool: (pool, metadata) at pool.version
        self._seen: dict[str, tuple[Pool, dict[str, Any]]] = {}
        self._res_meta: dict[str, dict[str, Any]] = {}

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
        method = {"get": "GET", "list": "GET", "create": "POST", "update": "PUT", "delete": "DELETE"}[verb]
        path = kubeapi.path_of(crd.GROUP, VERSION, self.namespace, resource, "" if verb == "create" else name)
        what = f"{verb} {resource}/{name}" if name else f"{verb} {resource}"
        try:
            return self.client.request(method, path, body, query)
        except Unreachable as e:
            raise StoreUnavailable(f"kubernetes: {what}: {e}") from None
        except ApiError as e:
            if e.status == 404:
                return None
            if e.status == 409:
                raise Conflict(f"kubernetes: {what}: {e.message or e.reason}") from None
            if e.status in (401, 403, 410, 429) or e.status >= 500:
                raise StoreUnavailable(f"kubernetes: {what}: {e}") from None
            code = Code.INVALID_CONFIG if "metadata.name" in e.message else Code.INTERNAL
            raise CniError(f"kubernetes: {what} rejected: {e}", code=code) from None

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
        obj = self._call("get", POOLS, name)
        if obj is None:
            self._seen.pop(name, None)
            return None
        pool = crd.pool_from_object(obj)
        self._seen[name] = (pool, obj.get("metadata") or {})
        return pool

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        if pool.version is None:
            new = Pool(pool.name, pool.range, update.apply({}))
            obj = self._call("create", POOLS, pool.name, crd.pool_to_object(new, self.namespace))
            return self._remember(new, obj, {})
        seen = self._seen.get(pool.name)
        if seen is None or seen[0].version != pool.version:
            current = self.get_pool(pool.name)
            if current is None or current.version != pool.version:
                raise Conflict(f"kubernetes: pool {pool.name}: changed since version {pool.version}")
            seen = self._seen[pool.name]
        base, meta = seen
        new = Pool(pool.name, base.range, update.apply(base.allocations), pool.version)
        body = crd.pool_to_object(new, self.namespace)
        body["metadata"] = _merged_meta(meta, body["metadata"], (crd.OWNERS, crd.LEGACY_OWNERS))
        obj = self._call("update", POOLS, pool.name, body)
        if obj is None:  # deleted meanwhile
            self._seen.pop(pool.name, None)
            raise Conflict(f"kubernetes: pool {pool.name}: deleted since version {pool.version}")
        return self._remember(new, obj, body["metadata"])

    def _remember(self, pool: Pool, obj: dict[str, Any] | None, meta: dict[str, Any]) -> str:
        stored = (obj or {}).get("metadata") or {}
        version = str(stored.get("resourceVersion") or "")
        if not version:
            raise StoreUnavailable(f"kubernetes: pool {pool.name}: the server returned no resourceVersion")
        self._seen[pool.name] = (Pool(pool.name, pool.range, pool.allocations, version), stored or meta)
        return version

    def iter_pools(self) -> Iterator[Pool]:
        for obj in self._list(POOLS):
            yield crd.pool_from_object(obj)

    # ---- reservations -----------------------------------------------------------------------------

    def get_reservation(self, name: str) -> Reservation | None:
        obj = self._call("get", RESERVATIONS, name)
        if obj is None:
            self._res_meta.pop(name, None)
            return None
        self._res_meta[name] = obj.get("metadata") or {}
        return crd.reservation_from_object(obj)

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
        version = str(meta.get("resourceVersion") or "")
        if not version:
            raise StoreUnavailable(
                f"kubernetes: reservation {res.name}: the server returned no resourceVersion"
            )
        self._res_meta[res.name] = meta
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
        self._call("delete", RESERVATIONS, res.name, options)  # 404: already gone, success
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
