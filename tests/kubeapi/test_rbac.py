"""RBAC, end to end, on the real kube-apiserver with bundler/manifests/rbac.yaml applied as shipped and
the node's and the reconciler's ServiceAccount tokens (tests/kubeup.py `Tenant`):

- the server lets each account do exactly what ipam/rbac.py declares for its role and refuses (403)
  everything else: every verb on every resource the IPAM could touch, in the IPAM's namespace and in
  another one (the whereabouts objects are granted by Roles, pod and IPAMClaim reads by a ClusterRole;
  the IPAMClaim CRD installed for it);
- every (verb, group, resource) the Kubernetes store and the pod source actually send, recorded per
  account while the store contract suite's kubernetes variant and tests/kubeapi run (tests/kubeapi/
  record.py wraps the client), is exactly what ipam/rbac.py declares for that role and what rbac.yaml
  grants: no more (the server refused nothing), and no less (a grant that no code path uses is a grant
  to remove). The recording is the session's own (this test runs last, tests/conftest.py); whatever of
  that selection the session did not run (all of it when this file runs alone) runs in a child pytest
  that records the same way, taking about as long as those tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ipam import rbac
from tests.kubeapi.emulator import load_rbac
from tests.kubeapi.record import RECORD_ENV, SESSION
from tests.kubeup import IPAMCLAIM_CRD, NODE_SA, RECONCILER_SA, ApiFailure, KubeServer, Tenant
from tests.nsutil import REPO

ACCOUNTS = {NODE_SA: rbac.NODE, RECONCILER_SA: rbac.RECONCILER}
HERE = Path(__file__).parent
VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
KINDS = {  # (group, resource) -> kind, for the probes' bodies
    (rbac.WHEREABOUTS, "ippools"): "IPPool",
    (rbac.WHEREABOUTS, "overlappingrangeipreservations"): "OverlappingRangeIPReservation",
    (rbac.WHEREABOUTS, "nodeslicepools"): "NodeSlicePool",
    ("", "pods"): "Pod",
    (rbac.IPAMCLAIMS, "ipamclaims"): "IPAMClaim",
    (rbac.IPAMCLAIMS, "ipamclaims/status"): "IPAMClaim",  # the status subresource: get, update, patch
}
SUBRESOURCE_VERBS = ("get", "update", "patch")
PROBE = "rbac-probe"
RECORDER = "tests.kubeapi.record"


def declared(role: str, group: str, resource: str, verb: str, home: bool) -> bool:
    """ipam/rbac.py grants this (in the IPAM's namespace when `home`, else in another one)."""
    return any(
        r.group == group and r.resource == resource and verb in r.verbs and (home or not r.namespaced)
        for r in rbac.RULES[role]
    )


def probe(tenant: Tenant, token: str, namespace: str, group: str, resource: str, verb: str) -> int:
    """Send `verb` on `resource` in `namespace` with `token`; the HTTP status (2xx: 200)."""
    root = f"/apis/{group}/v1alpha1" if group else "/api/v1"
    resource, _, sub = resource.partition("/")
    coll = f"{root}/namespaces/{namespace}/{resource}"
    body: dict[str, Any] = {
        "apiVersion": f"{group}/v1alpha1" if group else "v1", "kind": KINDS[(group, resource)],
        "metadata": {"name": PROBE},
    }  # fmt: skip
    method, path, query, content = {
        "get": ("GET", f"{coll}/{PROBE}", None, None),
        "list": ("GET", coll, None, None),
        "watch": ("GET", coll, {"watch": "true", "timeoutSeconds": "1"}, None),
        "create": ("POST", coll, None, body),
        "update": ("PUT", f"{coll}/{PROBE}", None, body),
        "patch": ("PATCH", f"{coll}/{PROBE}", None, {"metadata": {"labels": {"probe": "1"}}}),
        "delete": ("DELETE", f"{coll}/{PROBE}", None, None),
        "deletecollection": ("DELETE", coll, {"labelSelector": "probe=none"}, None),
    }[verb]
    if sub:
        path = f"{coll}/{PROBE}/{sub}"
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    try:
        tenant.server.request(method, path, content, query, token=token, content_type=content_type, raw=True)
    except ApiFailure as e:
        return e.status
    return 200


def test_the_server_allows_each_account_exactly_what_is_declared(tenant: Tenant) -> None:
    tenant.server.install_crd(IPAMCLAIM_CRD)  # kube-up does not (tests/kubeapi/test_ipamclaim.py)
    wrong = []
    allowed_somewhere = set()
    for account, role in ACCOUNTS.items():
        token = tenant.server.token(tenant.namespace, account)
        for namespace, home in ((tenant.namespace, True), ("default", False)):
            for group, resource in KINDS:
                for verb in SUBRESOURCE_VERBS if "/" in resource else VERBS:
                    status = probe(tenant, token, namespace, group, resource, verb)
                    want = declared(role, group, resource, verb, home)
                    if (status != 403) != want:
                        wrong.append((account, namespace, verb, group or "core", resource, status))
                    if want:
                        allowed_somewhere.add((account, verb, resource))
    assert wrong == [], f"(account, namespace, verb, group, resource, status) against ipam/rbac.py: {wrong}"
    # the probes did see both answers: some of each account's requests went through
    assert {a for a, _, _ in allowed_somewhere} == set(ACCOUNTS)
    assert (NODE_SA, "create", "ippools") in allowed_somewhere
    assert (RECONCILER_SA, "get", "pods") in allowed_somewhere


def child(*args: str, record: Path | None = None) -> subprocess.CompletedProcess[str]:
    """pytest with the recorder plugin (tests/kubeapi/record.py: it keeps only recordable tests), in
    the repository, recording into `record` when given."""
    env = {**os.environ, **({RECORD_ENV: str(record)} if record else {})}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", RECORDER, *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )


def selection() -> list[str]:
    """The node ids of the tests whose requests are checked: the contract suite's kubernetes variant and
    tests/kubeapi but this file, as far as the recorder can see them (record.py `recordable`)."""
    suites = [
        "tests/contract",
        "-k",
        "(kubernetes or kubeapi) and not real",  # the contract suite's kubernetes variant, tests/kubeapi
        *(str(p.relative_to(REPO)) for p in sorted(HERE.glob("test_*.py")) if p.name != Path(__file__).name),
    ]
    proc = child("--collect-only", *suites)
    assert proc.returncode == 0, proc.stdout[-3000:]
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids, proc.stdout[-3000:]
    return ids


def test_the_code_sends_exactly_what_rbac_declares_and_the_manifests_grant(
    kube: KubeServer, tmp_path: Path
) -> None:
    """(`kube`: skipped, saying why, where the real server cannot run; the child starts its own.)"""
    ids = selection()
    rows = [row for nodeid in ids for row in SESSION.rows.get(nodeid, [])]
    missing = [nodeid for nodeid in ids if nodeid not in SESSION.ran]
    print(f"\nrbac: {len(ids) - len(missing)} of {len(ids)} recorded tests ran in this session, "
          f"{len(missing)} in a child run")
    if missing:
        record = tmp_path / "calls.jsonl"
        proc = child(*missing, record=record)
        assert proc.returncode == 0, proc.stdout[-3000:]
        rows += [json.loads(line) for line in record.read_text().splitlines()]
    issued: dict[str, set[tuple[str, str, str]]] = {}
    refused = set()
    for who, verb, group, resource, allowed in rows:
        if who in ACCOUNTS:
            issued.setdefault(who, set()).add((verb, group, resource))
            if not allowed:
                refused.add((who, verb, group, resource))
    assert not refused, f"the code made requests its service account may not: {sorted(refused)}"
    grants = load_rbac()
    for account, role in ACCOUNTS.items():
        declared_set = {(v, r.group, r.resource) for r in rbac.RULES[role] for v in r.verbs}
        granted = {(v, g, res) for g, res, v, _ in grants[account]}
        assert issued.get(account, set()) == declared_set == granted, (
            f"{account}: issued but not declared {sorted(issued.get(account, set()) - declared_set)}; "
            f"declared but never issued {sorted(declared_set - issued.get(account, set()))}; "
            f"granted vs declared {sorted(granted ^ declared_set)}"
        )
