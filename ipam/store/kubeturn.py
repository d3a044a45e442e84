"""The write turn's objects on the Kubernetes store (ipam.turn): `coordination.k8s.io/v1` Leases in the
store's namespace, beside the pools. `h` is a digest of the pool's name.

- the turn `pycni-turn-<h>`: `spec.holderIdentity` ("" when free), `spec.renewTime` (when taken, for
  people: waiters judge a silent holder by their own clock), `spec.leaseDurationSeconds`
  (ipam.turn.TURN_SECONDS, likewise for people); annotations `pycni.io/pool` (the pool's name) and
  `pycni.io/round` (the last round: `{"n", "pool", "done", "rejected", "handled"}`). Taken and released
  with JSON Patches guarded by `test` (taken: the version the taker judged; released: still the holder).
- an intent per waiting writer, `pycni-i-<h>-<suffix>` (generateName), labelled `pycni.io/intent-of:
  <h>`, annotation `pycni.io/ops` (its JSON Patch operations, as the store guards them) and
  `pycni.io/writer`. Posted and deleted by its writer; a round lists them with a label selector at least
  as new as its take (from the server's cache).
- the pool itself gets `pycni.io/turn: <the turn's name>` on the first round: from then on it is a
  shared pool and every writer's ADD and DEL go through the turn (ipam.store.kube).

A watch on the turn (by name) runs on a connection of its own, so the store's connection stays open for
the requests that follow it."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator

from cni import jsonio
from cni.errors import CniError
from ipam import kubeapi, rbac
from ipam.digest import sha256_hex
from ipam.kubeapi import ApiError, Client, Unreachable
from ipam.store import crd, kubecall
from ipam.store.base import Conflict, StoreUnavailable
from ipam.turn import TURN_SECONDS, Gone, Intent, Outcome, State, watch_states

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing would cost every call
if TYPE_CHECKING:
    from typing import Any, Protocol

    from ipam.store.turnwatch import TurnWatch

    class PoolStore(Protocol):
        """What the turn uses of the Kubernetes store (ipam.store.kube.KubeStore)."""

        client: Client
        namespace: str
        role: str

        def read_pool_object(self, name: str, at_least: str = "") -> dict[str, Any] | None: ...
        def patch_pool_object(self, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]: ...
        def watcher(self, read: float) -> Client: ...

GROUP, VERSION, LEASES = "coordination.k8s.io", "v1", "leases"
JSON_PATCH = "application/json-patch+json"
POOL_NOTE = "pycni.io/pool"
ROUND_NOTE = "pycni.io/round"
OPS_NOTE = "pycni.io/ops"
WRITER_NOTE = crd.WRITER_NOTE
INTENT_OF = "pycni.io/intent-of"
TURN_OF_POOL = crd.TURN_NOTE  # on the pool: it is shared (written through its turn)
WATCH_SLACK = 5.0  # a watch read waits this much longer than the watch lasts


class _Watches:
    shared = False  # the agent: waits go through one shared watch per turn (ipam.store.turnwatch)


def share_watches(enabled: bool = True, enter: Callable[[], None] | None = None) -> None:
    """The agent, once at start-up: its waits on a turn share one watch of it (ipam.store.turnwatch),
    whose threads run `enter` first (the agent's home). A plugin process never imports that module."""
    _Watches.shared = enabled
    if enabled or "ipam.store.turnwatch" in sys.modules:
        from ipam.store import turnwatch

        turnwatch.configure(enter)


class Forbidden(StoreUnavailable):
    """The node's role may not use Leases (RBAC from before the turn): the store writes directly."""


def digest(pool: str) -> str:
    return sha256_hex(pool.encode())[:20]


def turn_name(pool: str) -> str:
    return f"pycni-turn-{digest(pool)}"


def _pointer(*parts: str) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _now() -> str:
    """A MicroTime for spec.renewTime / acquireTime (RFC 3339, microseconds, UTC)."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


def _epoch(stamp: str) -> float | None:
    """Seconds since the epoch of a `YYYY-MM-DDTHH:MM:SS[.frac]Z` timestamp (None if not one)."""
    try:
        y, mo, d = int(stamp[0:4]), int(stamp[5:7]), int(stamp[8:10])
        h, mi, s = int(stamp[11:13]), int(stamp[14:16]), int(stamp[17:19])
    except ValueError:
        return None
    y2 = y - (mo <= 2)  # days from the civil date (Howard Hinnant's days_from_civil)
    era = y2 // 400
    yoe = y2 - era * 400
    doy = (153 * (mo + (-3 if mo > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return days * 86400 + h * 3600 + mi * 60 + s


def state_of(obj: dict[str, Any]) -> State:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    last = Outcome()
    text = (meta.get("annotations") or {}).get(ROUND_NOTE)
    if isinstance(text, str) and text:
        try:
            raw = jsonio.loads(text, ROUND_NOTE)
            last = Outcome(int(raw.get("n", 0)), str(raw.get("pool", "")),
                                frozenset(str(x) for x in raw.get("done") or ()),
                                {str(k): str(v) for k, v in (raw.get("rejected") or {}).items()},
                                frozenset(str(x) for x in raw.get("handled") or ()))  # fmt: skip
        except Exception:  # mangled by hand: as if no round ran (waiters take the turn and see)
            last = Outcome()
    return State(str(meta.get("resourceVersion") or ""), str(spec.get("holderIdentity") or ""), last)


class KubeTurn:
    """ipam.turn's objects for pool `pool` of `store` (ipam.turn.Objects)."""

    def __init__(self, store: PoolStore, pool: str) -> None:
        self.store, self.pool_name = store, pool
        self.h = digest(pool)
        self.name = f"pycni-turn-{self.h}"
        self.namespace = store.namespace
        self.last_pool: dict[str, Any] = {}  # the pool object as last read or written here

    # ---- requests -----------------------------------------------------------------------------

    def _call(self, verb: str, name: str = "", body: Any = None, query: dict[str, Any] | None = None,
              content_type: str = "", client: Client | None = None) -> dict[str, Any] | None:  # fmt: skip
        """One request on a Lease (on the store's client unless `client`); None for 404. Conflict for 409
        and for a failed `test` (422)."""
        rbac.require(self.store.role, GROUP, LEASES, verb)
        method = {"get": "GET", "list": "GET", "create": "POST", "patch": "PATCH", "delete": "DELETE"}[verb]
        path = kubeapi.path_of(GROUP, VERSION, self.namespace, LEASES, "" if verb == "create" else name)
        what = f"{verb} leases/{name}" if name else f"{verb} leases"

        def own(e: ApiError) -> CniError | None:
            if e.status == 403:
                return Forbidden(f"kubernetes: {what}: {e}")
            if e.status == 422:  # a `test` that failed: taken or released by another writer meanwhile
                return Conflict(f"kubernetes: {what}: {e.message or e.reason}")
            return None

        on = client or self.store.client
        return kubecall.request(on, method, path, what, body, query, content_type, own, (401, 410))

    # ---- the turn -----------------------------------------------------------------------------

    def turn(self) -> State | None:
        shared = self._shared()
        latest = shared.latest() if shared is not None else None
        if latest is not None:
            return latest
        return self.read()

    def read(self, client: Client | None = None) -> State | None:
        """The turn as stored (None: not made yet), on the store's client unless `client`."""
        obj = self._call("get", self.name, client=client)
        return None if obj is None else state_of(obj)

    def _shared(self) -> TurnWatch | None:
        """The agent's shared watch of this turn (None: a plugin process)."""
        if not _Watches.shared:
            return None
        from ipam.store import turnwatch

        def make(enter: Callable[[], None] | None) -> TurnWatch:  # its own client, for its own thread
            client = Client(self.store.client.conf, (3.0, turnwatch.WATCH_SECONDS + WATCH_SLACK))
            return turnwatch.TurnWatch(functools.partial(self._watch, client), client, enter)

        return turnwatch.shared((str(self.store.client.conf.server), self.namespace, self.name), make)

    def create(self) -> State:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Lease",
            "metadata": {"name": self.name, "annotations": {POOL_NOTE: self.pool_name}},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": int(TURN_SECONDS)},
        }  # fmt: skip
        obj = self._call("create", body=body)
        return state_of(obj or {})

    def take(self, seen: State, me: str) -> State | None:
        ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": seen.version},
               {"op": "add", "path": "/spec/holderIdentity", "value": me},
               {"op": "add", "path": "/spec/renewTime", "value": _now()}]  # fmt: skip
        try:
            obj = self._call("patch", self.name, ops, content_type=JSON_PATCH)
        except Conflict:
            return None
        return None if obj is None else state_of(obj)

    def release(self, held: State, me: str, outcome: Outcome, to: str) -> State | None:
        note = jsonio.dumps({"n": outcome.n, "pool": outcome.pool, "done": sorted(outcome.done),
                             "rejected": outcome.rejected,
                             "handled": sorted(outcome.handled)}).decode()  # fmt: skip
        ops = [{"op": "test", "path": "/spec/holderIdentity", "value": me},
               {"op": "add", "path": "/spec/holderIdentity", "value": to},
               {"op": "add", "path": _pointer("metadata", "annotations", ROUND_NOTE),
                "value": note}]  # fmt: skip
        try:
            obj = self._call("patch", self.name, ops, content_type=JSON_PATCH)
        except Conflict:
            return None
        return None if obj is None else state_of(obj)

    def changes(self, since: str, seconds: float) -> Iterator[State]:
        shared = self._shared()
        got = shared.changes(since, seconds) if shared is not None else None
        if got is not None:
            return got
        return self._watch(self.store.watcher(seconds + WATCH_SLACK), since, seconds)

    def _watch(self, client: Client, since: str, seconds: float) -> Iterator[State]:
        """A watch of the turn on `client`: its states after `since`, for `seconds` at most."""
        rbac.require(self.store.role, GROUP, LEASES, "watch")
        path = kubeapi.path_of(GROUP, VERSION, self.namespace, LEASES)
        query = {"fieldSelector": f"metadata.name={self.name}", "resourceVersion": since,
                 "timeoutSeconds": max(1, int(seconds))}  # fmt: skip
        try:
            yield from watch_states(client.watch(path, query), state_of)
        except ApiError as e:
            if e.status == 410:
                raise Gone() from None
            raise StoreUnavailable(f"kubernetes: watch leases/{self.name}: {e}") from None
        except Unreachable as e:  # (Busy included) the watch connection broke: look at the turn again
            raise StoreUnavailable(f"kubernetes: watch leases/{self.name}: {e}") from None

    # ---- intents ------------------------------------------------------------------------------

    def post(self, ops: list[dict[str, Any]], me: str) -> Intent:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Lease",
            "metadata": {"generateName": f"pycni-i-{self.h}-", "labels": {INTENT_OF: self.h},
                         "annotations": {OPS_NOTE: jsonio.dumps(ops).decode(),
                                         WRITER_NOTE: me}},
            "spec": {},
        }  # fmt: skip
        obj = self._call("create", body=body) or {}
        meta = obj.get("metadata") or {}
        return Intent(str(meta.get("name", "")), ops, str(meta.get("resourceVersion") or ""), 0.0, me)

    def delete(self, name: str) -> None:
        self._call("delete", name)

    def intents(self, at_least: str) -> list[Intent]:
        query = {"labelSelector": f"{INTENT_OF}={self.h}", "resourceVersion": at_least,
                 "resourceVersionMatch": "NotOlderThan" if at_least else ""}  # fmt: skip
        doc = self._call("list", query=query) or {}
        now = time.time()
        out = []
        for obj in doc.get("items") or []:
            meta = obj.get("metadata") or {}
            notes = meta.get("annotations") or {}
            try:
                ops = jsonio.loads(str(notes.get(OPS_NOTE, "")), OPS_NOTE)
            except Exception:
                ops = None
            created = _epoch(str(meta.get("creationTimestamp") or ""))
            age = now - created if created is not None else 0.0
            if not isinstance(ops, list):  # not ours to judge: refused (its writer, if any, decides again)
                ops = [{"op": "test", "path": "/", "value": "unreadable intent"}]
            version, writer = str(meta.get("resourceVersion") or ""), str(notes.get(WRITER_NOTE) or "")
            out.append(Intent(str(meta.get("name", "")), ops, version, age, writer))
        return out

    # ---- the pool -----------------------------------------------------------------------------

    def pool(self, at_least: str) -> dict[str, Any]:
        obj = self.store.read_pool_object(self.pool_name, at_least)
        if obj is None:
            raise Conflict(f"kubernetes: pool {self.pool_name}: deleted")
        self.last_pool = obj
        return obj

    def write(self, ops: list[dict[str, Any]], after: dict[str, Any] | None) -> dict[str, Any]:
        """The round's one pool write: `ops` and the turn's name on the pool (`after`: the pool as `ops`
        leave it, when the round read it; None: the pool is taken to have annotations, as every pool
        written through a turn has, and a pool without them refuses the write: read, and written again)."""
        notes = (after.get("metadata") or {}).get("annotations") if after is not None else {}
        extra: list[dict[str, Any]] = []
        mark = {TURN_OF_POOL: self.name}
        if not isinstance(notes, dict):
            extra = [{"op": "test", "path": "/metadata/annotations", "value": None},
                     {"op": "add", "path": "/metadata/annotations", "value": mark}]
        elif after is None or notes.get(TURN_OF_POOL) != self.name:
            path = _pointer("metadata", "annotations", TURN_OF_POOL)
            extra = [{"op": "add", "path": path, "value": self.name}]
        obj = self.store.patch_pool_object(self.pool_name, ops + extra)
        self.last_pool = obj
        return obj
