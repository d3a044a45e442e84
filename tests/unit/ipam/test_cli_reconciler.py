"""The operator CLI (pools, show, release) and the reconciler over a local store, no root needed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cni import jsonio
from ipam import cli
from ipam.config import from_dict
from ipam.engine import Engine
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.podsource import PodInfo, PodSourceError
from ipam.reconciler import Finding, Reconciler, Report, _prefixes
from ipam.store.local import LocalStore
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO

LIVE = Allocation("c-live", "ns/live", "net1", "uid-live", "netA", "n1")
GONE = Allocation("c-gone", "ns/gone", "net1", "uid-gone", "netA", "n1")
REUSED = Allocation("c-old", "ns/sts-0", "net1", "uid-old", "netA", "n1")  # name reused by a new pod
NOUID = Allocation("c-nouid", "ns/nouid", "net1")  # written by upstream: no uid
NOPOD = Allocation("c-podman", "", "eth0")  # no pod reference at all


@pytest.fixture
def db(tmp_path: Path) -> str:
    path = str(tmp_path / "ipam.db")
    store = LocalStore(path)
    engine = Engine(
        store,
        from_dict(
            {"datastore": "local", "range": "198.51.100.0/24", "network_name": "blue",
             "ipRanges": [{"range": "2001:db8::/120"}]}
        ),
    )
    for who in (LIVE, GONE, REUSED, NOUID, NOPOD):
        engine.add(who)
    store.close()
    return path


class Pods:
    def __init__(self, pods: list[PodInfo], broken: set[str] | None = None) -> None:
        self.pods = {(p.namespace, p.name): p for p in pods}
        self.broken = broken or set()
        self.lookups = 0

    def lookup(self, namespace: str, name: str) -> PodInfo | None:
        self.lookups += 1
        if name in self.broken:
            raise PodSourceError("API unreachable")
        return self.pods.get((namespace, name))

    def close(self) -> None:
        pass


ALIVE = [PodInfo("ns", "live", "uid-live"), PodInfo("ns", "sts-0", "uid-new"), PodInfo("ns", "nouid", "u9")]


def held(path: str) -> set[str]:
    store = LocalStore(path)
    try:
        return {a.container_id for p in store.iter_pools() for a in p.allocations.values()} | {
            "res:" + r.owner.container_id for r in store.iter_reservations()
        }
    finally:
        store.close()


def test_reconciler_frees_gone_and_recreated_pods_only(db: str) -> None:
    found: list[Finding] = []
    store = LocalStore(db)
    report = Reconciler(store, Pods(ALIVE), on_finding=found.append).run()
    store.close()
    assert {(f.kind, f.owner.container_id) for f in found} == {
        (k, c) for k in ("allocation", "reservation") for c in ("c-gone", "c-old")
    } and len(found) == 8
    assert report.freed == 8 and not report.errors
    assert {f.ip for f in found if f.kind == "allocation"} == {
        "198.51.100.2",
        "198.51.100.3",
        "2001:db8::2",
        "2001:db8::3",
    }
    left = {"c-live", "c-nouid", "c-podman"}
    assert held(db) == left | {"res:" + c for c in left}


def test_dry_run_changes_nothing(db: str) -> None:
    before = held(db)
    found: list[Finding] = []
    store = LocalStore(db)
    report = Reconciler(store, Pods([]), dry_run=True, on_finding=found.append).run()
    store.close()
    assert report.freed == 0 and len(found) == 16  # every pod-owned entry, nothing without a pod
    assert held(db) == before


def test_unknown_pods_are_never_freed(db: str) -> None:
    before = held(db)
    store = LocalStore(db)
    report = Reconciler(store, Pods([], broken={"gone", "live", "sts-0", "nouid"})).run()
    store.close()
    assert report.freed == 0 and report.found == 0 and held(db) == before


def test_pod_answers_are_cached_within_a_bound(db: str) -> None:
    pods = Pods(ALIVE)
    store = LocalStore(db)
    Reconciler(store, pods, dry_run=True).run()
    assert pods.lookups == 4  # 4 pods, asked once each for 2 pools and 8 reservations
    pods.lookups = 0
    Reconciler(store, pods, dry_run=True, cache=1).run()
    store.close()
    assert 4 < pods.lookups <= 16


def test_changed_entry_is_not_freed(db: str) -> None:
    """The pool changed between judging and releasing (a re-ADD took the entry over)."""
    store = LocalStore(db)
    rec = Reconciler(store, Pods(ALIVE))
    pool = store.get_pool("blue-198.51.100.0-24")
    assert pool is not None
    key = next(k for k, a in pool.allocations.items() if a.container_id == "c-gone")
    Engine(store, from_dict({"datastore": "local", "range": "198.51.100.0/24", "network_name": "blue"})).add(
        GONE._replace(container_id="c-gone-2", podref="ns/gone")
    )
    freed = rec._release(pool, {key: GONE}, Report())
    store.close()
    assert freed == 0 and "c-gone-2" in held(db)


@pytest.mark.parametrize("network_name", ["rdma", ""], ids=["named", "unnamed"])
def test_lean_slice_pool_entries_are_judged_by_their_reservations(network_name: str, tmp_path: Path) -> None:
    """A node slice's lean pool (`<network_name>-<node>-<slice>`, entries without extras) and the
    reservations of its addresses (`<network_name>-<ip>`, with the extras): the entry of a recreated
    pod goes with its reservation, a gone pod's reservation whose address another attachment holds
    (upstream's takeover) stays, and a live pod's entry and reservation stay."""
    store = LocalStore(str(tmp_path / "ipam.db"))
    node = "node-1"  # a dash in the node's name too
    prefix = f"{network_name}-" if network_name else ""
    taken = Allocation("c-taken", "ns/live", "net2")
    entries = {"1": REUSED._replace(node=node), "2": taken, "3": LIVE._replace(node=node)}
    pool = Pool(f"{prefix}{node}-198.18.3.0-24", "198.18.3.0/24")
    store.commit_pool(pool, PoolUpdate(put={k: a.bare() for k, a in entries.items()}))
    owners = {"1": REUSED, "2": GONE, "3": LIVE}
    for key, owner in owners.items():
        store.put_reservation(Reservation(f"{prefix}198.18.3.{key}", owner._replace(node=node)))
    found: list[Finding] = []
    report = Reconciler(store, Pods(ALIVE), on_finding=found.append).run()
    left = store.get_pool(pool.name)
    reservations = {r.name for r in store.iter_reservations()}
    store.close()
    assert sorted((f.kind, f.owner.container_id) for f in found) == [("allocation", "c-old"),
                                                                      ("reservation", "c-old")]
    assert (report.freed, report.errors) == (2, [])
    assert left is not None and {k: a.container_id for k, a in left.allocations.items()} == {
        "2": "c-taken", "3": "c-live",
    }
    assert reservations == {f"{prefix}198.18.3.2", f"{prefix}198.18.3.3"}


def test_a_slice_pools_reservation_prefixes() -> None:
    assert _prefixes("rdma-node-1", "node-1") == ("rdma-node-1", "rdma")
    assert _prefixes("node-1", "node-1") == ("node-1", "")
    assert _prefixes("rdma", "node-1") == ("rdma",)
    assert _prefixes("rdma-node-1", "") == ("rdma-node-1",)  # no node recorded (upstream's): its own only


def run_cli(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "ipam", *argv],
        input=stdin.encode(),
        capture_output=True,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


def test_cli_pools_and_show(db: str) -> None:
    rc, out, err = run_cli("--local-db", db, "pools")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["POOL", "RANGE", "USED/TOTAL", "USAGE"]
    row = next(line for line in lines if line.startswith("blue-198.51.100.0-24"))
    assert "198.51.100.0/24" in row and "5/254" in row and "[#" in row and "2.0%" in row
    assert any(line.startswith("blue-2001-db8---120") and "5/255" in line for line in lines)
    rc, out, _ = run_cli("--local-db", db, "show", "blue-198.51.100.0-24")
    assert rc == 0 and "ns/gone" in out and "198.51.100.2" in out and "uid-live" in out and "netA" in out
    rc, _, err = run_cli("--local-db", db, "show", "nope")
    assert rc == 2 and "pool nope: not found" in err


def test_cli_release_asks_first(db: str) -> None:
    rc, out, err = run_cli("--local-db", db, "release", "blue-198.51.100.0-24", "198.51.100.2")
    assert rc == 1 and "use --yes" in err and "c-gone" in held(db)
    out_buf = io.StringIO()
    store = LocalStore(db)
    assert (
        cli.cmd_release(store, "blue-198.51.100.0-24", "198.51.100.2", False, out_buf, ask=lambda q: "n") == 1
    )
    assert (
        cli.cmd_release(store, "blue-198.51.100.0-24", "198.51.100.2", False, out_buf, ask=lambda q: "y") == 0
    )
    store.close()
    assert "released 198.51.100.2" in out_buf.getvalue()
    assert {c for c in held(db) if "gone" in c} == {"c-gone", "res:c-gone"}  # v6 still held
    rc, out, _ = run_cli("--local-db", db, "release", "blue-2001-db8---120", "2001:db8::2", "--yes")
    assert rc == 0 and not {c for c in held(db) if "gone" in c}
    rc, out, _ = run_cli("--local-db", db, "release", "blue-2001-db8---120", "2001:db8::2", "--yes")
    assert rc == 1 and "not allocated" in out


def test_cli_reconcile_from_a_pods_file(db: str, tmp_path: Path) -> None:
    pods = tmp_path / "pods.json"
    pods.write_bytes(jsonio.dumps([{"namespace": p.namespace, "name": p.name, "uid": p.uid} for p in ALIVE]))
    rc, out, err = run_cli("--local-db", db, "reconcile", "--pods", f"file:{pods}", "--dry-run")
    assert rc == 0, err
    assert (
        out.count("): ") == 8 and "pod recreated" in out and "would free 8;" in out and "c-gone" in held(db)
    )
    rc, out, err = run_cli("--local-db", db, "reconcile", "--pods", f"file:{pods}")
    assert rc == 0 and "freed 8 of 8;" in out
    assert "c-gone" not in held(db) and "c-live" in held(db)


def test_cli_config_file_selects_the_store(db: str, tmp_path: Path) -> None:
    flat = tmp_path / "flat.conf"
    flat.write_text("{}")
    conflist = tmp_path / "net.conflist"
    conflist.write_bytes(
        jsonio.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "x",
                "plugins": [
                    {
                        "type": "macvlan",
                        "ipam": {"type": "whereabouts", "datastore": "local", "local_db": db,
                                 "configuration_path": str(flat)},
                    }
                ],
            }
        )
    )
    rc, out, err = run_cli("--config", str(conflist), "pools")
    assert rc == 0 and "blue-198.51.100.0-24" in out, err


def test_cli_takes_the_local_store_a_flat_file_chooses(db: str, tmp_path: Path) -> None:
    flat = tmp_path / "whereabouts.conf"
    flat.write_bytes(jsonio.dumps({"datastore": "local", "local_db": db}))
    conf = tmp_path / "net.conf"
    conf.write_bytes(jsonio.dumps({"type": "whereabouts", "configuration_path": str(tmp_path)}))
    rc, out, err = run_cli("--config", str(conf), "pools")
    assert rc == 0 and "blue-198.51.100.0-24" in out, err


def test_cli_refuses_a_config_that_names_no_store(db: str, tmp_path: Path) -> None:
    """As the plugin: no datastore, kubeconfig or etcd_host anywhere is an error naming where it looked
    (never the default local database, which exists here only as `db` elsewhere)."""
    typo = tmp_path / "wherabouts.conf"
    conf = tmp_path / "net.conf"
    conf.write_bytes(jsonio.dumps({"type": "whereabouts", "range": "198.51.100.0/24",
                                   "configuration_path": str(typo)}))
    rc, out, err = run_cli("--config", str(conf), "pools")
    assert (rc, out) == (2, ""), err
    assert "ipam.datastore: no store configured" in err and f"no flat file at {typo}, " in err, err
    assert '"datastore": "local"' in err and "--local-db PATH" in err, err


def test_run_forever_runs_until_stopped_and_survives_a_failed_run(db: str) -> None:
    import threading

    from cni.errors import TryAgainError
    from ipam.reconciler import run_forever

    stop = threading.Event()
    reports: list[Report] = []
    calls = 0

    class Flaky:
        def lookup(self, namespace: str, name: str) -> PodInfo | None:
            raise TryAgainError("store down")  # not a PodSourceError: the whole run fails

        def close(self) -> None:
            pass

    def make() -> Reconciler:
        nonlocal calls
        calls += 1
        if calls == 3:
            stop.set()
        if calls == 1:
            return Reconciler(LocalStore(db), Flaky())  # type: ignore[arg-type]
        return Reconciler(LocalStore(db), Pods(ALIVE), dry_run=True)

    run_forever(make, 0.01, stop, reports.append)
    assert calls == 3 and len(reports) == 2 and all(r.found == 8 for r in reports)


def test_cli_never_creates_a_missing_database(tmp_path: Path) -> None:
    """A mistyped --local-db (or local_db in --config) is an error naming it; nothing is created."""
    missing = tmp_path / "typo" / "ipam.db"
    commands = (["pools"], ["show", "blue-198.51.100.0-24"], ["release", "p", "198.51.100.2", "--yes"],
                ["reconcile", "--pods", f"file:{tmp_path / 'pods.json'}", "--dry-run"])
    for command in commands:
        rc, out, err = run_cli("--local-db", str(missing), *command)
        assert (rc, out) == (2, ""), (command, out, err)
        assert f"--local-db: no database at {missing}" in err, (command, err)
    conf = tmp_path / "net.conf"
    flat = tmp_path / "flat.conf"
    flat.write_text("{}")
    conf.write_bytes(jsonio.dumps({"type": "whereabouts", "datastore": "local", "local_db": str(missing),
                                   "configuration_path": str(flat)}))
    rc, out, err = run_cli("--config", str(conf), "pools")
    assert rc == 2 and f"local_db (from {conf}): no database at {missing}" in err, err
    assert not (tmp_path / "typo").exists()


def test_help_names_the_command_it_was_run_as(capsys: pytest.CaptureFixture[str]) -> None:
    """The bundle entry `pycni-ipam` (cni.__main__ dispatching on argv[0], exactly as frozen) and
    `python -m ipam` each show their own name in the usage line."""
    from cni.__main__ import main as multicall

    with pytest.raises(SystemExit) as done:
        multicall(["/opt/cni/bin/pycni-ipam", "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: pycni-ipam ")
    rc, out, _ = run_cli("--help")
    assert rc == 0 and out.startswith("usage: python -m ipam "), out
