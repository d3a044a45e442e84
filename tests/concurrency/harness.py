"""Running plugin calls the way runtimes do (separate processes), and the consistency checker."""

from __future__ import annotations

import io
import ipaddress
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni import jsonio
from ipam.config import load
from ipam.store.base import Store
from ipam.store.names import pool_name, reservation_name
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO


@dataclass(frozen=True)
class Att:
    """One attachment: a container's interface on a network."""

    cid: str
    ifname: str
    pod: str  # "ns/name"

    def env(self, command: str) -> dict[str, str]:
        ns, name = self.pod.split("/")
        return {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": self.cid,
            "CNI_NETNS": "/run/netns/none",
            "CNI_IFNAME": self.ifname,
            "CNI_PATH": "/usr/lib/cni",
            "NODENAME": "node-1",
            "CNI_ARGS": f"K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID=uid-{self.cid}",
        }


def spawn_all(calls: Iterable[tuple[dict[str, str], dict[str, Any]]]) -> list[tuple[int, Any, str]]:
    """Start every call as its own `python -m cni whereabouts` process at once; wait for all.
    stdin/stdout/stderr are unnamed temp files, so no process waits on a pipe the parent reads later."""
    procs = []
    for env, conf in calls:
        full = {**os.environ, **env, "PYTHONPATH": PYTHONPATH}
        stdin, stdout, stderr = (tempfile.TemporaryFile() for _ in range(3))  # noqa: SIM115
        stdin.write(jsonio.dumps(conf))
        stdin.seek(0)
        p = subprocess.Popen(
            [sys.executable, "-m", "cni", "whereabouts"],
            env=full,
            cwd=REPO,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
        )
        stdin.close()
        procs.append((p, stdout, stderr))
    out = []
    for p, stdout, stderr in procs:
        p.wait(timeout=300)
        stdout.seek(0)
        stderr.seek(0)
        data, err = stdout.read(), stderr.read()
        stdout.close()
        stderr.close()
        out.append((p.returncode, jsonio.loads(data) if data.strip() else None, err.decode()[-2000:]))
    return out


def run_inline(env: dict[str, str], conf: dict[str, Any]) -> tuple[int, Any]:
    """One call through skel in this process (used by worker processes of the storm)."""
    from cni import skel

    out = io.BytesIO()
    rc = skel.run("whereabouts", env, io.BytesIO(jsonio.dumps(conf)), out)
    return rc, jsonio.loads(out.getvalue()) if out.getvalue().strip() else None


def check(
    store: Store, confs: Iterable[dict[str, Any]]
) -> tuple[list[str], dict[tuple[str, str, str], list[str]]]:
    """Problems found, and who holds what: {(network, cid, ifname): [ip, ...]}. Checks that no IP is held
    twice (across overlapping pools too), every allocation is inside its range and has its
    reservation (overlapping on), and every reservation belongs to an allocation. An entry without a
    network (the Kubernetes store with overlapping ranges writes entries without pycni's extras) is
    attributed to the network its reservation names."""
    problems: list[str] = []
    held: dict[str, tuple[str, str, str]] = {}
    owners: dict[tuple[str, str, str], list[str]] = {}
    expected_res: dict[str, tuple[str, str]] = {}
    stored = {r.name: r.owner for r in store.iter_reservations()}
    for conf in confs:
        ipam = load(conf["ipam"], ())  # merged with its flat file, as the plugin does
        for rng in ipam.ranges:
            pool = store.get_pool(pool_name(rng.cidr, ipam.network_name))
            for key, a in pool.allocations.items() if pool else ():
                ip = str(rng.address(int(key)))
                network = a.network
                if not network and ipam.overlapping:  # a lean pool's entry: its reservation names it
                    res = stored.get(reservation_name(ip, ipam.network_name))
                    network = res.network if res is not None and res.same_attachment(a) else ""
                who = (network, a.container_id, a.ifname)
                if not rng.allocatable(int(ipaddress.ip_address(ip))):
                    problems.append(f"{ip} of {who} is not allocatable in {rng.cidr}")
                if ip in held and held[ip] != who:
                    problems.append(f"{ip} held twice: {held[ip]} and {who}")
                held[ip] = who
                same_family = [
                    x for x in owners.get(who, []) if ipaddress.ip_address(x).version == rng.version
                ]
                if same_family:
                    problems.append(f"{who} holds two addresses in one family: {same_family[0]}, {ip}")
                owners.setdefault(who, []).append(ip)
                if ipam.overlapping:
                    expected_res[reservation_name(ip, ipam.network_name)] = (a.container_id, a.ifname)
    found = {name: (owner.container_id, owner.ifname) for name, owner in stored.items()}
    for name, who in expected_res.items():
        if found.get(name) != who:
            problems.append(f"reservation {name}: expected {who}, found {found.get(name)}")
    for name in set(found) - set(expected_res):
        problems.append(f"reservation {name} of {found[name]} has no allocation")
    return problems, owners


def base_conf(name: str, target_ipam: dict[str, Any], tmp: Path, **ipam: Any) -> dict[str, Any]:
    flat = tmp / "whereabouts.conf"
    if not flat.exists():  # node-local state (local_db, and the cluster stores' locks beside it) in tmp
        # the local store unless the target names its own (inline wins)
        doc = {"datastore": "local", "local_db": str(tmp / "state" / "whereabouts.db")}
        flat.write_text(jsonio.dumps(doc).decode())
    return {
        "cniVersion": "1.1.0",
        "name": name,
        "type": "macvlan",
        "ipam": {"type": "whereabouts", "configuration_path": str(flat), **target_ipam, **ipam},
    }
