"""Concurrency per store (tests/concurrency/stores.py): 200 concurrent ADDs as separate processes on one
pool, then 200 concurrent DELs; and a seeded storm of 1,000 (PYCNI_STORM_CALLS sets it) mixed
ADD/DEL/CHECK/GC calls from 8 worker processes on two networks whose ranges overlap, checked after every
batch, ending with a DEL of every attachment ever added: zero addresses held twice, zero orphans.

The storm runs in cycles. Each begins with a fixed sequence (forced_cycle) that takes every path the storm
claims whatever the order the processes run in: GC freeing a forgotten attachment, a pool exhausted,
takeover with the old sandbox's late DEL, re-ADD, DEL, CHECK of live and of gone attachments; then random
batches drawn from the seed make up the cycle's share of the calls. The paths are asserted on the fixed
sequences (each step asserts its outcome); the random batches' counts, which depend on the interleaving
(which of two racing ADDs finds the pool full), are only printed."""

from __future__ import annotations

import ipaddress
import multiprocessing
import os
import random
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ipam.config import from_dict
from ipam.store.base import Store
from tests.concurrency.harness import Att, base_conf, check, run_inline, spawn_all
from tests.concurrency.stores import NAMES, Target, target_for

SEED = int(os.environ.get("PYCNI_STORM_SEED", "20260917"))
# The storm's length: PYCNI_STORM_CALLS, else 1,000 on every store: two cycles, so every path is taken
# twice (forced_cycle). (2,000 until make test had to fit in 20 minutes: on the real kube-apiserver, whose
# calls the node lock takes one pool write at a time, they took 232 s of it.)
STORM_CALLS = int(os.environ.get("PYCNI_STORM_CALLS") or 1000)


@pytest.fixture(params=NAMES)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    with target_for(request.param, tmp_path, request) as t:  # kubernetes: the real server, a namespace
        yield t


def ips(out: Any) -> list[str]:
    return [ip["address"].split("/")[0] for ip in out["ips"]]


def test_200_concurrent_adds_then_dels(target: Target, tmp_path: Path) -> None:
    conf = base_conf("conc", target.ipam, tmp_path, range="198.18.0.0/24")
    atts = [Att(f"{i:04d}" + "c" * 60, "net1", f"ns/pod-{i}") for i in range(200)]
    results = spawn_all((a.env("ADD"), conf) for a in atts)
    failed = [(a.cid[:4], rc, out, err) for a, (rc, out, err) in zip(atts, results, strict=True) if rc != 0]
    assert not failed, (f"{len(failed)} of 200 failed", failed[:3])
    got = [ips(out)[0] for _, out, _ in results]
    assert len(set(got)) == 200
    assert all(ipaddress.ip_address(x) in ipaddress.ip_network("198.18.0.0/24") for x in got)
    store = target.open()
    try:
        problems, owners = check(store, [conf])
        assert not problems, problems[:10]
        assert {k[1]: v for k, v in owners.items()} == {a.cid: [x] for a, x in zip(atts, got, strict=True)}
        results = spawn_all((a.env("DEL"), conf) for a in atts)
        assert all(rc == 0 for rc, _, _ in results), [r for r in results if r[0] != 0][:3]
        pool = store.get_pool("198.18.0.0-24")
        assert pool is not None and dict(pool.allocations) == {}
        assert list(store.iter_reservations()) == []
    finally:
        store.close()


class Storm:
    """The driver's model: which attachment holds which addresses, per network."""

    def __init__(self, confs: dict[str, dict[str, Any]], rnd: random.Random) -> None:
        self.confs, self.rnd = confs, rnd
        self.live: dict[str, dict[Att, list[str]]] = {n: {} for n in confs}
        self.forgotten: dict[str, set[Att]] = {n: set() for n in confs}  # leaked: only GC frees them
        self.counter = 0
        self.every: dict[str, set[Att]] = {n: set() for n in confs}  # all ever added: the final DEL
        self.stats: Counter[str] = Counter()  # every call by path, random batches included

    def new_att(self) -> Att:
        self.counter += 1
        return Att(
            f"s{self.counter:05d}", self.rnd.choice(["net1", "net2"]), f"ns{self.counter % 7}/p{self.counter}"
        )

    def forget(self, net: str, att: Att) -> None:
        """The runtime lost it: no DEL will come; only GC may free it."""
        self.forgotten[net].add(att)
        del self.live[net][att]

    def batch(self) -> list[Op]:
        """Up to 16 random operations on distinct pods (a runtime never runs two at once for one
        container)."""
        ops: list[Op] = []
        busy: set[str] = set()
        for _ in range(self.rnd.randint(1, 16)):
            net = self.rnd.choice(sorted(self.confs))
            live = [a for a in self.live[net] if a.pod not in busy]
            r = self.rnd.random()
            if r < 0.45 or not live:
                att = self.new_att()
                ops.append(("add", net, att, None))
            elif r < 0.52:
                att = self.rnd.choice(live)
                ops.append(("readd", net, att, None))
            elif r < 0.60:
                old = self.rnd.choice(live)
                att = Att(old.cid + "r", old.ifname, old.pod)
                ops.append(("takeover", net, att, old))
            elif r < 0.66:
                att = self.rnd.choice(live)
                ops.append(("forget", net, att, None))
            elif r < 0.74:
                att = self.rnd.choice(live)
                ops.append(("check", net, att, None))
            elif r < 0.77 and self.every[net] - set(self.live[net]):
                att = self.rnd.choice(sorted(self.every[net] - set(self.live[net]), key=lambda a: a.cid))
                if att.pod in busy:
                    continue
                ops.append(("check-gone", net, att, None))
            else:
                att = self.rnd.choice(live)
                ops.append(("del", net, att, None))
            busy.add(att.pod)
        return ops


Op = tuple[str, str, Att, Att | None]  # (path, network, attachment, the one a takeover replaces)
COMMAND = {"del": "DEL", "del-old": "DEL", "check": "CHECK", "check-gone": "CHECK"}
# the paths every cycle's fixed sequence takes at least this often (forced_cycle), whatever the interleaving
PER_CYCLE = {"add": 6, "check": 2, "takeover": 2, "del-old": 2, "readd": 2, "del": 2, "gc": 4,
             "check-gone": 8, "exhausted": 1}  # fmt: skip
CYCLE_CALLS = 400  # one cycle (its fixed sequence, then random batches) per this many calls, at least 2


def _call(op: str, conf: dict[str, Any], att: Att) -> tuple[int, Any]:
    return run_inline(att.env(COMMAND.get(op, "ADD")), conf)


def _gc(conf: dict[str, Any], valid: list[dict[str, str]]) -> tuple[int, Any]:
    env = {"CNI_COMMAND": "GC", "CNI_PATH": "/usr/lib/cni", "NODENAME": "node-1"}
    return run_inline(env, {**conf, "cni.dev/valid-attachments": valid})


class Driver:
    """Runs the storm's calls on the worker processes, follows their outcomes in the model and checks the
    store against it after every batch. `forced`: the paths the fixed sequences took (forced_cycle)."""

    def __init__(self, storm: Storm, pool: ProcessPoolExecutor, store: Store) -> None:
        self.storm, self.pool, self.store = storm, pool, store
        self.calls = 0
        self.forced: Counter[str] = Counter()

    def run(self, ops: list[Op], forced: bool = False, late_del: bool | None = None) -> Counter[str]:
        """One batch (distinct pods, concurrently); the paths it took. `late_del`: whether a takeover's old
        sandbox DEL follows (None: as the seed draws)."""
        storm = self.storm
        for op, net, att, _ in ops:
            if op == "forget":
                storm.forget(net, att)
        runnable = [o for o in ops if o[0] != "forget"]
        futures = [self.pool.submit(_call, op, storm.confs[net], att) for op, net, att, _ in runnable]
        seen: Counter[str] = Counter()
        for (op, net, att, old), fut in zip(runnable, futures, strict=True):
            rc, out = fut.result()
            seen[op] += 1
            if op != "check-gone" and not op.startswith("del"):
                storm.every[net].add(att)
            if op == "del":
                assert rc == 0, out
                del storm.live[net][att]
            elif op == "check":
                assert rc == 0, (att, out)
            elif op == "check-gone":  # forgotten and not yet GC'd: still held; deleted or taken over: not
                if att in storm.forgotten[net]:
                    assert rc == 0, (att, out)
                else:
                    assert rc == 1 and out["code"] == 105, (att, out)
            elif rc != 0:
                assert out["code"] == 100 and op == "add", (op, out)
                seen["exhausted"] += 1
            elif op == "add":
                storm.live[net][att] = ips(out)
            elif op == "readd":
                assert ips(out) == storm.live[net][att]
            else:  # takeover: same pod and ifname, new container id, same addresses
                assert old is not None and ips(out) == storm.live[net].pop(old)
                storm.live[net][att] = ips(out)
                late = storm.rnd.random() < 0.5 if late_del is None else late_del
                if late:  # the old sandbox's DEL arrives late: must not release
                    rc, out = self.pool.submit(_call, "del-old", storm.confs[net], old).result()
                    assert rc == 0, out
                    seen["del-old"] += 1
        self.record(seen, forced)
        return seen

    def gc(self, net: str, forced: bool = False) -> None:
        """GC of one network with the live attachments valid: frees the forgotten ones."""
        valid = [{"containerID": a.cid, "ifname": a.ifname} for a in self.storm.live[net]]
        rc, out = self.pool.submit(_gc, self.storm.confs[net], valid).result()
        assert rc == 0, out
        self.storm.forgotten[net].clear()
        self.record(Counter(gc=1), forced)

    def record(self, seen: Counter[str], forced: bool) -> None:
        self.storm.stats.update(seen)
        if forced:
            self.forced.update(seen)
        self.calls += sum(n for path, n in seen.items() if path != "exhausted")
        self.verify()

    def verify(self) -> None:
        """The store holds what the model says: no address twice, no orphan; every live attachment its
        addresses; a forgotten one whatever it held (until GC)."""
        storm = self.storm
        problems, owners = check(self.store, storm.confs.values())
        assert not problems, f"seed {SEED}, after {self.calls} calls: {problems[:10]}"
        expected = {
            (net, a.cid, a.ifname): sorted(v) for net in storm.confs for a, v in storm.live[net].items()
        }
        for net in storm.confs:
            expected.update(
                {
                    (net, a.cid, a.ifname): sorted(owners.get((net, a.cid, a.ifname), []))
                    for a in storm.forgotten[net]
                }
            )
        assert {k: sorted(v) for k, v in owners.items()} == expected, f"seed {SEED}, after {self.calls} calls"


def chunks[T](items: list[T], size: int = 16) -> list[list[T]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def capacity(conf: dict[str, Any]) -> int:
    """How many attachments the network can hold at most: the addresses of its smallest range."""
    return min(rng.size for rng in from_dict(conf["ipam"]).ranges)


def forced_cycle(d: Driver, full: str) -> None:
    """A fixed sequence that takes every path the storm claims, whatever the processes' interleaving
    (each step asserts its outcome): DEL of every live attachment and GC of the forgotten ones (nothing
    held); three ADDs per network; CHECK of one, takeover of another (its old sandbox's DEL arriving
    late), ADD of the third again; the first forgotten, the third deleted; CHECK of the gone ones (the
    deleted and the replaced: code 105; the forgotten: still held); GC, then CHECK of the collected one
    (code 105); then more new attachments on network `full` than its smallest range has addresses: at
    least one ADD is told the pool is exhausted (code 100); they are deleted again (the random batches
    start with room: a full network A leaves B's ADDs stepping over A's reservations one by one)."""
    s = d.storm
    nets = sorted(s.confs)
    for chunk in chunks([(net, a) for net in nets for a in sorted(s.live[net], key=lambda a: a.cid)]):
        d.run([("del", net, a, None) for net, a in chunk], forced=True)
    for net in nets:
        d.gc(net, forced=True)
    assert not any(s.live.values()) and not any(s.forgotten.values())  # (verify: the store holds nothing)
    fresh = {net: [s.new_att() for _ in range(3)] for net in nets}
    seen = d.run([("add", net, a, None) for net in nets for a in fresh[net]], forced=True)
    assert seen["exhausted"] == 0 and all(a in s.live[net] for net in nets for a in fresh[net])
    ops: list[Op] = []
    for net in nets:
        first, second, third = fresh[net]
        successor = Att(second.cid + "r", second.ifname, second.pod)
        ops += [("check", net, first, None), ("takeover", net, successor, second)]
        ops.append(("readd", net, third, None))
    d.run(ops, forced=True, late_del=True)
    for net in nets:
        s.forget(net, fresh[net][0])
    d.run([("del", net, fresh[net][2], None) for net in nets], forced=True)
    d.run([("check-gone", net, a, None) for net in nets for a in (fresh[net][2], fresh[net][1])], forced=True)
    d.run([("check-gone", net, fresh[net][0], None) for net in nets], forced=True)  # forgotten: still held
    for net in nets:
        d.gc(net, forced=True)
    d.run([("check-gone", net, fresh[net][0], None) for net in nets], forced=True)  # collected: gone
    exhausted, fill = 0, [s.new_att() for _ in range(capacity(s.confs[full]) + 1)]
    for group in chunks(fill):
        exhausted += d.run([("add", full, a, None) for a in group], forced=True)["exhausted"]
    assert exhausted >= 1, f"{full}: more new attachments than addresses, and none was refused"
    for group in chunks([a for a in fill if a in s.live[full]]):
        d.run([("del", full, a, None) for a in group], forced=True)


def test_seeded_storm_then_del_of_everything(target: Target, tmp_path: Path) -> None:
    total = STORM_CALLS
    cycles = max(2, total // CYCLE_CALLS)
    rnd = random.Random(SEED)
    confs = {
        "netA": base_conf("netA", target.ipam, tmp_path, range="198.18.1.0/26", exclude=["198.18.1.48/29"]),
        "netB": base_conf(
            "netB",
            target.ipam,
            tmp_path,
            ipRanges=[{"range": "198.18.1.0/27"}, {"range": "2001:db8:1::/122"}],
        ),
    }
    storm = Storm(confs, rnd)
    store = target.open()
    ctx = multiprocessing.get_context("forkserver")
    try:
        with ProcessPoolExecutor(8, mp_context=ctx) as pool:
            d = Driver(storm, pool, store)
            for cycle in range(cycles):
                forced_cycle(d, sorted(confs)[cycle % len(confs)])  # each network filled in turn
                while d.calls < total * (cycle + 1) // cycles:
                    if rnd.random() < 0.12:
                        d.gc(rnd.choice(sorted(confs)))
                    else:
                        d.run(storm.batch())
            d.calls += del_everything(storm, pool)
        problems, owners = check(store, confs.values())
        assert not problems and owners == {}, f"seed {SEED}: after DEL of all: {problems[:10]} {owners}"
        orphans = [r.name for r in store.iter_reservations()]
        orphans += [f"{p.name}/{k}" for p in store.iter_pools() for k in p.allocations]
        assert orphans == [], f"seed {SEED}: orphans after DEL of everything: {orphans[:10]}"
    finally:
        store.close()
    print(f"storm seed {SEED}: {d.calls} calls, {cycles} cycles, forced {dict(d.forced)}, "
          f"all {dict(storm.stats)}")
    # every path taken, by construction (forced_cycle): these counts do not depend on the interleaving
    short = {path: d.forced[path] for path, n in PER_CYCLE.items() if d.forced[path] < n * cycles}
    assert not short, (short, cycles)


def del_everything(storm: Storm, pool: ProcessPoolExecutor) -> int:
    """The runtime DELs every attachment it ever added (live, forgotten or already deleted), 16 at a
    time, in parallel."""
    todo = [(net, att) for net in sorted(storm.every)
            for att in sorted(storm.every[net], key=lambda a: a.cid)]
    for chunk in chunks(todo):
        futures = [pool.submit(_call, "del", storm.confs[net], att) for net, att in chunk]
        for (net, att), fut in zip(chunk, futures, strict=True):
            rc, out = fut.result()
            assert rc == 0, (net, att, out)
    return len(todo)
