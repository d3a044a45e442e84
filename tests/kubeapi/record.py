"""Which (verb, group, resource) the code sends through ipam.kubeapi.Client, per ServiceAccount, for
tests/kubeapi/test_rbac.py: each request as one row [account, verb, group, resource, allowed]: the
ServiceAccount its bearer token was issued for (the token's `sub`; other credentials are not recorded),
the RBAC verb of the method and path, and whether the server let it through (anything but 403). The
wrapper sits around the client's public `request` in the test process only, so requests of plugin
processes a test spawns are not seen; the real server enforces RBAC on those anyway.

Two ways to record, the same rows:
- during the normal session (tests/conftest.py installs `SESSION`): each row is kept under the node id of
  the test running when it was sent, so test_rbac.py (moved to the end of the session) checks the rows of
  exactly the tests a child run would have selected, without running them a second time;
- in a child pytest (`-p tests.kubeapi.record` with PYCNI_KUBEAPI_RECORD naming a file: rows appended
  as JSON lines), for whatever of that selection the session did not run (all of it when test_rbac.py
  runs alone).
Only tests whose requests can be recorded are selected: those on the real server through the client
(the `kube` fixture, or the contract suite's kubernetes variant), not the emulator's (its tokens name no
ServiceAccount) nor those that only spawn processes or speak raw HTTP (NOT_THROUGH_THE_CLIENT)."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipam.kubeapi import ApiError, Client

RECORD_ENV = "PYCNI_KUBEAPI_RECORD"
SA_PREFIX = "system:serviceaccount:"
NOT_THROUGH_THE_CLIENT = ("test_emulator_parity.py", "test_import_cost.py", "test_frozen_kube.py")


def account(client: Client) -> str:
    """The ServiceAccount name the client's token was issued for ("" for anything else)."""
    conf = client.conf
    token = conf.token or (Path(conf.token_file).read_text().strip() if conf.token_file else "")
    parts = token.split(".")
    if len(parts) != 3:
        return ""
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return ""
    sub = str(claims.get("sub", ""))
    return sub.rsplit(":", 1)[1] if sub.startswith(SA_PREFIX) else ""


def verb_of(method: str, path: str, query: dict[str, Any] | None) -> tuple[str, str, str]:
    """(verb, group, resource) of a request path, as RBAC names them."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":  # /api/v1/[namespaces/NS/]RESOURCE[/NAME]
        group, rest = "", parts[2:]
    else:  # /apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME]
        group, rest = parts[1], parts[3:]
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:  # a subresource: RESOURCE/NAME/SUB is RBAC's "RESOURCE/SUB"
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "watch" if (query or {}).get("watch") else "get" if named else "list"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, "")
        verb = verb or ("delete" if named else "deletecollection")
    return verb, group, resource


def _install(sink: Callable[[list[Any]], None]) -> None:
    original = Client.request

    @functools.wraps(original)
    def request(
        self: Client, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None,
        content_type: str = "",
    ) -> dict[str, Any]:
        who = account(self)
        allowed = True
        try:
            return original(self, method, path, body, query, content_type)
        except ApiError as e:
            allowed = e.status != 403
            raise
        finally:
            if who:
                sink([who, *verb_of(method, path, query), allowed])

    Client.request = request  # type: ignore[method-assign]
    original_watch = Client.watch

    @functools.wraps(original_watch)
    def watch(self: Client, path: str, query: dict[str, Any] | None = None,
              opened: Callable[[], None] | None = None) -> Iterator[dict[str, Any]]:  # fmt: skip
        who = account(self)
        allowed = True
        try:
            yield from original_watch(self, path, query, opened)
        except ApiError as e:
            allowed = e.status != 403
            raise
        finally:
            if who:
                sink([who, "watch", *verb_of("GET", path, query)[1:], allowed])

    Client.watch = watch  # type: ignore[method-assign]


def recordable(item: pytest.Item) -> bool:
    if item.nodeid.split("::")[0].endswith(NOT_THROUGH_THE_CLIENT):
        return False
    params = getattr(item, "callspec", None)
    variant = params.params.get("factory") if params is not None else None
    return "kube" in getattr(item, "fixturenames", ()) or variant == "kubernetes"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept = [i for i in items if recordable(i)]
    config.hook.pytest_deselected(items=[i for i in items if not recordable(i)])
    items[:] = kept


def _append_to(record: Path) -> Callable[[list[Any]], None]:
    def sink(row: list[Any]) -> None:
        with record.open("a") as fh:
            fh.write(json.dumps(row) + "\n")

    return sink


class SessionRecorder:
    """The rows of the normal session, per node id of the test (setup, call and teardown) during which
    they were sent; `ran`: the node ids whose whole run protocol finished."""

    def __init__(self) -> None:
        self.rows: dict[str, list[list[Any]]] = {}
        self.ran: set[str] = set()
        self.current = ""
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            _install(self._sink)
            self.installed = True

    def _sink(self, row: list[Any]) -> None:
        if self.current:
            self.rows.setdefault(self.current, []).append(row)

    @contextlib.contextmanager
    def during(self, nodeid: str) -> Iterator[None]:
        self.current = nodeid
        try:
            yield
        finally:
            self.current = ""
            self.ran.add(nodeid)


SESSION = SessionRecorder()

if os.environ.get(RECORD_ENV):
    _install(_append_to(Path(os.environ[RECORD_ENV])))
