"""`make demo` (`python3.12 -m tests.demo`, as root): pycni's macvlan and IPAM driven the way `cnitool` drives
them, on throw-away network namespaces, showing what a user of local testing wants to see: the network
config, the equivalent cnitool command, the CNI result, the pod's interface from inside, the IPAM's
pools, a ping between two pods, and the teardown.

It needs python3.12, iproute2 and ping, nothing else: no virtualenv (the macvlan and local-store IPAM
paths import only the standard library), no cnitool (each call is made as libcni makes it: CNI_*
variables and the plugin's config on stdin, prevResult on CHECK and DEL). It uses the frozen bundle
when one is built (dist/cni-bin, `make bundle`), the source otherwise; `--source` or `--cni-bin DIR`
choose. Everything it creates carries a per-run prefix (namespaces, links) or lives in one temp dir,
and is removed at the end, also on failure or Ctrl-C; it never touches the machine's own interfaces."""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cni import jsonio

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "conf-examples" / "local" / "macvlan-dualstack-local.conflist"
BUNDLE = REPO / "dist" / "cni-bin"
RUN = "pd" + secrets.token_hex(2)  # every namespace and link of this run starts with it
IFNAME = "net1"


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def show(text: str, indent: str = "    ") -> None:
    print("\n".join(indent + line for line in text.rstrip().splitlines()), flush=True)


def sh(*cmd: str, check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and proc.returncode:
        raise RuntimeError(f"{shlex.join(cmd)}: {proc.stderr.strip()}")
    return proc.stdout


class Plugins:
    """Where the plugins come from: CNI_PATH for the calls, and the operator tool's command."""

    def __init__(self, args: argparse.Namespace, state: Path) -> None:
        bindir = None if args.source else Path(args.cni_bin) if args.cni_bin else BUNDLE
        if bindir is not None and (bindir / "macvlan").exists():
            self.cni_path = str(bindir.resolve())
            self.ipam_tool = [str(bindir.resolve() / "pycni-ipam")]
            self.what = f"the frozen bundle in {self.cni_path}"
            return
        if args.cni_bin:
            raise SystemExit(f"--cni-bin {args.cni_bin}: no macvlan entry there (make bundle builds one)")
        python = [sys.executable, *(["-S"] if sys.flags.no_site else [])]  # the smoke test runs with -S
        wrappers = state / "bin"
        wrappers.mkdir()
        for name in ("macvlan", "whereabouts"):  # what a runtime finds on CNI_PATH
            script = wrappers / name
            script.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec {shlex.join(python)} -m cni {name}\n')
            script.chmod(0o755)
        self.cni_path = str(wrappers)
        self.ipam_tool = [*python, "-m", "ipam"]
        self.what = f"the source in {REPO} ({wrappers}/macvlan runs `python -m cni macvlan`)"

    def ipam(self, *argv: str) -> str:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.run([*self.ipam_tool, *argv], capture_output=True, text=True, env=env, check=False)
        if proc.returncode:
            raise RuntimeError(f"{shlex.join(self.ipam_tool + list(argv))}: {proc.stderr.strip()}")
        return proc.stdout


class Lab:
    """A 'host' namespace with a veth uplink (the master) and pod namespaces, all named RUN-..."""

    def __init__(self) -> None:
        self.namespaces: list[str] = []
        self.host = self.netns("host")
        self.uplink, peer = f"{RUN}up", f"{RUN}pe"
        try:
            sh("ip", "-n", self.host, "link", "add", self.uplink, "type", "veth", "peer", "name", peer)
            for dev in (self.uplink, peer, "lo"):
                sh("ip", "-n", self.host, "link", "set", dev, "up")
        except BaseException:
            self.close()
            raise

    def netns(self, role: str) -> str:
        name = f"{RUN}-{role}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        return name

    def close(self) -> list[str]:
        """Deletes every namespace (their links go with them); returns what is still there."""
        for name in reversed(self.namespaces):
            sh("ip", "netns", "del", name, check=False)
        left = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.startswith(RUN)]
        left += [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").splitlines()
                 if line.split(":")[1].strip().startswith(RUN)]
        return left


def container_id(netns: str) -> str:
    """cnitool's container id: derived from the netns path."""
    return "cnitool-" + hashlib.sha512(netns.encode()).hexdigest()[:20]


class Cnitool:
    """`cnitool VERB NETWORK NETNS` for a one-plugin conflist, as libcni 1.x runs it: the list's name and
    cniVersion injected into the plugin's config, prevResult (the ADD's result) on CHECK and DEL."""

    def __init__(self, lab: Lab, plugins: Plugins, netconf: Path, conflist: dict[str, Any]) -> None:
        self.lab, self.plugins, self.netconf, self.conflist = lab, plugins, netconf, conflist
        self.results: dict[str, Any] = {}

    def environment(self) -> str:
        return f"export CNI_PATH={self.plugins.cni_path} NETCONFPATH={self.netconf} CNI_IFNAME={IFNAME}"

    def command(self, verb: str, netns: str, cni_args: str) -> str:
        args = f"CNI_ARGS={shlex.quote(cni_args)} " if cni_args else ""
        return f"{args}ip netns exec {self.lab.host} cnitool {verb} {self.conflist['name']} {netns}"

    def __call__(self, verb: str, netns: str, cni_args: str = "") -> Any:
        print(f"    $ {self.command(verb, netns, cni_args)}", flush=True)
        conf = {**self.conflist["plugins"][0], "name": self.conflist["name"],
                "cniVersion": self.conflist["cniVersion"]}
        if verb != "add" and netns in self.results:
            conf["prevResult"] = self.results[netns]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        env.update(CNI_COMMAND=verb.upper(), CNI_CONTAINERID=container_id(netns), CNI_NETNS=netns,
                   CNI_IFNAME=IFNAME, CNI_PATH=self.plugins.cni_path, CNI_ARGS=cni_args)
        exe = os.path.join(self.plugins.cni_path, conf["type"])
        proc = subprocess.run(["ip", "netns", "exec", self.lab.host, exe], input=jsonio.dumps(conf),
                              env=env, capture_output=True, check=False)
        if proc.returncode:
            raise RuntimeError(f"{verb} failed (exit {proc.returncode}): {proc.stdout.decode()}"
                               f"{proc.stderr.decode()}")
        result = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
        if verb == "add":
            self.results[netns] = result
        elif verb == "del":
            self.results.pop(netns, None)
        return result


def network_config(lab: Lab, state: Path) -> dict[str, Any]:
    """conf-examples/local/macvlan-dualstack-local.conflist with the demo's uplink as master and the
    IPAM's database and (empty) flat file in the temp dir."""
    conflist: dict[str, Any] = jsonio.loads(EXAMPLE.read_bytes())
    plugin = conflist["plugins"][0]
    plugin["master"] = lab.uplink
    flat = state / "whereabouts.conf"
    flat.write_text("{}")  # so a real node's /etc/cni/net.d/whereabouts.d/whereabouts.conf is not read
    plugin["ipam"].update(local_db=str(state / "whereabouts.db"), configuration_path=str(flat))
    return conflist


def demo(state: Path, plugins: Plugins, lab: Lab) -> int:
    cnitool = write_network_config(state, plugins, lab)
    pods = [f"/run/netns/{lab.netns(f'pod{i}')}" for i in (1, 2)]
    for i, pod in enumerate(pods, 1):
        sh("ip", "-n", os.path.basename(pod), "link", "set", "lo", "up")
        say(f"ADD pod {i} ({pod})")
        result = cnitool("add", pod, f"K8S_POD_NAMESPACE=demo;K8S_POD_NAME=pod-{i}")
        if i == 1:
            show(jsonio.dumps(result, indent=True).decode())
        else:
            show("result: " + ", ".join(ip["address"] for ip in result["ips"]))
    say("CHECK pod 1 against its ADD result")
    cnitool("check", pods[0])
    show("ok")
    name = os.path.basename(pods[0])
    say(f"inside pod 1: ip -n {name} addr show {IFNAME}; ip -n {name} route; ip -n {name} -6 route")
    show(sh("ip", "-n", name, "addr", "show", IFNAME) + sh("ip", "-n", name, "route")
         + sh("ip", "-n", name, "-6", "route"))
    db = str(state / "whereabouts.db")
    say(f"the pools: {shlex.join(plugins.ipam_tool)} --local-db {db} pools")
    pools = plugins.ipam("--local-db", db, "pools")
    show(pools)
    pool = pools.splitlines()[1].split()[0]
    say(f"one pool's allocations: ... show {pool}")
    show(plugins.ipam("--local-db", db, "show", pool))
    failed = ping(pods, [ip["address"].split("/")[0] for ip in cnitool.results[pods[1]]["ips"]])
    for i, pod in enumerate(pods, 1):
        say(f"DEL pod {i}")
        cnitool("del", pod)
    say("the pools after DEL (every address released)")
    show(plugins.ipam("--local-db", db, "pools"))
    return 1 if failed else 0


def write_network_config(state: Path, plugins: Plugins, lab: Lab) -> Cnitool:
    conflist = network_config(lab, state)
    netconf = state / "net.d"
    netconf.mkdir()
    path = netconf / "10-demo.conflist"
    path.write_bytes(jsonio.dumps(conflist, indent=True) + b"\n")
    say(f"network config {path} (from {EXAMPLE.relative_to(REPO)}; master, local_db, configuration_path "
        "changed)")
    show(path.read_text())
    cnitool = Cnitool(lab, plugins, netconf, conflist)
    say("each call below is the one cnitool (1.3.0) makes for the command shown after `$`, with")
    show(cnitool.environment())
    return cnitool


def ping(pods: list[str], targets: list[str]) -> int:
    """Pings each target from the first pod once IPv6 DAD is over; returns how many failed."""
    names = [os.path.basename(pod) for pod in pods]
    say("waiting for IPv6 duplicate address detection in both pods (the kernel tests a new address ~1 s)")
    show(wait_for_dad(names))
    failed = 0
    for target in targets:
        say(f"ping from pod 1 to pod 2: ip netns exec {names[0]} ping -c 2 {target}")
        cmd = ["ip", "netns", "exec", names[0], "ping", "-c", "2", "-i", "0.2", "-W", "2", target]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        show(proc.stdout or proc.stderr)
        failed += proc.returncode != 0
    return failed


def wait_for_dad(namespaces: list[str], timeout: float = 10.0) -> str:
    """Until no address of net1 is tentative in any of the namespaces (or the timeout: ping then says)."""
    start = time.monotonic()
    while True:
        tentative = [ns for ns in namespaces
                     if sh("ip", "-n", ns, "-6", "addr", "show", "dev", IFNAME, "tentative").strip()]
        if not tentative:
            return f"done after {time.monotonic() - start:.1f} s"
        if time.monotonic() - start > timeout:
            return f"still tentative after {timeout:.0f} s in {', '.join(tentative)}"
        time.sleep(0.1)


def missing_tools() -> list[str]:
    return [tool for tool in ("ip", "ping") if shutil.which(tool) is None]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3.12 -m tests.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", action="store_true", help="plugins from source even if a bundle is built")
    p.add_argument("--cni-bin", help=f"a cni-bin dir of the frozen bundle (default: {BUNDLE} if built)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("the demo needs root: it creates network namespaces", file=sys.stderr)
        return 1
    if missing_tools():
        print(f"the demo needs {', '.join(missing_tools())} (Debian: apt-get install iproute2 iputils-ping)",
              file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally blocks below still run
    with tempfile.TemporaryDirectory(prefix="pycni-demo-") as tmp:
        state = Path(tmp)
        plugins = Plugins(args, state)
        lab = Lab()
        try:
            say(f"plugins: {plugins.what}")
            show(f"host namespace {lab.host} with uplink {lab.uplink} (a veth); state in {state}")
            rc = demo(state, plugins, lab)
        except RuntimeError as e:
            print(f"\ndemo failed: {e}", file=sys.stderr)
            rc = 1
        finally:
            left = lab.close()
        say(f"teardown: namespaces {', '.join(lab.namespaces)} deleted (with their links), {state} removed")
        if left:
            print(f"left behind: {left}", file=sys.stderr)
            return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
