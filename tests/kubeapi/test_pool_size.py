"""A pool grown to what etcd can hold, on the session's real kube-apiserver (etcd as kube-up starts it, with
etcd's default --max-request-bytes of 1.5 MiB): pycni refuses an ADD that would take the pool past
crd.SIZE_LIMIT, to the byte, with a final code 100 naming the pool and what to do; a DEL still frees and
makes room; the server itself takes the 128 largest entries a combined write may add past that limit and
refuses a write at etcd's limit, so the threshold sits below what the server refuses; and a write the
server refuses as too large is a final error, not a retried outage (docs/ipam.md "Pool size limit").

The pool is filled by writing its object as admin (Tenant.write_pool), not by thousands of ADDs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import CniError, Code
from ipam.model import Allocation, PoolUpdate
from ipam.store import crd
from ipam.store.base import StoreUnavailable
from tests.concurrency.harness import Att, base_conf
from tests.kubeapi.factory import open_kube
from tests.kubeup import ApiFailure, Tenant
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO, plugin_command

RANGE, POOL = "198.18.0.0/15", "198.18.0.0-15"


def plugin(cmd: str, conf: dict[str, Any], att: Att) -> tuple[int, Any]:
    """One whereabouts call as a plugin process (frozen in the frozen passes; through the session's agent
    in the agent pass): its exit code and its JSON answer."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(att.env(cmd), PYTHONPATH=PYTHONPATH)
    p = subprocess.run(plugin_command("whereabouts"), input=jsonio.dumps(conf), env=env, cwd=REPO,
                       capture_output=True, timeout=120, check=False)  # fmt: skip
    return p.returncode, jsonio.loads(p.stdout) if p.stdout.strip() else p.stderr.decode()[-2000:]


def entry(k: int, ns: str, pad: int = 0) -> dict[str, str]:
    """Entry `k` of the fill: a container id, a pod reference and an interface as the kubelet passes them."""
    return {"id": f"{k:064x}", "podref": f"{ns}/web-{k:05d}-x2x4k" + "x" * pad, "ifname": "net1"}


def fill(tenant: Tenant, size: int) -> tuple[dict[str, Any], int]:
    """The pool written as admin with entries 1..n, the first's pod name padded so that the object is
    exactly `size` bytes as the server answers it: (its entries, its size)."""
    ns = tenant.namespace
    one = len(jsonio.dumps({"10000": entry(10000, ns)})) + 1
    n = (size - 1000) // one
    entries = {str(k): entry(k, ns) for k in range(1, n + 1)}
    got = tenant.write_pool(POOL, RANGE, entries)
    entries["1"] = entry(1, ns, pad=size - got)
    return entries, tenant.write_pool(POOL, RANGE, entries)


def test_a_pool_at_the_limit_refuses_adds_and_still_frees(tenant: Tenant, tmp_path: Path) -> None:
    target = {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(tenant.node)}}
    conf = base_conf("blue", target, tmp_path, range=RANGE)
    new = Att("ab" * 32, "net1", f"{tenant.namespace}/web-new-x2x4k")
    grows = crd.entry_bytes(Allocation(new.cid, new.pod, new.ifname))  # a lean entry (overlapping on)
    entries, size = fill(tenant, crd.SIZE_LIMIT - grows + 1)  # one byte too many for the new entry
    assert size == crd.SIZE_LIMIT - grows + 1
    path = tenant.path("ippools", POOL)
    assert len(tenant.server.request("GET", path, raw=True).encode()) == size  # what a reader is answered
    before = tenant.server.request("GET", path)["metadata"]["resourceVersion"]

    rc, out = plugin("ADD", conf, new)
    assert rc != 0, out
    assert out["code"] == Code.POOL_EXHAUSTED, out
    text = f"{out['msg']}: {out.get('details', '')}"
    for part in (f"pool {POOL}", f"{len(entries)} entries", f"{size:,} bytes", f"{crd.SIZE_LIMIT:,} bytes",
                 "smaller range", "node_slice_size", "docs/ipam.md#pool-size-limit"):  # fmt: skip
        assert part in text, (part, out)
    assert tenant.server.request("GET", path)["metadata"]["resourceVersion"] == before  # not written
    assert tenant.reservations() == {}  # refused before its reservation

    # DEL always works (it shrinks the pool), and makes room for the ADD
    old = Att(entries["2"]["id"], "net1", entries["2"]["podref"])
    rc, out = plugin("DEL", conf, old)
    assert rc == 0, out
    rc, out = plugin("ADD", conf, new)
    assert rc == 0, out
    held = tenant.pools()[POOL]
    assert held["2"]["id"] == new.cid and len(held) == len(entries)  # the address the DEL freed

    # the server takes what a combined write may add past the limit: 128 entries of the largest pod
    # reference there is (a 63-character namespace, a 253-character name) and a 15-character interface
    largest = {"id": "f" * 64, "podref": "n" * 63 + "/" + "p" * 253, "ifname": "i" * 15}
    stored = tenant.pools()[POOL]
    big = {**stored, **{str(100000 + i): largest for i in range(128)}}
    grown = tenant.write_pool(POOL, RANGE, big)
    assert grown > crd.SIZE_LIMIT + 128 * len(jsonio.dumps(largest))
    # ... and refuses a write at etcd's limit: 500, "etcdserver: request is too large"
    at_limit = dict(big)
    at_limit["100000"] = {**largest, "podref": largest["podref"] + "x" * (crd.STORE_LIMIT - grown)}
    with pytest.raises(ApiFailure) as refused:
        tenant.write_pool(POOL, RANGE, at_limit)
    assert refused.value.status == 500 and "etcdserver: request is too large" in str(refused.value.body)

    # a write of ours that the server refuses as too large is final (code 100), not a retried outage
    store = open_kube(tenant.node)
    try:
        pool = store.get_pool(POOL)
        assert pool is not None
        giant = Allocation("cd" * 32, f"{tenant.namespace}/" + "g" * (crd.STORE_LIMIT - grown), "net1")
        with pytest.raises(CniError) as final:
            store.commit_pool(pool, PoolUpdate(put={"131000": giant}))
        assert final.value.code == Code.POOL_EXHAUSTED and not isinstance(final.value, StoreUnavailable)
        assert "etcdserver: request is too large" in str(final.value)  # (the retry policy retries only
        # conflicts, a busy and an unavailable store: ipam.retry)
    finally:
        store.close()
