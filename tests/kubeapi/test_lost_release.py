"""A DEL answered must leave its address free (issue 26: after 1,000 successful DELs on a full pool, 10
OverlappingRangeIPReservations stayed behind with no pool entry). On the real kube-apiserver, with the
faults a loaded server produces injected at the step that lost the deletion, deterministically:

- the pool write is applied by the server but its answer is lost (a read timeout or a 504: StoreBusy,
  retried): the retry reads the pool without the DEL's entries, and the reservations they held must
  still be released (ipam.engine: Op.sent);
- a reservation DELETE that gets no answer (StoreBusy) is judged again on the stored object, not given
  up (ipam.reservations.release);
- a release that keeps failing is the DEL's error (code 11), never an answer of success: the runtime's
  retried DEL frees it.

Each runs in the agent's mode (ipam.batch.install) and the first also as a plugin process (no sharing)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni.errors import CniError, Code
from ipam import batch, combiner, exec_plain, rbac
from ipam.config import IpamConfig, from_dict
from ipam.engine import Engine
from ipam.kubeapi import Client, load_kubeconfig
from ipam.model import Allocation, Pool, PoolUpdate, Reservation
from ipam.retry import Retry
from ipam.store.base import StoreBusy, StoreUnavailable
from ipam.store.kube import KubeStore
from tests.kubeup import Tenant

A = Allocation("a" * 64, "ns/a", "net1", "uid-a", "blue", "node-1")
POOL = "198.51.100.0-24"


class Faulty(KubeStore):
    """The real server's store, with faults: the next `lose` pool writes that remove entries are
    applied by the server and then answered as a read timeout; the next `unanswered` reservation
    DELETEs are not sent and answered as one; the next `down` are refused as unreachable."""

    lose = unanswered = down = 0
    lost = refused = 0

    def commit_pool(self, pool: Pool, update: PoolUpdate) -> str:
        version = super().commit_pool(pool, update)
        if update.remove and self.lose:
            self.lose -= 1
            self.lost += 1
            raise StoreBusy("kubernetes: patch ippools: injected: applied, answer lost (read timeout)")
        return version

    def delete_reservation(self, res: Reservation) -> None:
        if self.unanswered:
            self.unanswered -= 1
            self.refused += 1
            raise StoreBusy("kubernetes: delete overlappingrangeipreservations: injected: no answer")
        if self.down:
            self.down -= 1
            self.refused += 1
            raise StoreUnavailable("kubernetes: delete overlappingrangeipreservations: injected: 503")
        super().delete_reservation(res)


def _faulty(tenant: Tenant) -> Faulty:
    conf = load_kubeconfig(str(tenant.node))
    return Faulty(Client(conf), conf.namespace, role=rbac.NODE)


def _conf(tenant: Tenant, tmp: Path) -> IpamConfig:
    return from_dict({"range": "198.51.100.0/24", "datastore": "kubernetes",
                      "kubernetes": {"kubeconfig": str(tenant.node)},
                      "local_db": str(tmp / "state" / "whereabouts.db")})  # fmt: skip


@contextlib.contextmanager
def _agent() -> Iterator[None]:
    """This process shares pool writes between its threads as the agent does."""
    batch.install()
    try:
        yield
    finally:
        assert combiner.settle_all(60), "pool batches still under way after 60 s"
        batch.uninstall()


def _added(tenant: Tenant, tmp: Path) -> IpamConfig:
    conf = _conf(tenant, tmp)
    [(_, offset)] = Engine(_faulty(tenant), conf).add(A)  # (a plugin process' ADD)
    assert offset == 1 and len(tenant.reservations()) == 1
    assert len(tenant.pools()[POOL]) == 1
    return conf


def _freed(tenant: Tenant) -> None:
    assert tenant.pools() == {POOL: {}}
    assert tenant.reservations() == {}


@pytest.mark.parametrize("mode", ["agent", "plugin"])
def test_a_del_whose_pool_write_answer_is_lost_still_frees_the_reservation(
    tenant: Tenant, tmp_path: Path, mode: str
) -> None:
    conf = _added(tenant, tmp_path)
    store = _faulty(tenant)
    store.lose = 1
    execute = batch.run if mode == "agent" else exec_plain.run
    engine = Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=execute)
    with _agent() if mode == "agent" else contextlib.nullcontext():
        engine.delete(A)
    assert store.lost == 1  # the write was applied and its answer lost: the retry found the pool freed
    _freed(tenant)


def test_a_reservation_delete_without_an_answer_is_judged_again(tenant: Tenant, tmp_path: Path) -> None:
    conf = _added(tenant, tmp_path)
    store = _faulty(tenant)
    store.unanswered = 1
    engine = Engine(store, conf, reopen=lambda: contextlib.nullcontext(store), execute=batch.run)
    with _agent():
        engine.delete(A)
    assert store.refused == 1
    _freed(tenant)


def test_a_release_that_fails_is_the_dels_error_and_its_retry_frees_it(
    tenant: Tenant, tmp_path: Path
) -> None:
    """The store refuses the release for longer than the outage grace (0 here): the agent's batch wrote
    the pool, and the DEL fails with code 11 (never answered as done while its reservation stays); the
    runtime's retried DEL frees the reservation."""
    conf = _added(tenant, tmp_path)
    store = _faulty(tenant)
    store.down = 2  # the DELETE with the known version, then the retried one: the whole first release
    engine = Engine(store, conf, Retry(outage=0.0), reopen=lambda: contextlib.nullcontext(store),
                    execute=batch.run)
    with _agent():
        with pytest.raises(CniError) as err:
            engine.delete(A)
        assert err.value.code == Code.TRY_AGAIN_LATER and store.refused == 2
        assert tenant.pools() == {POOL: {}} and len(tenant.reservations()) == 1
        engine.delete(A)  # the runtime's retry
    _freed(tenant)
