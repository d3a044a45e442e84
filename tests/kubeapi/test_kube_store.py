"""The Kubernetes store beyond the shared contract (tests/contract): kubeconfig and TLS, tokens, and
compatibility with objects upstream whereabouts writes, on the session's real kube-apiserver (a fresh
namespace per test, the node ServiceAccount's token; tests/kubeup.py). Only what a real server cannot be
made to do stays on the in-process emulator: injected 5xx, hangs, resets and 409s, and client
certificates (kube-up's server authenticates tokens only)."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from cni.errors import Code, ConfigError
from ipam import kubeapi, rbac
from ipam.kubeapi import ApiError, Client, load_kubeconfig
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.store import crd, kube
from ipam.store.base import Conflict, StoreBusy, StoreUnavailable
from ipam.store.kube import KubeStore
from tests.kubeapi.emulator import Emulator
from tests.kubeapi.factory import counting_store, open_kube
from tests.kubeup import NODE_SA, ApiFailure, KubeServer, Tenant

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
B = Allocation("b" * 64, "ns/b", "net1")
POOL = "198.51.100.0-24"


def admin(tenant: Tenant) -> Client:
    """The code's client with the admin token, for reading and writing objects behind the store's back."""
    return Client(load_kubeconfig(str(tenant.admin_kubeconfig)))


def pools(tenant: Tenant) -> str:
    return tenant.path("ippools")


def with_user(tenant: Tenant, path: Path, user: dict[str, Any]) -> Path:
    """The node's kubeconfig with another `user` entry."""
    doc = orjson.loads(tenant.node.read_bytes())
    doc["users"][0]["user"] = user
    path.write_bytes(orjson.dumps(doc))
    path.chmod(0o600)
    return path


def create(store: KubeStore, put: dict[str, Allocation] | None = None) -> str:
    return store.commit_pool(Pool(POOL, "198.51.100.0/24"), PoolUpdate(put=put or {}))


# ---- kubeconfig, TLS, credentials ----------------------------------------------------------------


def test_kubeconfig_file_is_private_and_names_the_namespace(tenant: Tenant) -> None:
    assert tenant.node.stat().st_mode & 0o777 == 0o600
    conf = load_kubeconfig(str(tenant.node))
    assert (conf.server, conf.namespace) == (tenant.server.url, tenant.namespace)
    assert conf.token_file and Path(conf.token_file).read_text() not in repr(conf)
    admin_conf = load_kubeconfig(str(tenant.admin_kubeconfig))  # an inline token
    assert admin_conf.token == tenant.server.admin_token
    assert tenant.server.admin_token not in repr(admin_conf)


def test_yaml_kubeconfig_relative_paths_and_default_namespace(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("x")
    (tmp_path / "k.yaml").write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: x, cluster: {server: 'https://127.0.0.1:6443', certificate-authority: ca.crt}}]\n"
        "users: [{name: u, user: {tokenFile: tok}}]\n"
        "contexts: [{name: c, context: {cluster: x, user: u}}]\n"
    )
    conf = load_kubeconfig(str(tmp_path / "k.yaml"))
    assert conf.ca_file == str(tmp_path / "ca.crt") and conf.token_file == str(tmp_path / "tok")
    assert conf.namespace == "kube-system"  # upstream's default when the context has none


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("{", "neither JSON nor YAML"),
        ("[1]", "not a kubeconfig"),
        ('{"contexts": []}', "no current-context"),
        ('{"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "x"}}]}', "no cluster"),
        (
            '{"current-context": "c", "contexts": [{"name": "c", "context": {"cluster": "x", "user": "u"}}],'
            '"clusters": [{"name": "x", "cluster": {"server": "https://h"}}],'
            '"users": [{"name": "u", "user": {"auth-provider": {"name": "gcp"}}}]}',
            "auth-provider",
        ),
    ],
)
def test_bad_kubeconfig_is_a_config_error_naming_the_field(tmp_path: Path, text: str, msg: str) -> None:
    path = tmp_path / "k"
    path.write_text(text)
    with pytest.raises(ConfigError, match=msg) as e:
        load_kubeconfig(str(path))
    assert e.value.code == Code.INVALID_CONFIG and "kubernetes.kubeconfig" in e.value.msg


def test_missing_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kubernetes\.kubeconfig: cannot read"):
        load_kubeconfig(str(tmp_path / "absent"))


def test_tls_with_the_servers_ca(tenant: Tenant) -> None:
    assert tenant.server.url.startswith("https://")
    store = open_kube(tenant.node)
    try:
        create(store, {"1": A})
        pool = store.get_pool(POOL)
        assert pool is not None and pool.allocations == {"1": A}
    finally:
        store.close()


def test_tls_with_a_client_certificate_from_kubeconfig_data(tls_emu: Emulator, tmp_path: Path) -> None:
    store = open_kube(tls_emu.kubeconfig(tmp_path / "k", token="", client_cert="pycni-node"))
    try:
        create(store)
        assert ("pycni-node", "create", crd.GROUP, "ippools") in tls_emu.calls  # the CN is the identity
        tmp = store.client._tmp
        assert tmp and all(p.stat().st_mode & 0o777 == 0o600 for p in Path(tmp).iterdir())
    finally:
        store.close()
    assert not Path(tmp).exists(), "inline client key material is removed on close"


def test_tls_refuses_a_server_the_ca_did_not_sign(tenant: Tenant, tmp_path: Path, pki: Path) -> None:
    doc = orjson.loads(tenant.node.read_bytes())
    doc["clusters"][0]["cluster"]["certificate-authority"] = str(pki / "ca.crt")  # not the server's CA
    path = tmp_path / "k"
    path.write_bytes(orjson.dumps(doc))
    store = open_kube(path)
    try:
        with pytest.raises(StoreUnavailable, match=r"(?i)certificate"):
            store.get_pool(POOL)
    finally:
        store.close()


def test_bad_token_is_unavailable_with_code_11(tenant: Tenant, tmp_path: Path) -> None:
    store = open_kube(with_user(tenant, tmp_path / "k", {"token": "wrong"}))
    try:
        with pytest.raises(StoreUnavailable, match="401") as e:
            store.get_pool(POOL)
        assert e.value.code == Code.TRY_AGAIN_LATER and "wrong" not in e.value.msg
    finally:
        store.close()


def rotate(server: KubeServer, tenant: Tenant, in_use: str) -> None:
    """Recreate the node's ServiceAccount: every token issued for the old one stops working (bound
    tokens name the account's UID). Returns once the server refuses `in_use` (401): it caches a token
    it accepted for a few seconds, so that takes a moment."""
    server.request("DELETE", tenant.path("serviceaccounts", NODE_SA, group=""))
    server.service_account(tenant.namespace, NODE_SA)
    deadline = time.monotonic() + 60
    while True:
        try:
            server.request("GET", pools(tenant), token=in_use)
        except ApiFailure as e:
            if e.status == 401:
                return
        assert time.monotonic() < deadline, "the old account's token is still accepted after 60 s"
        time.sleep(0.2)


def test_401_rereads_the_token_file_once(tenant: Tenant, tmp_path: Path) -> None:
    server = tenant.server
    token = tmp_path / "token"
    first = server.token(tenant.namespace, NODE_SA)
    token.write_text(first + "\n")
    store = open_kube(with_user(tenant, tmp_path / "k", {"tokenFile": str(token)}))
    try:
        create(store)
        # the kubelet rotates the projected token: the old one stops working, the file has the new one
        rotate(server, tenant, first)
        second = server.token(tenant.namespace, NODE_SA)
        token.write_text(second + "\n")
        assert store.get_pool(POOL) is not None
        # rotated again but the file is stale: one re-read, awaited to change (here briefly), then code 11
        rotate(server, tenant, second)
        store.client.token_wait = 0.5
        with pytest.raises(StoreUnavailable, match="401"):
            store.get_pool(POOL)
    finally:
        store.close()


def test_exec_credential_plugin(tenant: Tenant, tmp_path: Path) -> None:
    token = tenant.server.token(tenant.namespace, NODE_SA)
    plugin = tmp_path / "cred.sh"
    plugin.write_text(
        '#!/bin/sh\necho \'{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",'
        f' "status": {{"token": "{token}"}}}}\'\n'
    )
    plugin.chmod(0o700)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    path = with_user(tenant, tmp_path / "k", exec_user)
    store = open_kube(path)
    try:
        create(store)
        assert store.get_pool(POOL) is not None
    finally:
        store.close()


# ---- faults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["500", "503", "reset"])
def test_server_errors_are_unavailable_and_the_next_call_works(
    emu: Emulator, node_kubeconfig: Path, fault: str
) -> None:
    store = open_kube(node_kubeconfig)
    try:
        create(store, {"1": A})
        # a reset of a kept-alive connection is retried once on a fresh one (every write is
        # compare-and-swap, so a repeat changes nothing): two resets in a row are an outage
        emu.fail(fault, n=2 if fault == "reset" else 1)
        with pytest.raises(StoreUnavailable) as e:
            store.get_pool(POOL)
        assert e.value.code == Code.TRY_AGAIN_LATER
        pool = store.get_pool(POOL)
        assert pool is not None and pool.allocations == {"1": A}
    finally:
        store.close()


def test_a_hanging_server_times_out_within_the_bound(emu: Emulator, node_kubeconfig: Path) -> None:
    emu.stall = 30.0  # far past the client timeout: the answer must not wait for it
    conf = load_kubeconfig(str(node_kubeconfig))
    store = KubeStore(Client(conf, timeout=(1.0, 0.5)), conf.namespace, rbac.NODE)
    try:
        emu.fail("timeout")
        t = time.monotonic()
        with pytest.raises(StoreBusy, match=r"(?i)timed out"):  # took the request, no answer: busy
            store.get_pool(POOL)
        assert time.monotonic() - t < 15  # bounded by the 0.5 s read timeout (generous: shared CI machine)
    finally:
        store.close()


def test_default_timeouts_are_bounded() -> None:
    connect, read = kubeapi.TIMEOUT
    assert 0 < connect <= 5 and 0 < read <= 15


def test_injected_409_on_update_is_a_conflict_and_changes_nothing(
    emu: Emulator, node_kubeconfig: Path
) -> None:
    store = open_kube(node_kubeconfig)
    try:
        create(store, {"1": A})
        snap = store.get_pool(POOL)
        assert snap is not None
        emu.fail("409")
        with pytest.raises(Conflict):
            store.commit_pool(snap, PoolUpdate(put={"2": B}))
        now = store.get_pool(POOL)
        assert now is not None and now.version == snap.version and now.allocations == {"1": A}
    finally:
        store.close()


def test_commit_after_a_foreign_write_merges_other_entries_and_conflicts_on_its_own(tenant: Tenant) -> None:
    """Pools are written with a guarded JSON Patch of the changed entries: a foreign write of another
    entry merges; a foreign write of the same entry conflicts and changes nothing."""
    one, two = open_kube(tenant.node), open_kube(tenant.node)
    try:
        create(one, {"1": A})
        snap = one.get_pool(POOL)
        assert snap is not None
        two.commit_pool(snap, PoolUpdate(put={"2": B}))  # two never read it: reads, then writes
        one.commit_pool(snap, PoolUpdate(put={"3": B}))  # another entry: merged
        with pytest.raises(Conflict):
            one.commit_pool(snap, PoolUpdate(put={"2": A}))  # entry 2 was absent in snap: taken since
        one.commit_pool(snap, PoolUpdate(remove=frozenset({"1"}), put={"4": A}))  # 1 still A's: merged
        pool = two.get_pool(POOL)
        assert pool is not None and pool.allocations == {"2": B, "3": B, "4": A}
    finally:
        one.close()
        two.close()


def test_a_recent_read_is_at_least_as_new_as_asked_and_never_fails_for_a_version_it_lacks(
    tenant: Tenant,
) -> None:
    """recent_pool asks for the pool at a version or newer (served from the server's watch cache): it
    holds every write up to that version. A version the server has not reached (a node's floor from
    before its etcd was restored) costs the server's 3 s wait, then the pool as stored."""
    store, client = counting_store(tenant.node)
    try:
        create(store, {"1": A})
        pool = store.get_pool(POOL)
        assert pool is not None and pool.version is not None
        version = store.commit_pool(pool, PoolUpdate(put={"2": B}))
        got = store.recent_pool(POOL, version)
        assert got is not None and got.allocations == {"1": A, "2": B} and got.version == version
        del client.sent[:], client.queries[:]
        ahead = str(int(version) + 1000)
        got = store.recent_pool(POOL, ahead)
        assert got is not None and got.version == version
        assert client.queries == [{"resourceVersion": ahead}, None]  # the 504, then the stored pool
    finally:
        store.close()


# ---- object compatibility (the emulator's schema enforcement: tests/kubeapi/test_emulator_parity.py) --


def test_what_the_store_writes_survives_pruning_unchanged(tenant: Tenant) -> None:
    store = open_kube(tenant.node)
    try:
        create(store, {"1": A, "2": B})
        store.put_reservation(Reservation("blue-198.51.100.1", A))
    finally:
        store.close()
    client = admin(tenant)
    obj = client.request("GET", f"{pools(tenant)}/{POOL}")
    expected = crd.pool_to_object(Pool(POOL, "198.51.100.0/24", {"1": A, "2": B}), tenant.namespace)
    assert obj["spec"] == expected["spec"]
    assert obj["metadata"]["annotations"] == {**kube.MARKER, **expected["metadata"]["annotations"]}
    res = client.request("GET", f"{tenant.path('overlappingrangeipreservations')}/blue-198.51.100.1")
    written = crd.reservation_to_object(Reservation("blue-198.51.100.1", A), tenant.namespace)
    assert res["spec"] == written["spec"]
    client.close()


def test_invalid_object_name_is_a_config_error(tenant: Tenant) -> None:
    store = open_kube(tenant.node)
    try:
        with pytest.raises(Exception) as e:
            store.put_reservation(Reservation("--1", A))
        assert getattr(e.value, "code", None) == Code.INVALID_CONFIG and "metadata.name" in str(e.value)
    finally:
        store.close()


def test_pool_written_by_upstream_is_read_and_its_metadata_kept(tenant: Tenant) -> None:
    """An IPPool as whereabouts writes it: no pycni annotation, its own labels and annotations."""
    client = admin(tenant)
    upstream = {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {"name": POOL, "labels": {"team": "gpu"}, "annotations": {"note": "kept"}},
        "spec": {"range": "198.51.100.0/24", "allocations": {"5": {"id": "c" * 64, "podref": "ns/old"}}},
    }
    client.request("POST", pools(tenant), upstream)
    store = open_kube(tenant.node)
    try:
        snap = store.get_pool(POOL)
        assert snap is not None and snap.allocations == {"5": Allocation("c" * 64, "ns/old", "")}
        store.commit_pool(snap, PoolUpdate(put={"6": A}))
    finally:
        store.close()
    obj = client.request("GET", f"{pools(tenant)}/{POOL}")
    assert obj["metadata"]["labels"] == {"team": "gpu"}
    assert obj["metadata"]["annotations"]["note"] == "kept"
    assert set(obj["spec"]["allocations"]) == {"5", "6"}
    client.close()


def test_pool_writes_clear_the_field_tracking_and_other_writers_are_unaffected(tenant: Tenant) -> None:
    """Every pool patch strips managedFields (kube.UNTRACKED): the real server then stores none, and a
    foreign writer (upstream's GET + PUT, the admin here) still reads and writes the pool as before."""
    client, path = admin(tenant), f"{pools(tenant)}/{POOL}"
    store = open_kube(tenant.node)
    try:
        create(store, {"1": A})
        assert client.request("GET", path)["metadata"].get("managedFields")  # the create is tracked
        snap = store.get_pool(POOL)
        assert snap is not None
        store.commit_pool(snap, PoolUpdate(put={"2": B}))
        obj = client.request("GET", path)
        assert "managedFields" not in obj["metadata"] and set(obj["spec"]["allocations"]) == {"1", "2"}
        obj["spec"]["allocations"]["3"] = {"id": "c" * 64, "podref": "ns/c", "ifname": "net1"}
        client.request("PUT", path, obj)  # upstream's write
        snap = store.get_pool(POOL)
        assert snap is not None and set(snap.allocations) == {"1", "2", "3"}
        store.commit_pool(snap, PoolUpdate(remove=frozenset({"1"})))
        obj = client.request("GET", path)
        assert "managedFields" not in obj["metadata"] and set(obj["spec"]["allocations"]) == {"2", "3"}
    finally:
        store.close()
        client.close()


def test_owners_annotation_is_dropped_when_nothing_is_left_to_record(tenant: Tenant) -> None:
    store = open_kube(tenant.node)
    try:
        create(store, {"1": A})
        snap = store.get_pool(POOL)
        assert snap is not None
        store.commit_pool(snap, PoolUpdate(remove=frozenset({"1"})))
    finally:
        store.close()
    client = admin(tenant)
    obj = client.request("GET", f"{pools(tenant)}/{POOL}")
    assert not crd.decode_owners(obj["metadata"].get("annotations"))
    client.close()


def test_paging_uses_limit_and_continue(tenant: Tenant) -> None:
    store, client = counting_store(tenant.node)
    try:
        for i in range(7):
            store.put_reservation(Reservation(f"198.51.100.{i}", B))
        store.page = 3
        before = len(client.sent)
        assert sorted(r.name for r in store.iter_reservations()) == [f"198.51.100.{i}" for i in range(7)]
        assert client.sent[before:] == [("GET", tenant.path("overlappingrangeipreservations"))] * 3
    finally:
        store.close()


def test_rbac_require_stops_an_undeclared_request_before_it_is_sent(tenant: Tenant) -> None:
    store, client = counting_store(tenant.node, role=rbac.RECONCILER)
    try:
        with pytest.raises(rbac.NotGranted):
            create(store)  # the reconciler never creates
        assert client.sent == []
    finally:
        store.close()
    assert tenant.pools() == {}


def test_basic_auth_is_sent_and_the_server_answers_for_an_anonymous_user(
    tenant: Tenant, tmp_path: Path
) -> None:
    """kube-apiserver has no basic authentication: the header is ignored and the request is anonymous,
    which RBAC refuses (403; a bad bearer token is 401: test_bad_token_is_unavailable_with_code_11)."""
    path = with_user(tenant, tmp_path / "k", {"username": "u", "password": "p"})
    client = Client(load_kubeconfig(str(path)))
    assert client._auth == "Basic " + base64.b64encode(b"u:p").decode()
    with pytest.raises(ApiError) as e:
        client.request("GET", pools(tenant))
    assert e.value.status == 403 and 'User "system:anonymous" cannot list' in e.value.message
    client.close()


def test_legacy_owners_annotation_is_ignored_and_removed_by_our_next_write(tenant: Tenant) -> None:
    """The first owners format (no stamp) cannot say which allocation it was written for: never
    attached, and gone after our next write; foreign annotations stay."""
    client = admin(tenant)
    legacy = {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
        "kind": "IPPool",
        "metadata": {
            "name": POOL,
            "annotations": {crd.LEGACY_OWNERS: '{"5":["uid-old","blue","node-1"]}', "note": "kept"},
        },
        "spec": {"range": "198.51.100.0/24", "allocations": {"5": {"id": "c" * 64, "podref": "ns/c"}}},
    }
    client.request("POST", pools(tenant), legacy)
    store = open_kube(tenant.node)
    try:
        snap = store.get_pool(POOL)
        assert snap is not None and snap.allocations == {"5": Allocation("c" * 64, "ns/c", "")}
        store.commit_pool(snap, PoolUpdate(put={"6": A}))
        again = store.get_pool(POOL)
        assert again is not None and again.allocations["6"] == A
    finally:
        store.close()
    notes = client.request("GET", f"{pools(tenant)}/{POOL}")["metadata"]["annotations"]
    assert set(notes) == {crd.owner_key("6"), "note"} and set(crd.decode_owners(notes)) == {"6"}
    client.close()
