"""The in-process emulator (tests/kubeapi/emulator.py) answers as the real kube-apiserver does, for what
the tests that stay on it rely on: the same requests go to both (the session's real server in a tenant
namespace, and an emulator), and status, reason and message must match (namespaces and
resourceVersions written as placeholders), as must what is stored: schema enforcement, pruning,
resourceVersion preconditions, list paging, DeleteOptions, authentication and RBAC refusals."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest

from ipam.model import Allocation, Pool
from ipam.store import crd
from tests.kubeapi.emulator import SA_NAMESPACE, TOKENS, Emulator
from tests.kubeup import NODE_SA, RECONCILER_SA, ApiFailure, Tenant

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
POOL = "198.51.100.0-24"
GROUP = "whereabouts.cni.cncf.io"
TOKEN_OF = {v: k for k, v in TOKENS.items()}  # emulator identity -> its token


@dataclass
class Answer:
    status: int
    reason: str
    message: str
    body: dict[str, Any]


class Side:
    """One server: the real one (a tenant namespace) or the emulator (its service accounts' namespace)."""

    def __init__(self, name: str, namespace: str, send: Any, tokens: dict[str, str]) -> None:
        self.name, self.namespace, self.send, self.tokens = name, namespace, send, tokens
        self.versions: set[str] = set()

    def path(self, resource: str = "ippools", name: str = "", group: str = GROUP, ns: str = "") -> str:
        root = f"/apis/{group}/v1alpha1" if group else "/api/v1"
        return f"{root}/namespaces/{ns or self.namespace}/{resource}" + (f"/{name}" if name else "")

    def call(self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
             who: str = "admin", auth: str | None = None) -> Answer:  # fmt: skip
        body = json.loads(json.dumps(body).replace("NAMESPACE", self.namespace)) if body is not None else None
        try:
            doc = self.send(method, path, body, query, self.tokens.get(who, ""), auth)
        except ApiFailure as e:
            detail = e.body if isinstance(e.body, dict) else {}
            return Answer(e.status, detail.get("reason", ""), self.plain(detail.get("message", "")), detail)
        rv = (doc.get("metadata") or {}).get("resourceVersion")
        if rv:
            self.versions.add(rv)
        return Answer(200, "", "", doc)

    def plain(self, message: str) -> str:
        """The message with this side's namespace and resourceVersions replaced by placeholders."""
        out = message.replace(f'"{self.namespace}"', '"NS"').replace(f":{self.namespace}:", ":NS:")
        return re.sub(r"\((\d+)\)", "(RV)", out) if "ResourceVersion" in out else out


@pytest.fixture
def sides(tenant: Tenant) -> Iterator[list[Side]]:
    server = tenant.server
    real_tokens = {"admin": server.admin_token, **{
        sa: server.token(tenant.namespace, sa) for sa in (NODE_SA, RECONCILER_SA)}}  # fmt: skip

    def real(method: str, path: str, body: Any, query: Any, token: str, auth: str | None) -> Any:
        if auth is not None:  # another Authorization header (or none): raw HTTP
            return _raw(server.url, server.ca_file, method, path, body, query, auth)
        return server.request(method, path, body, query, token=token)

    emu = Emulator()

    def fake(method: str, path: str, body: Any, query: Any, token: str, auth: str | None) -> Any:
        return _raw(emu.url, None, method, path, body, query, f"Bearer {token}" if auth is None else auth)

    emu_tokens = {who: TOKEN_OF[who] for who in ("admin", NODE_SA, RECONCILER_SA)}
    try:
        yield [
            Side("real", tenant.namespace, real, real_tokens),
            Side("emulator", SA_NAMESPACE, fake, emu_tokens),
        ]
    finally:
        emu.stop()


def _raw(url: str, ca: str | None, method: str, path: str, body: Any, query: Any, auth: str) -> Any:
    import http.client
    import ssl
    from urllib.parse import urlsplit

    u = urlsplit(url)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        context = ssl.create_default_context(cafile=ca)
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, context=context)
    else:
        conn = http.client.HTTPConnection(u.hostname or "", u.port)
    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = auth
    data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
    try:
        conn.request(method, path + ("?" + urlencode(query) if query else ""), data, headers)
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    doc = json.loads(text) if text else {}
    if resp.status >= 400:
        raise ApiFailure(resp.status, doc)
    return doc


def pool(name: str = POOL, **changes: Any) -> dict[str, Any]:
    obj = crd.pool_to_object(Pool(POOL, "198.51.100.0/24", {"1": A}), "NAMESPACE")
    obj["metadata"]["name"] = name
    for key, value in changes.items():
        obj[key] = value
    return obj


def both(
    sides: list[Side], method: str, rel: tuple[Any, ...] | str, body: Any = None,
    query: dict[str, Any] | None = None, who: str = "admin", auth: str | None = None,
) -> list[Answer]:  # fmt: skip
    out = []
    for side in sides:
        path = side.path(*rel) if isinstance(rel, tuple) else side.path(name=rel) if rel else side.path()
        out.append(side.call(method, path, copy.deepcopy(body), query, who, auth))
    return out


def same_error(answers: list[Answer], status: int, reason: str = "") -> str:
    real, emu = answers
    assert (real.status, real.reason, real.message) == (emu.status, emu.reason, emu.message), (real, emu)
    assert real.status == status and (not reason or real.reason == reason), real
    return real.message


def test_schema_enforcement_and_names(sides: list[Side]) -> None:
    good = pool()
    spec = good["spec"]
    cases: list[tuple[dict[str, Any], str]] = [
        (pool("p1", spec={"range": "198.51.100.0/24"}), "spec.allocations: Required value"),
        (pool("p2", spec={**spec, "range": 24}), "spec.range in body must be of type string"),
        (pool("p3", spec={**spec, "allocations": {"1": {"podref": "ns/a"}}}), "spec.allocations.1.id"),
        (pool("--1"), "a lowercase RFC 1123 subdomain"),
        (pool("p4", kind="Foo"), 'kind: Invalid value: "Foo": must be IPPool'),
        ({k: v for k, v in good.items() if k != "metadata"}, "name or generateName is required"),
        (pool("p5", metadata={"name": "p5", "annotations": {"a": "x" * 262145}}), "Too long"),
    ]
    for obj, fragment in cases:
        assert fragment in same_error(both(sides, "POST", "", obj), 422, "Invalid"), obj["metadata"]
    for obj, fragment in [
        (pool("p6", metadata={"name": "p6", "annotations": {"a": 1}}), "cannot unmarshal number"),
        (pool("p7", metadata={"name": "p7", "namespace": "elsewhere"}), "does not match the namespace"),
    ]:
        assert fragment in same_error(both(sides, "POST", "", obj), 400, "BadRequest")
    real, emu = both(sides, "POST", "", "not-an-object")
    assert (real.status, real.reason) == (emu.status, emu.reason) == (400, "BadRequest")
    for answer in both(sides, "GET", ""):
        assert answer.body["items"] == []  # nothing invalid was stored


def test_create_prunes_unknown_fields_and_conflicts_when_it_exists(sides: list[Side]) -> None:
    obj = pool()
    obj["spec"]["allocations"]["1"]["poduid"] = "x"
    obj["spec"]["extra"] = 1
    obj["metadata"]["bogus"] = True
    real, emu = both(sides, "POST", "", obj)
    assert real.status == emu.status == 200
    assert real.body["spec"] == emu.body["spec"] == pool()["spec"]
    for answer in (real, emu):
        meta = answer.body["metadata"]
        assert "bogus" not in meta and meta["generation"] == 1 and meta["uid"] and meta["resourceVersion"]
        assert meta["annotations"] == pool()["metadata"]["annotations"]
    same_error(both(sides, "POST", "", pool()), 409, "AlreadyExists")
    same_error(both(sides, "GET", "missing"), 404, "NotFound")


def test_update_needs_the_current_resource_version(sides: list[Side]) -> None:
    created = both(sides, "POST", "", pool())
    same_error(both(sides, "PUT", POOL, pool()), 422, "Invalid")  # no resourceVersion
    stale = pool()
    stale["metadata"]["resourceVersion"] = "1"
    same_error(both(sides, "PUT", POOL, stale), 409, "Conflict")
    other = pool("other")
    other["metadata"]["resourceVersion"] = "1"
    same_error(both(sides, "PUT", POOL, other), 400, "BadRequest")  # names differ
    same_error(both(sides, "PUT", "missing", pool("missing")), 404, "NotFound")  # no resourceVersion
    other["metadata"]["name"] = "missing"
    same_error(both(sides, "PUT", "missing", other), 404, "NotFound")
    for side, first in zip(sides, created, strict=True):
        obj = pool()
        obj["metadata"]["resourceVersion"] = first.body["metadata"]["resourceVersion"]
        obj["spec"]["allocations"]["2"] = obj["spec"]["allocations"]["1"]
        done = side.call("PUT", side.path(name=POOL), obj)
        assert done.status == 200 and set(done.body["spec"]["allocations"]) == {"1", "2"}
        meta, was = done.body["metadata"], first.body["metadata"]
        assert meta["resourceVersion"] != was["resourceVersion"] and meta["uid"] == was["uid"]
        assert meta["generation"] == 2, side.name  # the spec changed
        obj["metadata"]["resourceVersion"] = meta["resourceVersion"]
        obj["metadata"]["labels"] = {"x": "y"}
        again = side.call("PUT", side.path(name=POOL), obj)
        assert again.body["metadata"]["generation"] == 2, side.name  # only metadata changed


def test_delete_honours_preconditions(sides: list[Side]) -> None:
    created = both(sides, "POST", "", pool())
    stale = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": "1"}}
    same_error(both(sides, "DELETE", POOL, stale), 409, "Conflict")
    same_error(both(sides, "DELETE", "missing"), 404, "NotFound")
    for side, first in zip(sides, created, strict=True):
        rv = first.body["metadata"]["resourceVersion"]
        done = side.call("DELETE", side.path(name=POOL), {"preconditions": {"resourceVersion": rv}})
        assert done.status == 200 and done.body["status"] == "Success", side.name
        assert done.body["details"] == {"name": POOL, "group": GROUP, "kind": "ippools",
                                        "uid": first.body["metadata"]["uid"]}  # fmt: skip
        assert side.call("GET", side.path(name=POOL)).status == 404


def test_list_pages_with_limit_and_continue(sides: list[Side]) -> None:
    names = [f"p{i}" for i in (3, 0, 4, 1, 2)]
    for name in names:
        both(sides, "POST", "", pool(name))
    pages: dict[str, list[tuple[list[str], int | None]]] = {}
    for side in sides:
        query: dict[str, Any] = {"limit": 2}
        got = pages.setdefault(side.name, [])
        while True:
            doc = side.call("GET", side.path(), query=query).body
            names_here = [o["metadata"]["name"] for o in doc["items"]]
            got.append((names_here, doc["metadata"].get("remainingItemCount")))
            token = doc["metadata"].get("continue")
            if not token:
                break
            query = {"limit": 2, "continue": token}
    assert pages["real"] == pages["emulator"] == [(["p0", "p1"], 3), (["p2", "p3"], 1), (["p4"], None)]


def test_authentication_and_rbac_refusals(sides: list[Side]) -> None:
    same_error(both(sides, "GET", "", auth="Bearer not-a-token"), 401, "Unauthorized")
    for auth in ("", "Basic " + "dTpw"):  # no credentials, or basic (not a kube-apiserver method): anonymous
        message = same_error(both(sides, "GET", "", auth=auth), 403, "Forbidden")
        assert 'User "system:anonymous" cannot list resource "ippools"' in message
    message = same_error(both(sides, "DELETE", POOL, who=NODE_SA), 403, "Forbidden")
    assert message == (
        f'ippools.{GROUP} "{POOL}" is forbidden: User "system:serviceaccount:NS:{NODE_SA}" cannot delete '
        f'resource "ippools" in API group "{GROUP}" in the namespace "NS"'
    )
    same_error(both(sides, "POST", "", pool(), who=RECONCILER_SA), 403, "Forbidden")
    # the node's agent reads its node's pods (its pod watch: ClusterRole pycni-node), never deletes one
    same_error(both(sides, "GET", ("pods", "p", ""), who=NODE_SA), 404, "NotFound")
    same_error(both(sides, "DELETE", ("pods", "p", ""), who=NODE_SA), 403, "Forbidden")
    same_error(both(sides, "GET", ("pods", "p", ""), who=RECONCILER_SA), 404, "NotFound")
