"""An in-process Kubernetes API server for the tests: threaded HTTP(S) on 127.0.0.1 and a free port.

It serves the CRDs in bundler/manifests/crds (namespaced paths, the version marked served) with their
openAPIV3 schemas enforced as an API server does: a value of the wrong type or a missing required
field is 422 Invalid, unknown fields are pruned (metadata too), names must be DNS subdomains, the
annotations of one object stay under 256 KiB. resourceVersion is one counter across all objects,
bumped on every write; PUT with a stale resourceVersion and POST of an existing name are 409; PUT
without a resourceVersion is 422 (as for custom resources); DELETE honours preconditions. Lists take
`limit` and `continue`. Pods are a settable table answering GET. Namespaces can be created and
deleted (for the real-cluster fixture code), CRDs read.

Authentication: bearer tokens (`tokens`: token -> identity) or, over TLS, a client certificate (its
CN is the identity); anything else is 401. Identities named after a service account of
bundler/manifests/rbac.yaml get exactly what its Roles and ClusterRoles grant (403 otherwise);
"admin" gets everything. Every request is recorded as (identity, verb, group, resource) in `calls`;
refused ones in `forbidden`. (The RBAC test records the code's requests on the real server:
tests/kubeapi/record.py.)

Faults: `fail(kind, n)` makes the next n requests answer 500, 503, 409, hang past the client's
timeout ("timeout"), or drop the connection ("reset")."""

from __future__ import annotations

import base64
import itertools
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
import yaml

from tests.nsutil import REPO

MANIFESTS = REPO / "bundler" / "manifests"
CRDS = MANIFESTS / "crds"
SA_NAMESPACE = "pycni-system"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
META_FIELDS = {
    "name", "generateName", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
    "finalizers", "managedFields", "selfLink",
}  # fmt: skip
ANNOTATIONS_MAX = 256 * 1024
ANONYMOUS = "system:anonymous"
# identities: the two service accounts of bundler/manifests/rbac.yaml, and an unrestricted admin
TOKENS = {"admin-token": "admin", "node-token": "pycni-node", "reconciler-token": "pycni-reconciler",
          "nobody-token": "nobody"}  # fmt: skip


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    schema: dict[str, Any]
    check: Check


def load_crds() -> dict[tuple[str, str, str], Kind]:
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            assert spec["scope"] == "Namespaced", path
            for v in spec["versions"]:
                if v.get("served"):
                    schema = v["schema"]["openAPIV3Schema"]
                    kind = Kind(spec["group"], v["name"], spec["names"]["plural"], spec["names"]["kind"],
                                schema, compile_schema(schema))  # fmt: skip
                    out[(kind.group, kind.version, kind.plural)] = kind
    return out


def load_rbac() -> dict[str, set[tuple[str, str, str, bool]]]:
    """Service account -> {(group, resource, verb, namespaced)} from bundler/manifests/rbac.yaml."""
    docs = [d for d in yaml.safe_load_all((MANIFESTS / "rbac.yaml").read_text()) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: dict[str, set[tuple[str, str, str, bool]]] = {}
    for b in docs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        role = roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]
        for s in b["subjects"]:
            if s["kind"] != "ServiceAccount":
                continue
            granted = out.setdefault(s["name"], set())
            for rule in role["rules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        granted |= {(g, r, v, role["kind"] == "Role") for v in rule["verbs"]}
    return out


class Invalid(Exception):
    pass


Check = Callable[[Any, str], Any]
def json_type(value: Any) -> str:
    """The OpenAPI name of a decoded JSON value's type, as the API server's messages spell it."""
    if value is None:
        return "null"
    for name, kinds in (("boolean", (bool,)), ("integer", (int,)), ("number", (float,)), ("string", (str,)),
                        ("object", (dict,)), ("array", (list,))):  # fmt: skip
        if isinstance(value, kinds):
            return name
    return type(value).__name__


def type_error(path: str, value: Any, want: str) -> Invalid:
    actual = json_type(value)
    return Invalid(f'{path}: Invalid value: "{actual}": {path} in body must be of type {want}: "{actual}"')


TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "number": (int, float),
}


def compile_schema(schema: dict[str, Any]) -> Check:
    """A structural schema as a function (value, path) -> the value with unknown fields pruned, raising
    Invalid when it does not fit. Compiled once per CRD: pools of 100,000 entries are checked per write."""
    kind = schema.get("type")
    if kind == "object":
        props = {k: compile_schema(v) for k, v in (schema.get("properties") or {}).items()}
        has_props = schema.get("properties") is not None
        extra_schema = schema.get("additionalProperties")
        extra = compile_schema(extra_schema) if isinstance(extra_schema, dict) else None
        keep = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or (not has_props and extra is None)
        required = tuple(schema.get("required", ()))

        def check_object(value: Any, path: str) -> Any:
            if not isinstance(value, dict):
                raise type_error(path, value, "object")
            out = {}
            for key, item in value.items():
                sub = props.get(key)
                if sub is not None:
                    out[key] = sub(item, f"{path}.{key}" if path else key)
                elif extra is not None:
                    out[key] = extra(item, f"{path}.{key}" if path else key)
                elif keep:
                    out[key] = item
            for key in required:
                if key not in out:
                    raise Invalid(f"{path + '.' if path else ''}{key}: Required value")
            return out

        return check_object
    if kind == "array":
        items = compile_schema(schema.get("items") or {})

        def check_array(value: Any, path: str) -> Any:
            if not isinstance(value, list):
                raise type_error(path, value, "array")
            return [items(v, f"{path}[{i}]") for i, v in enumerate(value)]

        return check_array
    types = TYPES.get(str(kind))
    if types is None:
        return lambda value, path: value

    def check_scalar(value: Any, path: str) -> Any:
        if not isinstance(value, types) or (isinstance(value, bool) and kind != "boolean"):
            raise type_error(path, value, str(kind))
        return value

    return check_scalar


def validate(value: Any, schema: dict[str, Any], path: str) -> Any:
    """The value with unknown fields pruned; Invalid if it does not fit the structural schema."""
    return compile_schema(schema)(value, path)


PATCH_REJECTED = "the server rejected our request due to an error in our request"


def _json_patch_op(doc: Any, op: dict[str, Any]) -> None:
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
    where = doc
    for p in parents:
        where = where[p]
    if not isinstance(where, dict):
        raise TypeError(op["path"])
    kind = op["op"]
    if kind == "test":
        if where.get(last) != op["value"]:
            raise ValueError(op["path"])
    elif kind == "add":
        where[last] = op["value"]
    elif kind == "remove":
        del where[last]
    elif kind == "replace":
        if last not in where:
            raise KeyError(last)
        where[last] = op["value"]
    else:
        raise ValueError(kind)


class Reply(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip


class Emulator:
    def __init__(self, tls: Path | None = None, rbac: bool = True) -> None:
        self.kinds = load_crds()
        self.grants = load_rbac() if rbac else None
        self.objects: dict[
            tuple[str, str, str], dict[str, dict[str, Any]]
        ] = {}  # (plural, ns) -> name -> obj
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.namespaces: set[str] = {"default", "kube-system", SA_NAMESPACE}
        self.tokens: dict[str, str] = dict(TOKENS)
        self.calls: set[tuple[str, str, str, str]] = set()  # (identity, verb, group, resource) granted
        self.forbidden: set[tuple[str, str, str, str]] = set()  # and refused (403)
        self.requests = 0
        self.lock = threading.Lock()
        self._rv = itertools.count(1000)
        self._faults: list[tuple[str, str, str]] = []  # (kind, path part, method): "" matches any
        self.stall = 5.0  # seconds a "timeout" fault holds the request
        self.pki = tls
        handler = type("Handler", (_Handler,), {"emu": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
        self.server.request_queue_size = 1024
        self.server.daemon_threads = True
        self.server.allow_reuse_address = True
        self.server.server_bind()
        self.server.server_activate()
        if tls is not None:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(tls / "server.crt", tls / "server.key")
            ctx.load_verify_locations(tls / "ca.crt")
            ctx.verify_mode = ssl.CERT_OPTIONAL
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True, name="kubeapi"
        )
        self._thread.start()

    # ---- test controls ----------------------------------------------------------------------------

    def fail(self, kind: str, n: int = 1, resource: str = "", method: str = "") -> None:
        """The next n requests (for `resource` and of `method` only, when given) fail this way."""
        assert kind in ("500", "503", "409", "timeout", "reset"), kind
        with self.lock:
            self._faults.extend([(kind, resource, method)] * n)

    def clear_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def set_pod(self, namespace: str, name: str, uid: str = "") -> None:
        with self.lock:
            self.pods[(namespace, name)] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
            }  # fmt: skip

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            self.pods.pop((namespace, name), None)

    def kubeconfig(
        self,
        path: Path,
        token: str = "admin-token",
        namespace: str = SA_NAMESPACE,
        token_file: Path | None = None,
        client_cert: str = "",
        server: str = "",
    ) -> Path:
        """Write a kubeconfig (0600) for this server: a token, a token file, or (TLS) a client
        certificate `client_cert` made by make_pki."""
        user: dict[str, Any] = {}
        if token_file is not None:
            user["tokenFile"] = str(token_file)
        elif client_cert:
            assert self.pki is not None
            user["client-certificate-data"] = _b64(self.pki / f"{client_cert}.crt")
            user["client-key-data"] = _b64(self.pki / f"{client_cert}.key")
        elif token:
            user["token"] = token
        cluster: dict[str, Any] = {"server": server or self.url}
        if self.pki is not None:
            cluster["certificate-authority"] = str(self.pki / "ca.crt")
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "emu", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "test",
                          "context": {"cluster": "emu", "user": "u", "namespace": namespace}}],
        }  # fmt: skip
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(orjson.dumps(doc))
        return path

    def count(self, plural: str, namespace: str = SA_NAMESPACE) -> int:
        with self.lock:
            return len(self.objects.get(("", plural, namespace), {}))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- serving ----------------------------------------------------------------------------------

    def _next_fault(self, method: str, path: str) -> str:
        parts = urlsplit(path).path.split("/")
        with self.lock:
            for i, (kind, resource, only) in enumerate(self._faults):
                if (not resource or resource in parts) and (not only or only == method):
                    del self._faults[i]
                    return kind
        return ""

    def _record(self, who: str, verb: str, group: str, resource: str, allowed: bool) -> None:
        key = (who, verb, group, resource)
        with self.lock:
            self.requests += 1
            seen = self.calls if allowed else self.forbidden
            if key in seen:
                return
            seen.add(key)

    def _authorize(
        self, who: str, verb: str, group: str, resource: str, namespace: str, name: str = ""
    ) -> None:
        """RBAC: a ClusterRole grant anywhere, a Role grant in the service accounts' namespace."""
        ok = who == "admin" or self.grants is None
        if not ok:
            assert self.grants is not None
            granted = self.grants.get(who, set())
            ok = (group, resource, verb, False) in granted or (
                namespace == SA_NAMESPACE and (group, resource, verb, True) in granted
            )
        self._record(who, verb, group, resource, ok)
        if not ok:
            user = who if who.startswith("system:") else f"system:serviceaccount:{SA_NAMESPACE}:{who}"
            what = f"{resource}.{group}" if group else resource
            where = f' in the namespace "{namespace}"' if namespace else ""
            raise Reply(
                403,
                "Forbidden",
                f'{what}{f" {chr(34)}{name}{chr(34)}" if name else ""} is forbidden: User "{user}" cannot '
                f'{verb} resource "{resource}" in API group "{group}"{where}',
            )

    def handle(self, method: str, target: str, who: str, body: bytes) -> tuple[int, dict[str, Any]]:
        url = urlsplit(target)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if parts[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise Reply(404, "NotFound", f"the server could not find the requested resource {url.path}")
        if group == "apiextensions.k8s.io" and rest[:1] == ["customresourcedefinitions"]:
            return self._crd(method, who, rest[1:])
        if group == "" and rest[:1] == ["namespaces"] and len(rest) <= 2:
            return self._namespace(method, who, rest[1:], body)
        if len(rest) < 3 or rest[0] != "namespaces":
            raise Reply(404, "NotFound", f"the server could not find the requested resource {url.path}")
        namespace, resource, name = rest[1], rest[2], rest[3] if len(rest) > 3 else ""
        verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "DELETE": "delete",
                "PATCH": "patch"}.get(method)
        if verb is None or (verb == "create" and name):
            raise Reply(405, "MethodNotAllowed", f"{method} is not supported here")
        self._authorize(who, verb, group, resource, namespace, name)
        if group == "" and resource == "pods" and verb == "get":
            with self.lock:
                pod = self.pods.get((namespace, name))
            if pod is None:
                raise Reply(404, "NotFound", f'pods "{name}" not found')
            return 200, pod
        kind = self.kinds.get((group, version, resource))
        if kind is None:
            raise Reply(404, "NotFound", f"the server could not find the requested resource {url.path}")
        with self.lock:
            if namespace not in self.namespaces and verb == "create":
                raise Reply(404, "NotFound", f'namespaces "{namespace}" not found')
        if verb == "list":
            return 200, self._list(kind, namespace, query)
        if verb == "get":
            with self.lock:
                obj = self.objects.get(("", resource, namespace), {}).get(name)
            if obj is None:
                raise Reply(404, "NotFound", f'{resource}.{group} "{name}" not found')
            return 200, obj
        if verb == "delete":
            return self._delete(kind, namespace, name, body)
        if verb == "patch":
            return self._patch(kind, namespace, name, body)
        return self._write(kind, namespace, name, verb, body)

    def _patch(self, kind: Kind, namespace: str, name: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """A JSON Patch (RFC 6902: test, add, remove, replace) applied to the object as it is, as the
        real server does (no resourceVersion: no conflict with other writers; a failed op is 422 with
        the server's generic text; `test` of null passes on a missing path, as in evanphx/json-patch)."""
        while True:  # the server retries a patch on a concurrent write itself
            with self.lock:
                current = self.objects.get(("", kind.plural, namespace), {}).get(name)
                if current is None:
                    raise Reply(404, "NotFound", f'{kind.plural}.{kind.group} "{name}" not found')
                doc = orjson.loads(orjson.dumps(current))
            try:
                for op in orjson.loads(body):
                    _json_patch_op(doc, op)
            except (KeyError, IndexError, TypeError, ValueError):
                raise Reply(422, "Invalid", PATCH_REJECTED) from None
            try:
                return self._write(kind, namespace, name, "update", orjson.dumps(doc))
            except Reply as e:
                if e.code != 409:
                    raise

    def _list(self, kind: Kind, namespace: str, query: dict[str, str]) -> dict[str, Any]:
        limit = int(query.get("limit") or 0)
        after = base64.urlsafe_b64decode(query["continue"]).decode() if query.get("continue") else ""
        with self.lock:
            table = self.objects.get(("", kind.plural, namespace), {})
            names = sorted(n for n in table if n > after)
            take = names[:limit] if limit else names
            items = [table[n] for n in take]
            rv = str(next(self._rv))
        meta: dict[str, Any] = {"resourceVersion": rv}
        if limit and len(names) > limit:
            meta["continue"] = base64.urlsafe_b64encode(take[-1].encode()).decode()
            meta["remainingItemCount"] = len(names) - limit
        return {"apiVersion": f"{kind.group}/{kind.version}", "kind": f"{kind.kind}List", "metadata": meta,
                "items": items}  # fmt: skip

    def _decode(self, kind: Kind, namespace: str, name: str, body: bytes) -> dict[str, Any]:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise Reply(400, "BadRequest", f"malformed JSON: {e}") from None
        if not isinstance(obj, dict):
            raise Reply(
                400, "BadRequest", f"the object provided is unrecognized (must be of type {kind.kind})"
            )
        if obj.get("apiVersion") != f"{kind.group}/{kind.version}":
            raise Reply(400, "BadRequest", f"the API version in the data ({obj.get('apiVersion')}) does not "
                        f"match the expected API version ({kind.group}/{kind.version})")  # fmt: skip
        meta = obj.get("metadata") or {}
        if not isinstance(meta, dict):
            raise Reply(400, "BadRequest", f'{kind.kind} in version "{kind.version}" cannot be handled as a '
                        f"{kind.kind}: json: cannot unmarshal {_go_type(meta)} into Go struct field "
                        f"{kind.kind}.metadata of type v1.ObjectMeta")  # fmt: skip
        notes = meta.get("annotations") or {}
        for value in notes.values() if isinstance(notes, dict) else ():
            if not isinstance(value, str):
                raise Reply(400, "BadRequest", f'{kind.kind} in version "{kind.version}" cannot be '
                            f"handled as a {kind.kind}: json: cannot unmarshal {_go_type(value)} into Go "
                            "struct field ObjectMeta.annotations of type string")  # fmt: skip
        meta = {k: v for k, v in meta.items() if k in META_FIELDS}
        oname = meta.get("name", "")
        if meta.get("namespace", namespace) != namespace:
            raise Reply(400, "BadRequest", "the namespace of the provided object does not match the "
                        "namespace sent on the request")  # fmt: skip
        if name and oname != name:
            raise Reply(400, "BadRequest",
                        f"the name of the object ({oname}) does not match the name on the URL ({name})")
        invalid = f'{obj.get("kind") or kind.kind}.{kind.group} "{oname}" is invalid: '
        if obj.get("kind") != kind.kind:
            got = obj.get("kind")
            raise Reply(422, "Invalid", f'{invalid}kind: Invalid value: "{got}": must be {kind.kind}')
        if not oname:
            raise Reply(
                422, "Invalid", f"{invalid}metadata.name: Required value: name or generateName is required"
            )
        if not isinstance(oname, str) or len(oname) > 253 or not NAME.match(oname):
            raise Reply(
                422,
                "Invalid",
                f'{invalid}metadata.name: Invalid value: "{oname}": a lowercase RFC 1123 subdomain must '
                "consist of lower case alphanumeric characters, '-' or '.', and must start and end with an "
                "alphanumeric character (e.g. 'example.com', regex used for validation is "
                "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
            )
        if sum(len(k) + len(v) for k, v in notes.items()) > ANNOTATIONS_MAX:
            raise Reply(422, "Invalid", f"{invalid}metadata.annotations: Too long: may not be more than "
                        f"{ANNOTATIONS_MAX} bytes")  # fmt: skip
        rest = {k: v for k, v in obj.items() if k != "metadata"}
        try:
            pruned = kind.check(rest, "")
        except Invalid as e:
            raise Reply(422, "Invalid", f'{kind.kind}.{kind.group} "{oname}" is invalid: {e}') from None
        pruned["metadata"] = {**meta, "namespace": namespace}
        return pruned

    def _write(
        self, kind: Kind, namespace: str, name: str, verb: str, body: bytes
    ) -> tuple[int, dict[str, Any]]:
        obj = self._decode(kind, namespace, name, body)
        meta = obj["metadata"]
        name = meta["name"]
        with self.lock:
            table = self.objects.setdefault(("", kind.plural, namespace), {})
            current = table.get(name)
            if verb == "create":
                if current is not None:
                    raise Reply(409, "AlreadyExists", f'{kind.plural}.{kind.group} "{name}" already exists')
                meta.pop("resourceVersion", None)
                meta.update(uid=str(uuid.uuid4()), generation=1,
                            creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip
                code = 201
            else:
                if current is None:
                    raise Reply(404, "NotFound", f'{kind.plural}.{kind.group} "{name}" not found')
                want = meta.get("resourceVersion")
                if not want:
                    raise Reply(
                        422,
                        "Invalid",
                        f'{kind.plural}.{kind.group} "{name}" is invalid: '
                        "metadata.resourceVersion: Invalid value: 0: must be specified for an update",
                    )
                cm = current["metadata"]
                if want != cm["resourceVersion"]:
                    raise Reply(
                        409,
                        "Conflict",
                        f"Operation cannot be fulfilled on {kind.plural}.{kind.group} "
                        f'"{name}": the object has been modified; please apply your changes to the '
                        "latest version and try again",
                    )
                for keep in ("uid", "creationTimestamp", "generation"):
                    meta[keep] = cm.get(keep)
                if {k: v for k, v in obj.items() if k != "metadata"} != {
                    k: v for k, v in current.items() if k != "metadata"
                }:
                    meta["generation"] = int(cm.get("generation") or 1) + 1  # no status subresource
                if "managedFields" not in meta and "managedFields" in cm:
                    meta["managedFields"] = cm["managedFields"]
                if meta.get("managedFields") == [{}]:  # the documented way to strip them
                    del meta["managedFields"]
                code = 200
            meta["resourceVersion"] = str(next(self._rv))
            table[name] = obj
        return code, obj

    def _delete(self, kind: Kind, namespace: str, name: str, body: bytes) -> tuple[int, dict[str, Any]]:
        options = orjson.loads(body) if body.strip() else {}
        want = ((options or {}).get("preconditions") or {}).get("resourceVersion")
        with self.lock:
            table = self.objects.get(("", kind.plural, namespace), {})
            current = table.get(name)
            if current is None:
                raise Reply(404, "NotFound", f'{kind.plural}.{kind.group} "{name}" not found')
            if want and want != current["metadata"]["resourceVersion"]:
                raise Reply(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.kind}.{kind.group} "{name}": the '
                    f"ResourceVersion in the precondition ({want}) does not match the ResourceVersion in "
                    f"record ({current['metadata']['resourceVersion']}). The object might have been modified",
                )
            del table[name]
            next(self._rv)
        details = {"name": name, "group": kind.group, "kind": kind.plural, "uid": current["metadata"]["uid"]}
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                     "details": details}  # fmt: skip

    def _crd(self, method: str, who: str, rest: list[str]) -> tuple[int, dict[str, Any]]:
        verb = "get" if method == "GET" and rest else "list" if method == "GET" else "create"
        self._authorize(who, verb, "apiextensions.k8s.io", "customresourcedefinitions", "")
        names = {f"{k.plural}.{k.group}" for k in self.kinds.values()}
        if rest and rest[0] not in names:
            raise Reply(404, "NotFound", f'customresourcedefinitions "{rest[0]}" not found')
        if method == "POST":
            raise Reply(409, "AlreadyExists", "the emulator serves its CRDs from bundler/manifests/crds")
        return 200, {"kind": "CustomResourceDefinition", "metadata": {"name": rest[0] if rest else ""}}

    def _namespace(self, method: str, who: str, rest: list[str], body: bytes) -> tuple[int, dict[str, Any]]:
        verb = {"GET": "get", "POST": "create", "DELETE": "delete"}.get(method, "")
        self._authorize(who, verb, "", "namespaces", "")
        if method == "POST":
            meta = orjson.loads(body).get("metadata") or {}
            name = meta.get("name") or (meta.get("generateName", "ns-") + uuid.uuid4().hex[:5])
            with self.lock:
                if name in self.namespaces:
                    raise Reply(409, "AlreadyExists", f'namespaces "{name}" already exists')
                self.namespaces.add(name)
            return 201, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}}
        name = rest[0] if rest else ""
        with self.lock:
            if name not in self.namespaces:
                raise Reply(404, "NotFound", f'namespaces "{name}" not found')
            if method == "DELETE":
                self.namespaces.discard(name)
                for key in [k for k in self.objects if k[2] == name]:
                    del self.objects[key]
        return 200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}}


class _Handler(BaseHTTPRequestHandler):
    emu: Emulator
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _identity(self) -> str:
        """Who is asking: a known bearer token's identity ("" for an unknown token: 401), a client
        certificate's CN, else the anonymous user (kube-apiserver has no basic authentication: such a
        header is ignored), whom RBAC refuses everything."""
        auth = self.headers.get("Authorization", "")
        if auth.startswith("Bearer "):
            return self.emu.tokens.get(auth[7:], "")
        if isinstance(self.connection, ssl.SSLSocket):
            cert = self.connection.getpeercert()
            for rdn in (cert or {}).get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        return str(value)
        return ANONYMOUS

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        fault = self.emu._next_fault(self.command, self.path)
        if fault == "reset":
            self.close_connection = True
            with _quiet():
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "timeout":
            time.sleep(self.emu.stall)
            self.close_connection = True
            return
        try:
            if fault in ("500", "503"):
                raise Reply(int(fault), "InternalError", "injected fault")
            if fault == "409":
                raise Reply(409, "Conflict", "injected conflict")
            who = self._identity()
            if not who:
                raise Reply(401, "Unauthorized", "Unauthorized")
            code, doc = self.emu.handle(self.command, self.path, who, body)
        except Reply as r:
            code, doc = r.code, status(r.code, r.reason, r.message)
        data = orjson.dumps(doc)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


def _go_type(value: Any) -> str:
    """How Go's encoding/json names a JSON value's type in an unmarshal error."""
    return {bool: "bool", int: "number", float: "number", str: "string", dict: "object", list: "array"}.get(
        type(value), "null"
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def make_pki(directory: Path, clients: tuple[str, ...] = ("pycni-node",)) -> Path:
    """A CA, a server certificate for 127.0.0.1, and one client certificate per name (CN = name)."""
    directory.mkdir(parents=True, exist_ok=True)

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=pycni-test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name, ext in (("server", ["-extfile", "san.ext"]), *((c, []) for c in clients)):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
            "-out", f"{name}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.crt", *ext)  # fmt: skip
    for p in directory.iterdir():
        p.chmod(0o600)
    return directory


def free_port() -> int:
    """A port nothing listens on (for unreachable kubeconfigs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
