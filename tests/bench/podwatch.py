"""Pods deleted without a DEL: how fast and at what API cost they are freed, pycni's pod watch (the agent's
ipam/podwatch.py) against upstream whereabouts v0.9.4's ip-control-loop, on one real kube-apiserver
(../shared/upstream kube-up), in the same run, alternating (not a timed test).

One "node" (a Node object, no kubelet), one dual-stack NAD (198.51.100.0/24 and 2001:db8:77::/64: two
pools, two reservations per pod). Each round, for each implementation: its watcher is started (pycni's
PodWatch with the node's ServiceAccount as the agent opens it; upstream's control loop chrooted as
tests/kubeapi/wbupstream.py runs it), and then for each of `--pods` pods: the pod is created on the node
with Multus' network-status annotation (upstream needs it to find the pools), attached by that
implementation's own plugin (ours in-process, upstream's binary), deleted with grace period 0 and no
DEL, and:

- latency: from just before the DELETE to the pools and reservations observed free (polled every 20 ms
  through an admin connection);
- requests: apiserver_request_total (every verb and resource but the metrics endpoint) counted from the
  DELETE until the implementation said it was done (pycni: its sweep's report; upstream: its
  "IPAddressGarbageCollected" events for both addresses, logged), then settled 1 s, the test's own
  DELETE and polls subtracted (each poll is one LIST of pools and one of reservations: counted
  separately and taken off). The kube-apiserver's own lease renewals fall in the same window now and
  then (`leases`): reported, not taken off.

    python -m tests.bench.podwatch [--rounds 3] [--pods 5]"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipam import podwatch
from ipam.podwatch import Job
from ipam.reconciler import Report
from tests import kubeup
from tests.kubeapi import wbupstream
from tests.kubeapi.wbupstream import ControlLoop, Implementation, cni_env

V4, V6 = "198.51.100.0/24", "2001:db8:77::/64"
NAD: dict[str, Any] = {"cniVersion": "1.0.0", "name": "bench-net", "type": "macvlan",
       "ipam": {"type": "whereabouts", "ipRanges": [{"range": V4}, {"range": V6}]}}
POLL = 0.02
NAD_NAME = "bench-net"

type Result = tuple[float, dict[tuple[str, str], float]]  # seconds, requests by (verb, resource)


class Bench:
    def __init__(self, tmp: Path) -> None:
        (tmp / "kube-up").mkdir()
        self.server = kubeup.KubeServer.start(tmp / "kube-up")
        self.tenant = kubeup.Tenant(self.server, tmp / "tenant")
        self.ns = self.tenant.namespace
        self.node = f"bench-{self.ns}"
        wbupstream.create_node(self.server, self.node)
        wbupstream.create_nad(self.tenant, NAD)
        admin = wbupstream.admin_kubeconfig(self.server, tmp / "upstream" / "admin.kubeconfig", self.ns)
        binary = kubeup.unpack("whereabouts") / "whereabouts"
        self.impls = {"pycni": Implementation("ours", tmp / "ours" / "whereabouts.conf", self.tenant.node),
                      "upstream": Implementation("upstream", tmp / "upstream" / "whereabouts.conf", admin,
                                                 binary)}  # fmt: skip
        self.tmp = tmp
        self.serial = 0

    def close(self) -> None:
        self.server.stop()

    def counts(self) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for (verb, resource, _), n in self.server.request_counts().items():
            if resource:
                key = (verb.lower(), resource)
                out[key] = out.get(key, 0.0) + n
        return out

    def held(self, podref: str) -> bool:
        pools, reservations = self.tenant.pools(), self.tenant.reservations()  # two LISTs, always
        return any(a.get("podref") == podref for p in pools.values() for a in p.values()) or any(
            r.get("podref") == podref for r in reservations.values())

    def attach(self, impl: str) -> tuple[str, str]:
        """A pod on the node, attached by `impl`, with its network-status; (name, uid)."""
        self.serial += 1
        name = f"{impl[:2]}-{self.serial}"
        uid = self.tenant.create_pod(name, node=self.node)["metadata"]["uid"]
        env = cni_env("ADD", f"c{self.serial:063d}", "net1", f"{self.ns}/{name}", uid, self.node)
        rc, out = self.impls[impl].call(env, NAD)
        assert rc == 0, out
        ips = [str(ip["address"]).split("/")[0] for ip in out["ips"]]
        wbupstream.set_network_status(self.tenant, name, [(NAD_NAME, "net1", ips)])
        assert self.held(f"{self.ns}/{name}")
        return name, uid

    def one(self, impl: str, done: Callable[[str, float], None]) -> Result:
        """Delete one attached pod; (seconds until observed free, requests in the window)."""
        name, _ = self.attach(impl)
        podref = f"{self.ns}/{name}"
        before = self.counts()
        started = time.monotonic()
        self.tenant.delete_pod(name)
        polls = 0
        while self.held(podref):
            polls += 1
            assert time.monotonic() - started < 120, f"{impl}: {podref} not freed in 120 s"
            time.sleep(POLL)
        took = time.monotonic() - started
        done(name, started)
        time.sleep(1.0)
        after = self.counts()
        sent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        sent[("delete", "pods")] -= 1
        sent[("list", "ippools")] -= polls + 1
        sent[("list", "overlappingrangeipreservations")] -= polls + 1
        return took, {k: v for k, v in sent.items() if v}


def pycni_round(b: Bench, pods: int) -> list[Result]:
    flat = b.impls["pycni"].flat
    cond = threading.Condition()
    seen: list[Job] = []

    def report(job: Job, _: Report) -> None:
        with cond:
            seen.append(job)
            cond.notify_all()

    w = podwatch.open_pod_watch(b.node, str(flat))
    w.on_report = report
    w.start()
    try:
        with cond:  # the start-up sweep: listed and watching
            assert cond.wait_for(lambda: bool(seen), 60)

        def done(name: str, _: float) -> None:
            with cond:
                assert cond.wait_for(lambda: any((b.ns, name) in j.gone for j in seen), 60)

        return [b.one("pycni", done) for _ in range(pods)]
    finally:
        w.close()


def upstream_round(b: Bench, pods: int, serial: int) -> list[Result]:
    loop = ControlLoop(b.server, b.ns, b.node, b.tmp / f"control-loop-{serial}" / "root")
    loop.start()
    time.sleep(2.0)  # its informers' first lists (it logs no "synced")

    expected = [seen_before(loop)]

    def done(name: str, _: float) -> None:  # both addresses' events logged
        expected[0] += 2
        end = time.monotonic() + 60
        while seen_before(loop) < expected[0]:
            assert time.monotonic() < end, loop.tail()
            time.sleep(0.05)

    try:
        return [b.one("upstream", done) for _ in range(pods)]
    finally:
        loop.stop()


def seen_before(loop: ControlLoop) -> int:
    return loop.log.read_text(errors="replace").count("IPAddressGarbageCollected")


def summary(name: str, results: list[Result]) -> dict[str, Any]:
    lat = sorted(t for t, _ in results)
    total: dict[tuple[str, str], float] = {}
    for _, sent in results:
        for k, v in sent.items():
            total[k] = total.get(k, 0) + v
    per_pod = {f"{verb} {res}": round(v / len(results), 2) for (verb, res), v in sorted(total.items())}
    no_leases = sum(v for (_, res), v in total.items() if res != "leases") / len(results)
    return {"impl": name, "median_s": round(statistics.median(lat), 3), "max_s": round(lat[-1], 3),
            "requests_per_pod": round(no_leases, 2), "by_verb": per_pod}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pods", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pycni-podwatch-bench-") as d:
        b = Bench(Path(d))
        try:
            for r in range(args.rounds):
                ours = pycni_round(b, args.pods)
                theirs = upstream_round(b, args.pods, r)
                print(f"round {r + 1}: {summary('pycni', ours)}")
                print(f"round {r + 1}: {summary('upstream', theirs)}")
        finally:
            b.close()


if __name__ == "__main__":
    main()
