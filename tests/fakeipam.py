"""A small IPAM plugin for tests (run through a wrapper named `fakeipam` in a CNI_PATH directory).

ipam: {"type": "fakeipam", "state": "<file>", "addresses": ["198.51.100.7/24", ...],
       "gateway": "198.51.100.1", "routes": [...], "fail": "ADD" | "DEL" | ...}
Every call is appended to <state>.log as "COMMAND containerID/ifname"; live allocations are the
lines of <state> (one "containerID/ifname" each): ADD adds one, DEL removes it."""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    conf = json.load(sys.stdin)
    ipam = conf["ipam"]
    cmd = os.environ["CNI_COMMAND"]
    owner = f"{os.environ.get('CNI_CONTAINERID')}/{os.environ.get('CNI_IFNAME')}"
    state = ipam["state"]
    with open(state + ".log", "a") as log:
        log.write(f"{cmd} {owner}\n")
    if ipam.get("fail") == cmd:
        print(json.dumps({"cniVersion": conf.get("cniVersion"), "code": 11, "msg": f"fakeipam: {cmd} fails"}))
        return 1
    held: set[str] = set()
    if os.path.exists(state):
        with open(state) as fh:
            held = set(fh.read().split())
    if cmd == "ADD":
        held.add(owner)
    elif cmd == "DEL":
        held.discard(owner)
    with open(state, "w") as fh:
        fh.write("".join(f"{h}\n" for h in sorted(held)))
    if cmd == "ADD":
        ips = [{"address": a, "gateway": ipam.get("gateway")} if ipam.get("gateway") else {"address": a}
               for a in ipam.get("addresses", [])]
        print(json.dumps({"cniVersion": "1.0.0", "ips": ips, "routes": ipam.get("routes", [])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
