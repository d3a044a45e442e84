"""IPAMClaim support without a server (the real kube-apiserver runs it in tests/kubeapi/test_ipamclaim.py):
which selection element an attachment is (as Multus names interfaces), the owner a claim's entries carry,
`allowPersistentIPs` validated, what the claim watch makes of each kind of event, and how the reconciler
judges a claim's entries."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import pytest

from cni import faults, jsonio, skel
from cni.errors import Code, ConfigError
from ipam import claims
from ipam.claimref import ClaimRef, claim_of, claim_owner
from ipam.claimwatch import ClaimSweep, ClaimWatch, Records
from ipam.model import Allocation, Pool, PoolUpdate
from ipam.podsource import PodInfo, PodSourceError
from ipam.reconciler import Reconciler
from tests.memstore import Backend, MemoryStore

REF = ClaimRef("ns", "vm-a.tenantred", "1b4e28ba-2fa1-11d2-883f-0016d3cca427")


# ---- the selection element ------------------------------------------------------------------------------


def networks(*elements: dict[str, Any]) -> str:
    return jsonio.dumps(list(elements)).decode()


def test_the_element_naming_the_interface_is_the_attachments() -> None:
    text = networks({"name": "a", "interface": "podabc"}, {"name": "b", "interface": "pod123",
                                                            "ipam-claim-reference": "vm.b"})  # fmt: skip
    got = claims.element_for(text, "pod123")
    assert got == {"name": "b", "interface": "pod123", "ipam-claim-reference": "vm.b"}
    assert claims.element_for(text, "net1") is None


def test_without_an_interface_the_element_is_the_one_multus_names_by_position() -> None:
    """Multus names an element without `interface` net<position> (the cluster network is 0)."""
    text = networks({"name": "a"}, {"name": "b", "interface": "fast0"},
                    {"name": "c", "ipam-claim-reference": "x"})
    assert claims.element_for(text, "net1") == {"name": "a"}
    assert claims.element_for(text, "net3") == {"name": "c", "ipam-claim-reference": "x"}
    assert claims.element_for(text, "net2") is None  # that position is named fast0
    assert claims.element_for(text, "fast0") == {"name": "b", "interface": "fast0"}


def test_the_comma_form_names_no_claim_and_a_broken_annotation_is_code_7() -> None:
    assert claims.element_for("ns/blue@net1, red", "net1") is None
    assert claims.element_for("", "net1") is None
    with pytest.raises(ConfigError, match=r"k8s\.v1\.cni\.cncf\.io/networks"):
        claims.element_for('{"name": "a"}', "net1")
    with pytest.raises(ConfigError):
        claims.element_for("[{", "net1")


# ---- the owner --------------------------------------------------------------------------------------------


def test_a_claims_owner_is_its_claim_and_nothing_else_is() -> None:
    owner = claim_owner(REF, "ns/virt-launcher-vm-a-xyz", "", "blue")
    assert owner.container_id == f"ipamclaim/ns/vm-a.tenantred/{REF.uid}"
    assert (owner.pod_uid, owner.node, owner.network) == ("", "", "blue")
    assert claim_of(owner) == REF
    assert claim_of(Allocation("c1" * 32, "ns/p", "net1")) is None
    assert claim_of(Allocation("ipamclaim/ns/only-two", "ns/p", "")) is None
    # every pod of the claim is the same attachment; no DEL (a real container id) matches it
    other = claim_owner(REF, "ns/virt-launcher-vm-a-abc", "", "blue")
    assert owner.same_attachment(other)
    assert not owner.same_attachment(Allocation("c1" * 32, "ns/virt-launcher-vm-a-xyz", ""))


def test_allow_persistent_ips_must_be_a_boolean(tmp_path: Path) -> None:
    conf = {"cniVersion": "1.0.0", "name": "blue", "type": "macvlan", "allowPersistentIPs": "yes",
            "ipam": {"type": "whereabouts", "range": "198.51.100.0/24", "datastore": "local",
                     "local_db": str(tmp_path / "ipam.db")}}  # fmt: skip
    rc, out = call("ADD", conf)
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG and "allowPersistentIPs" in out["msg"], out


@pytest.mark.parametrize("ipam", [{"datastore": "local"}, {"datastore": "etcd", "etcd_host": "127.0.0.1:1"}])
def test_persistent_ips_need_the_kubernetes_store(tmp_path: Path, ipam: dict[str, Any]) -> None:
    """Code 7 before any request: a claim is a Kubernetes object. DEL still succeeds."""
    conf = {"cniVersion": "1.0.0", "name": "blue", "type": "macvlan", "allowPersistentIPs": True,
            "ipam": {"type": "whereabouts", "range": "198.51.100.0/24",
                     "local_db": str(tmp_path / "ipam.db"), **ipam}}  # fmt: skip
    rc, out = call("ADD", conf)
    assert rc == 1 and out["code"] == Code.INVALID_CONFIG and "kubernetes datastore" in out["msg"], out
    if ipam["datastore"] == "local":
        assert call("DEL", conf)[0] == 0


def call(command: str, conf: dict[str, Any]) -> tuple[int, Any]:
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/none",
           "CNI_IFNAME": "net1", "CNI_PATH": "/usr/lib/cni",
           "CNI_ARGS": "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u"}  # fmt: skip
    out = io.BytesIO()
    rc = skel.run("whereabouts", env, io.BytesIO(jsonio.dumps(conf)), out)
    return rc, jsonio.loads(out.getvalue()) if out.getvalue().strip() else None


# ---- the claim watch's events ----------------------------------------------------------------------------


class NoClient:
    """The watch's client, never used by `handle`."""


def watch_over(tmp_path: Path) -> tuple[ClaimWatch, Records]:
    records = Records(str(tmp_path / "claims"))
    claims.record(records.dir, REF)
    store = MemoryStore(Backend())
    return ClaimWatch(NoClient(), store, records), records  # type: ignore[arg-type]


def event(kind: str, uid: str, version: str = "7", **meta: Any) -> dict[str, Any]:
    return {"type": kind, "object": {"metadata": {"uid": uid, "resourceVersion": version,
                                                  "namespace": "ns", "name": "vm-a.tenantred", **meta}}}


def test_only_a_recorded_claims_deletion_is_swept(tmp_path: Path) -> None:
    watch, records = watch_over(tmp_path)
    assert records.all() == {REF.uid: REF}
    assert watch.handle(event("MODIFIED", REF.uid, deletionTimestamp="2026-12-07T10:00:00Z"))
    assert watch.handle(event("DELETED", "another-uid"))
    assert watch.handle(event("BOOKMARK", "", "9"))
    assert watch.take(block=False) is None and watch.version == "9"
    assert watch.handle(event("DELETED", REF.uid, "10"))
    assert watch.take(block=False) == {REF.uid: REF}
    assert not watch.handle({"type": "ERROR", "object": {"code": 410}}) and watch.version == ""


def test_a_sweep_frees_only_the_deleted_claims_entries(tmp_path: Path) -> None:
    watch, records = watch_over(tmp_path)
    keep = ClaimRef("ns", "vm-b.tenantred", "other-uid")
    entries = {"1": claim_owner(REF, "ns/l-1", "", "blue"), "2": claim_owner(keep, "ns/l-2", "", "blue"),
               "3": Allocation("c3" * 32, "ns/web", "net1")}  # fmt: skip
    from ipam.model import Pool, PoolUpdate

    watch.store.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/24"), PoolUpdate(put=entries))
    report = watch.sweep({REF.uid: REF})
    pool = watch.store.get_pool("198.51.100.0-24")
    assert pool is not None and set(pool.allocations) == {"2", "3"} and report.freed == 1
    assert records.all() == {}  # swept: its record dropped
    # a claim of the same name and another UID is not the deleted one
    assert ClaimSweep(watch.store, {"x": ClaimRef("ns", "vm-b.tenantred", "x")}).verdict(entries["2"]) is None


# ---- the reconciler ---------------------------------------------------------------------------------------


class Source:
    def __init__(self, claims: dict[tuple[str, str], str | None], fail: bool = False) -> None:
        self.claims, self.fail, self.asked = claims, fail, 0

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        raise AssertionError("a claim's entry is never judged by its pod")

    def claim_uid(self, namespace: str, name: str) -> str | None:
        self.asked += 1
        if self.fail:
            raise PodSourceError("the API does not answer")
        return self.claims.get((namespace, name))

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("stored", "verdict"), [
    (REF.uid, None), (None, f"IPAMClaim {REF} deleted"), ("new-uid", f"IPAMClaim {REF} recreated"),
])  # fmt: skip
def test_the_reconciler_judges_a_claims_entry_by_its_claim(stored: str | None, verdict: str | None) -> None:
    source = Source({(REF.namespace, REF.name): stored})
    r = Reconciler(MemoryStore(Backend()), source, claims=source)
    got = r.verdict(claim_owner(REF, "ns/virt-launcher-gone", "", "blue"))
    assert got == verdict or (verdict is not None and got is not None and got.startswith(verdict))
    r.verdict(claim_owner(REF, "ns/virt-launcher-2", "", "blue"))
    assert source.asked == 1  # one lookup per claim and run


def test_without_a_claim_source_or_an_answer_a_claims_entry_is_kept() -> None:
    owner = claim_owner(REF, "ns/virt-launcher-gone", "", "blue")
    assert Reconciler(MemoryStore(Backend()), Source({})).verdict(owner) is None
    failing = Source({}, fail=True)
    with pytest.raises(PodSourceError):
        Reconciler(MemoryStore(Backend()), failing, claims=failing).verdict(owner)


class ClosedClient:
    """The watch's client as close() sees it (its watch is replaced in the test)."""

    class http:
        @staticmethod
        def interrupt() -> None:
            return None

    def close(self) -> None:
        return None


class Once:
    """A fault hook (cni.faults) that raises once at `point`, in whichever thread reaches it."""

    def __init__(self, point: str) -> None:
        self.point, self.fired = point, threading.Event()

    def __call__(self, step: str) -> None:
        if step == self.point and not self.fired.is_set():
            self.fired.set()
            raise RuntimeError(f"injected at {step}")


def test_the_claim_watchs_threads_outlive_exceptions_nobody_expected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45 for the claim watch too: its sweeper meets an exception it does not expect (the store
    raising a RuntimeError) and its thread is run again (ipam.keeprunning), the claim it had in hand
    swept then; the watch's own thread likewise. Nothing is left of the deleted claim."""
    watch, records = watch_over(tmp_path)
    watch.backoff = (0.0, 0.0)
    watch.client = ClosedClient()  # type: ignore[assignment]
    store = watch.store
    assert isinstance(store, MemoryStore)
    entries = {"1": claim_owner(REF, "ns/l-1", "", "blue")}
    store.commit_pool(Pool("198.51.100.0-24", "198.51.100.0/24"), PoolUpdate(put=entries))
    seen: list[dict[str, ClaimRef]] = []
    swept = threading.Event()
    watch.on_report = lambda gone, report: (seen.append(gone), swept.set())  # type: ignore[func-returns-value]
    broke = threading.Event()

    def run_watch() -> None:  # fails once, then ends as a closed watch does
        if not broke.is_set():
            broke.set()
            raise RuntimeError("the watch broke")

    watch.run_watch = run_watch  # type: ignore[method-assign]
    fault = Once("claimwatch-sweep")
    monkeypatch.setattr(faults, "hook", fault)
    watch.start()
    try:
        watch.jobs.put({REF.uid: REF})
        assert swept.wait(30), "the claim was never swept"
    finally:
        watch.close()
    assert fault.fired.is_set() and broke.is_set() and seen == [{REF.uid: REF}]
    assert store.get_pool("198.51.100.0-24").allocations == {}  # type: ignore[union-attr]
    assert records.all() == {}
