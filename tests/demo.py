"""`make demo`: two pod namespaces attached to one veth uplink by pycni's macvlan, addresses from the
IPAM, a ping between them, and everything torn down again. Runs as root; touches nothing outside
the namespaces it creates."""

from __future__ import annotations

import sys
import tempfile

from tests import nsutil


def step(text: str) -> None:
    print(f"==> {text}", flush=True)


def main() -> int:
    if not nsutil.is_root():
        print("make demo needs root (it creates network namespaces)", file=sys.stderr)
        return 1
    topo = nsutil.Topology()
    pods = []
    try:
        with tempfile.TemporaryDirectory(prefix="pycni-demo-") as state:
            conf = {"cniVersion": "1.0.0", "name": "demo-rdma", "type": "macvlan", "master": topo.uplink,
                    "mode": "bridge",
                    "ipam": {"type": "host-local", "dataDir": state,
                             "ranges": [[{"subnet": "198.51.100.0/24"}], [{"subnet": "2001:db8:d::/64"}]]}}
            step(f"host namespace {topo.host} with uplink {topo.uplink}")
            for i in (1, 2):
                pod = topo.pod(f"p{i}")
                call = topo.run("macvlan", "ADD", conf, netns=pod, container_id=f"demo{i}")
                if not call.ok:
                    print(call.out, call.stderr, file=sys.stderr)
                    return 1
                pods.append((pod, f"demo{i}", call.out))
                ips = ", ".join(ip["address"] for ip in call.out["ips"])
                step(f"pod {i}: net1 {call.out['interfaces'][0]['mac']} {ips}")
            target = pods[1][2]["ips"][0]["address"].split("/")[0]
            step(f"ping from pod 1 to pod 2 ({target})")
            ping = nsutil.sh("ip", "netns", "exec", pods[0][0].rsplit("/", 1)[1],
                             "ping", "-c", "3", "-W", "2", target, check=False)
            print(ping.stdout.strip())
            for pod, cid, _ in pods:
                if not topo.run("macvlan", "DEL", conf, netns=pod, container_id=cid).ok:
                    return 1
            step("DEL done for both pods")
            return ping.returncode
    finally:
        topo.close()
        step("namespaces removed")


if __name__ == "__main__":
    sys.exit(main())
