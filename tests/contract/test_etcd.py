"""The etcd store against a real etcd (tests/etcdutil.py): TLS, user/password auth and its token cache,
several endpoints, the operator CLI and the reconciler, and outages (etcd killed or hung mid-run:
code 11 within a bound, nothing half-written, the next call after recovery succeeds).
The protocol itself is covered by the contract suite (factory "etcd")."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from cni import jsonio
from cni.errors import Code
from ipam.config import from_dict, store_config
from ipam.engine import Engine
from ipam.model import Allocation, Reservation
from ipam.reconciler import Reconciler
from ipam.store.base import StoreUnavailable
from ipam.store.etcd import EtcdStore, open_store
from ipam.store.etcdgw import Gateway, parse_endpoints
from tests import etcdutil
from tests.concurrency.harness import Att, base_conf, check, spawn_all
from tests.etcdutil import PASSWORD, Etcd, free_port
from tests.unit.ipam.test_cli_reconciler import ALIVE, GONE, LIVE, NOUID, Pods, run_cli

RANGE = "198.51.100.0/24"
POOL = "198.51.100.0-24"


def ips(out: Any) -> list[str]:
    return [ip["address"].split("/")[0] for ip in out["ips"]]


def conf_for(etcd: Etcd, tmp: Path, **ipam: Any) -> dict[str, Any]:
    return base_conf("etcdnet", {**etcd.ipam(), "local_db": str(tmp / "state" / "w.db")}, tmp, **ipam)


def store_of(etcd: Etcd, tmp: Path, **extra: str) -> EtcdStore:
    return open_store(store_config({**etcd.ipam(), "local_db": str(tmp / "state" / "w.db"), **extra}))


def add_del(etcd: Etcd, tmp: Path, n: int = 3) -> list[str]:
    """n ADDs as plugin processes (all must succeed), then their DELs; the addresses handed out."""
    conf = conf_for(etcd, tmp, range=RANGE)
    atts = [Att(f"{i:04d}" + "e" * 60, "net1", f"ns/pod-{i}") for i in range(n)]
    results = spawn_all((a.env("ADD"), conf) for a in atts)
    assert all(rc == 0 for rc, _, _ in results), results
    got = [ips(out)[0] for _, out, _ in results]
    assert len(set(got)) == n
    results = spawn_all((a.env("DEL"), conf) for a in atts)
    assert all(rc == 0 for rc, _, _ in results), results
    return got


# ---- TLS ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with etcdutil.running(certs_dir=tmp_path_factory.mktemp("certs")) as e:
        yield e


def test_tls_plugin_round_trip(tls_etcd: Etcd, tmp_path: Path) -> None:
    assert tls_etcd.url.startswith("https://")
    add_del(tls_etcd, tmp_path)
    [pool] = list(store_of(tls_etcd, tmp_path).iter_pools())
    assert pool.allocations == {}


def test_tls_scheme_follows_the_tls_files(tls_etcd: Etcd, tmp_path: Path) -> None:
    """Bare host:port with TLS files configured means https (as upstream's Go client does)."""
    store = store_of(tls_etcd, tmp_path, etcd_host=f"127.0.0.1:{tls_etcd.client_port}")
    store.ping()
    store.close()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"etcd_ca_cert_file": ""}, "certificate verify failed"),  # system CAs do not know ours
        ({"etcd_cert_file": "", "etcd_key_file": ""}, ""),  # the server requires a client certificate
    ],
)
def test_tls_refusals_are_try_again(
    tls_etcd: Etcd, tmp_path: Path, change: dict[str, str], says: str
) -> None:
    store = store_of(tls_etcd, tmp_path, **change)
    with pytest.raises(StoreUnavailable) as e:
        store.get_pool(POOL)
    assert e.value.code == Code.TRY_AGAIN_LATER and says in e.value.msg and tls_etcd.url in e.value.msg
    store.close()


def test_credentials_for_an_etcd_without_auth_are_not_needed(tls_etcd: Etcd, tmp_path: Path) -> None:
    """As etcd's Go client does: "authentication is not enabled" means carry on without a token."""
    store = store_of(tls_etcd, tmp_path, etcd_username="ipam", etcd_password="unused-password")
    store.ping()
    store.put_reservation(Reservation("198.51.100.200", LIVE))
    store.close()
    assert not (tmp_path / "state").exists() or not token_files(tmp_path)


def test_tls_files_that_cannot_be_loaded_are_config_errors(tls_etcd: Etcd, tmp_path: Path) -> None:
    for change, field in (
        ({"etcd_ca_cert_file": str(tmp_path / "missing.crt")}, "etcd_ca_cert_file"),
        ({"etcd_key_file": ""}, "etcd_key_file"),
        ({"etcd_cert_file": tls_etcd.certs.ca, "etcd_key_file": tls_etcd.certs.server_key}, "etcd_cert_file"),  # type: ignore[union-attr]
    ):
        conf = conf_for(tls_etcd, tmp_path, range=RANGE, **change)
        [(rc, out, _)] = spawn_all([(Att("c" * 64, "net1", "ns/p").env("ADD"), conf)])
        assert rc == 1 and out["code"] == Code.INVALID_CONFIG and field in out["msg"], out


# ---- auth -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with etcdutil.running(certs_dir=tmp_path_factory.mktemp("certs"), auth=True) as e:
        yield e


def token_files(tmp: Path) -> list[Path]:
    return sorted((tmp / "state").glob("etcd-token-*"))


def test_auth_plugin_round_trip_caches_a_private_token(auth_etcd: Etcd, tmp_path: Path) -> None:
    add_del(auth_etcd, tmp_path)
    [cache] = token_files(tmp_path)
    st = cache.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert not [p for p in (tmp_path / "state").iterdir() if p.name.endswith(".tmp")]
    token = cache.read_text()
    store = store_of(auth_etcd, tmp_path)
    store.ping()  # uses the cached token: no new one is issued
    store.close()
    assert cache.read_text() == token


def test_auth_reauthenticates_when_the_token_dies(auth_etcd: Etcd, tmp_path: Path) -> None:
    """etcd forgets simple tokens when it restarts: the cached one is refused, a new one is fetched once;
    nothing the suite logs (debug level, stderr and log file) shows the password or a token."""
    log_file = tmp_path / "ipam.log"
    conf = conf_for(auth_etcd, tmp_path, range=RANGE, log_level="debug", log_file=str(log_file))
    att = Att("a" * 64, "net1", "ns/pod-a")
    [(rc, out, err1)] = spawn_all([(att.env("ADD"), conf)])
    assert rc == 0, out
    old = token_files(tmp_path)[0].read_text()
    auth_etcd.stop()
    auth_etcd.start()
    [(rc, out2, err2)] = spawn_all([(att.env("ADD"), conf)])
    assert rc == 0 and ips(out2) == ips(out), err2
    new = token_files(tmp_path)[0].read_text()
    assert new != old and "authenticating again" in err2
    [(rc, _, err3)] = spawn_all([(att.env("DEL"), conf)])
    assert rc == 0
    logged = err1 + err2 + err3 + log_file.read_text()
    for secret in (PASSWORD, old, new):
        assert secret not in logged


def test_auth_token_cache_never_follows_a_planted_symlink(auth_etcd: Etcd, tmp_path: Path) -> None:
    add_del(auth_etcd, tmp_path, 1)
    [cache] = token_files(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    cache.unlink()
    cache.symlink_to(victim)
    add_del(auth_etcd, tmp_path, 1)  # reads through no symlink, replaces the link by a file of its own
    assert victim.read_text() == "untouched"
    assert not cache.is_symlink() and stat.S_IMODE(cache.stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"etcd_password": "wrong-password"}, "authentication"),
        ({"etcd_username": "", "etcd_password": ""}, "permission denied"),
    ],
)
def test_auth_refusals_are_try_again_and_name_no_secret(
    auth_etcd: Etcd, tmp_path: Path, change: dict[str, str], says: str
) -> None:
    conf = conf_for(auth_etcd, tmp_path, range=RANGE, **change)
    [(rc, out, err)] = spawn_all([(Att("b" * 64, "net1", "ns/p").env("ADD"), conf)])
    assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER and says in out["msg"], out
    assert PASSWORD not in out["msg"] + err and "wrong-password" not in out["msg"] + err


def test_auth_outside_the_granted_prefix_is_denied(auth_etcd: Etcd, tmp_path: Path) -> None:
    c = auth_etcd.ipam()
    gw = Gateway(
        parse_endpoints(auth_etcd.url, True),
        store_of(auth_etcd, tmp_path).gw.tls,
        c["etcd_username"],
        c["etcd_password"],
    )
    store = EtcdStore(gw, "/elsewhere/")
    with pytest.raises(StoreUnavailable, match="permission denied"):
        store.put_reservation(Reservation("198.51.100.9", LIVE))
    store.close()


# ---- endpoints, paging ----------------------------------------------------------------------------------


def test_dead_endpoints_are_skipped(tmp_path: Path) -> None:
    etcd = etcdutil.shared()
    dead = f"http://127.0.0.1:{free_port()}"
    store = EtcdStore(Gateway(parse_endpoints(f"{dead}, {etcd.url}", False)), f"/pycni/ep-{os.getpid()}/")
    Engine(store, from_dict({"datastore": "local", "range": RANGE})).add(LIVE)
    assert store.get_pool(POOL) is not None
    store.close()


def test_listing_pages_through_the_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ipam.store import etcd as etcd_store

    monkeypatch.setattr(etcd_store, "RESERVATION_PAGE", 3)
    monkeypatch.setattr(etcd_store, "POOL_PAGE", 2)
    calls: list[dict[str, Any]] = []
    store = EtcdStore(
        Gateway(parse_endpoints(etcdutil.shared().url, False)), f"/pycni/page-{time.time_ns()}/"
    )
    real = store.gw.call
    store.gw.call = lambda m, b: calls.append(b) or real(m, b)  # type: ignore[method-assign]
    engine = Engine(
        store,
        from_dict(
            {"datastore": "local", "ipRanges": [{"range": "198.51.100.0/28"}, {"range": "2001:db8::/124"}]}
        ),
    )
    for i in range(10):
        engine.add(Allocation(f"c{i}", f"ns/p{i}", "net1"))
    calls.clear()
    assert len(list(store.iter_reservations())) == 20 and len(calls) == 7  # 3 per page, then the rest
    assert all(c.get("limit") == 3 for c in calls)
    assert len(list(store.iter_pools())) == 2
    store.close()


# ---- operator CLI and reconciler -------------------------------------------------------------------------


def test_cli_and_reconciler_over_etcd(tmp_path: Path) -> None:
    prefix = "/pycni/whereabouts/"
    with etcdutil.running() as etcd:
        store = store_of(etcd, tmp_path)
        engine = Engine(store, from_dict({"datastore": "local", "range": RANGE, "network_name": "blue"}))
        for who in (LIVE, GONE, NOUID):
            engine.add(who)
        ipam = tmp_path / "ipam.json"
        ipam.write_bytes(jsonio.dumps({**etcd.ipam(), "configuration_path": str(tmp_path / "none")}))
        rc, out, err = run_cli("--config", str(ipam), "pools")
        assert rc == 0 and "blue-198.51.100.0-24" in out and "3/254" in out, err
        rc, out, err = run_cli("--config", str(ipam), "show", "blue-198.51.100.0-24")
        assert rc == 0 and "ns/gone" in out and "uid-live" in out, err
        rc, out, err = run_cli(
            "--config", str(ipam), "release", "blue-198.51.100.0-24", "198.51.100.3", "--yes"
        )
        assert rc == 0 and "released 198.51.100.3" in out, err
        report = Reconciler(store, Pods(ALIVE)).run()
        assert report.freed == 2  # GONE's allocation and its reservation
        held = {a.container_id for p in store.iter_pools() for a in p.allocations.values()}
        assert held == {"c-live"} and [r.owner.container_id for r in store.iter_reservations()] == ["c-live"]
        assert set(etcd.keys(prefix.encode())) == {
            f"{prefix}ippools/blue-198.51.100.0-24".encode(),
            f"{prefix}overlappingrangeipreservations/blue-198.51.100.1".encode(),
        }
        store.close()


# ---- outages (issue 7) -------------------------------------------------------------------------------------

BOUND = 60.0  # seconds a call may take while etcd is gone (grace 3 s + timeouts; generous on a busy box)


def _timed(calls: list[tuple[dict[str, str], dict[str, Any]]]) -> tuple[list[tuple[int, Any, str]], float]:
    t = time.monotonic()
    out = spawn_all(calls)
    return out, time.monotonic() - t


def _waiters(lock: Path) -> int:
    """Processes blocked in flock on `lock` (the kernel lists each in /proc/locks with "->")."""
    st = os.stat(lock)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return sum(1 for line in f if "->" in line and f" {key} " in line)


def test_etcd_killed_mid_storm_then_recovers(tmp_path: Path) -> None:
    """40 ADDs: 5 done, then 35 in flight when etcd is SIGKILLed (waiting on the node's lock of the pool,
    which the test holds and lets go once etcd is dead: surely in flight, whatever the machine's
    speed): each ends with code 11, all within BOUND of etcd's death. After restart the
    runtime's DEL + ADD for the failures and a GC leave the store consistent, and every ADD succeeds
    again."""
    from concurrent.futures import ThreadPoolExecutor

    from ipam import nodelock
    from tests.waits import until

    with etcdutil.running(on_disk=True) as etcd:
        conf = conf_for(etcd, tmp_path, range="198.18.0.0/24")
        atts = [Att(f"{i:04d}" + "k" * 60, "net1", f"ns/kill-{i}") for i in range(40)]
        results = spawn_all([(a.env("ADD"), conf) for a in atts[:5]])
        assert [rc for rc, _, _ in results] == [0] * 5, results
        [lock] = (tmp_path / "state" / "pool-locks").glob("*.lock")
        with ThreadPoolExecutor(1) as runner, nodelock.held(str(lock)):
            calls = runner.submit(_timed, [(a.env("ADD"), conf) for a in atts[5:]])
            until(lambda: _waiters(lock) == 35 or calls.done(), "35 calls waiting on the node's lock", 120)
            etcd.kill()
            killed = time.monotonic()
            assert not calls.done(), "the calls ended without waiting on the node's lock"
        late, _ = calls.result()
        took = time.monotonic() - killed  # from etcd's death to the last answer
        results += late
        codes = [0 if rc == 0 else out["code"] for rc, out, _ in results]
        assert codes == [0] * 5 + [Code.TRY_AGAIN_LATER] * 35 and took < BOUND, (results[5:8], took)
        print(f"etcd killed: {codes.count(0)} ADDs done, {len(codes) - codes.count(0)} code 11, {took:.1f} s")
        down = [a for a, c in zip(atts, codes, strict=True) if c]
        [(rc, out, _)], took = _timed([(atts[0].env("DEL"), conf)])
        assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER and took < BOUND  # DEL never silent
        etcd.start()
        ok = {a: ips(out) for a, (rc, out, _) in zip(atts, results, strict=True) if rc == 0}
        store = store_of(etcd, tmp_path)
        problems, owners = check(store, [conf])  # right after the crash: whole objects, nothing twice
        store.close()
        failed = {a.cid for a in down}
        assert all("has no allocation" in p and any(c in p for c in failed) for p in problems), problems
        assert all(owners[("etcdnet", a.cid, a.ifname)] == got for a, got in ok.items())
        results = spawn_all([(a.env("DEL"), conf) for a in down])  # the runtime cleans up failed ADDs
        assert all(rc == 0 for rc, _, _ in results), [(rc, out, err[-800:]) for rc, out, err in results if rc]
        results = spawn_all([(a.env("ADD"), conf) for a in atts])
        assert all(rc == 0 for rc, _, _ in results), results
        for a, (_, out, _) in zip(atts, results, strict=True):
            assert a not in ok or ips(out) == ok[a]  # those that had succeeded keep their address
        valid = [{"containerID": a.cid, "ifname": a.ifname} for a in atts]
        gc = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni", "NODENAME": "node-1"}
        [(rc, out, err)] = spawn_all([(gc, {**conf, "cni.dev/valid-attachments": valid})])
        assert rc == 0, (out, err)
        store = store_of(etcd, tmp_path)
        problems, owners = check(store, [conf])
        assert not problems and len(owners) == 40, problems[:5]
        store.close()


def test_etcd_hung_is_try_again_within_a_bound(tmp_path: Path) -> None:
    """A stopped (SIGSTOP) etcd accepts connections and never answers: the read timeout bounds the call."""
    with etcdutil.running() as etcd:
        conf = conf_for(etcd, tmp_path, range=RANGE)
        att = Att("h" * 64, "net1", "ns/hung")
        assert etcd.proc is not None
        etcd.proc.send_signal(signal.SIGSTOP)
        try:
            [(rc, out, _)], took = _timed([(att.env("ADD"), conf)])
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        assert rc == 1 and out["code"] == Code.TRY_AGAIN_LATER and "timed out" in out["msg"], out
        assert took < BOUND
        print(f"etcd hung: code 11 after {took:.1f} s")
        [(rc, out, _)] = spawn_all([(att.env("ADD"), conf)])
        assert rc == 0, out
        [(rc, _, _)] = spawn_all([(att.env("DEL"), conf)])
        assert rc == 0
