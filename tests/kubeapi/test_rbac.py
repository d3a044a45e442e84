"""RBAC, end to end: every (verb, group, resource) the Kubernetes store and the pod source actually
issue, recorded by the API emulator while the store contract suite, the Kubernetes store tests and the
plugin/reconciler/CLI tests run (in a child pytest, PYCNI_KUBEAPI_RECORD set), per service account,
must be exactly what ipam/rbac.py declares for that role and what bundler/manifests/rbac.yaml grants:
no more (the emulator would have answered 403, and this test fails on any refusal), and no less (a
grant that no code path uses is a grant to remove). The child run takes about as long as those tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from ipam import rbac
from tests.kubeapi.emulator import RECORD_ENV, load_rbac
from tests.nsutil import REPO

ACCOUNTS = {"pycni-node": rbac.NODE, "pycni-reconciler": rbac.RECONCILER}
HERE = Path(__file__).parent


def test_the_code_issues_exactly_what_rbac_declares_and_the_manifests_grant(tmp_path: Path) -> None:
    record = tmp_path / "calls.jsonl"
    suites = [
        "tests/contract",
        "-k",
        "not real and (kubernetes or kubeapi)",  # the emulator variant of the contract, all of tests/kubeapi
        *(str(p.relative_to(REPO)) for p in sorted(HERE.glob("test_*.py")) if p.name != Path(__file__).name),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *suites],
        cwd=REPO,
        env={**os.environ, RECORD_ENV: str(record)},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = [orjson.loads(line) for line in record.read_bytes().splitlines()]
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
        declared = {(v, r.group, r.resource) for r in rbac.RULES[role] for v in r.verbs}
        granted = {(v, g, res) for g, res, v, _ in grants[account]}
        assert issued.get(account, set()) == declared == granted, (
            f"{account}: issued but not declared {sorted(issued.get(account, set()) - declared)}; "
            f"declared but never issued {sorted(declared - issued.get(account, set()))}; "
            f"granted vs declared {sorted(granted ^ declared)}"
        )
