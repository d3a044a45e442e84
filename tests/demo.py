"""`make demo`: two pod namespaces attached to one veth uplink by pycni's macvlan, addresses from pycni's
whereabouts-compatible IPAM on its embedded (SQLite) store, a ping between them, the pool as the
operator CLI shows it, and everything torn down again. Runs as root; touches nothing outside the
namespaces and the temp dir it creates."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests import nsutil
from tests.ipamutil import write_wrappers


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def ipam_cli(db: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(nsutil.REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "ipam", "--local-db", db, *args],
        env=env,
        check=False,
        capture_output=True,
        text=True,
    )
    print(out.stdout.rstrip() or out.stderr.rstrip(), flush=True)


def main() -> int:
    if not nsutil.is_root():
        print("make demo needs root (it creates network namespaces)", file=sys.stderr)
        return 1
    topo = nsutil.Topology()
    pods = []
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-demo-") as state:
            path = f"{write_wrappers(Path(state) / 'bin')}:/usr/lib/cni"
            flat = Path(state) / "whereabouts.conf"
            flat.write_text("{}")
            db = str(Path(state) / "whereabouts.db")
            conf = {
                "cniVersion": "1.0.0",
                "name": "demo-rdma",
                "type": "macvlan",
                "master": topo.uplink,
                "mode": "bridge",
                "ipam": {
                    "type": "whereabouts",
                    "range": "198.51.100.0/24",
                    "gateway": "198.51.100.1",
                    "ipRanges": [{"range": "2001:db8:d::/64"}],
                    "datastore": "local",
                    "local_db": db,
                    "configuration_path": str(flat),
                },
            }
            step(f"host namespace {topo.host} with uplink {topo.uplink}; IPAM state in {state}")
            for i in (1, 2):
                pod = topo.pod(f"p{i}")
                args = f"K8S_POD_NAMESPACE=demo;K8S_POD_NAME=pod-{i};K8S_POD_UID=demo-uid-{i}"
                call = topo.run(
                    "macvlan", "ADD", conf, netns=pod, container_id=f"demo{i}", path=path, cni_args=args
                )
                if not call.ok:
                    print(call.out, call.stderr, file=sys.stderr)
                    return 1
                pods.append((pod, f"demo{i}", call.out))
                ips = ", ".join(ip["address"] for ip in call.out["ips"])
                step(f"pod {i}: net1 {call.out['interfaces'][0]['mac']} {ips}")
            step("the pools (python -m ipam pools)")
            ipam_cli(db, "pools")
            ipam_cli(db, "show", "198.51.100.0-24")
            target = pods[1][2]["ips"][0]["address"].split("/")[0]
            step(f"ping from pod 1 to pod 2 ({target})")
            name = pods[0][0].rsplit("/", 1)[1]
            ping = nsutil.sh("ip", "netns", "exec", name, "ping", "-c", "3", "-W", "2", target, check=False)
            print(ping.stdout.strip())
            for pod, cid, _ in pods:
                if not topo.run("macvlan", "DEL", conf, netns=pod, container_id=cid, path=path).ok:
                    return 1
            step("DEL done for both pods; the pools are empty again")
            ipam_cli(db, "pools")
            return ping.returncode
    finally:
        topo.close()
        step("namespaces removed")


if __name__ == "__main__":
    sys.exit(main())
