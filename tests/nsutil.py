"""Network namespaces and links for tests: every name carries a per-run prefix, and exactly what a
test created is deleted at teardown, even when the test fails.

Names: RUN is 'pt' + 4 hex digits (per test process); each Topology adds a 2-digit counter, so link
names such as 'pt1a2b07up' stay within the 15-byte limit."""

from __future__ import annotations

import itertools
import os
import secrets
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio
from tests.logtee import PYTHONPATH

RUN = os.environ.get("PYCNI_TEST_RUN") or "pt" + secrets.token_hex(2)
REPO = Path(__file__).resolve().parent.parent
_counter = itertools.count(1)


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def is_root() -> bool:
    return os.geteuid() == 0


def plugin_command(plugin: str, seams: Sequence[str] = ()) -> list[str]:
    """How to run a plugin: PYCNI_PLUGIN_DIR (a frozen cni-bin dir) or from source. `seams`: options of
    tests/launch.py (faults, the fake VF seam), which exist only from source: a test that needs them
    is skipped in the frozen passes (the source pass runs it; the frozen code is the same)."""
    bindir = os.environ.get("PYCNI_PLUGIN_DIR")
    if seams:
        if bindir:
            import pytest

            from tests.skips import SOURCE_ONLY

            pytest.skip(SOURCE_ONLY)
        return [sys.executable, "-m", "tests.launch", *seams, "--", plugin]
    if bindir:
        return [os.path.join(bindir, plugin)]
    return [sys.executable, "-m", "cni", plugin]


@dataclass
class Call:
    rc: int
    out: Any
    stderr: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


@dataclass
class Topology:
    """A 'host' namespace holding an uplink veth pair, plus any number of 'pod' namespaces."""

    tag: str = field(default_factory=lambda: f"{RUN}{next(_counter):02d}")
    namespaces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.uplink = f"{self.tag}up"
        self.peer = f"{self.tag}pe"
        try:
            self.host = self.netns("h")
            sh("ip", "-n", self.host, "link", "add", self.uplink, "type", "veth", "peer", "name", self.peer)
            for dev in (self.uplink, self.peer, "lo"):
                sh("ip", "-n", self.host, "link", "set", dev, "up")
        except BaseException:  # nobody holds the topology yet: what it made goes here
            self.close()
            raise

    def netns(self, role: str) -> str:
        name = f"{self.tag}{role}"
        sh("ip", "netns", "add", name)
        self.namespaces.append(name)
        return name

    def pod(self, role: str = "p") -> str:
        """A new pod namespace; returns its path (what CNI_NETNS carries)."""
        name = self.netns(role)
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return f"/run/netns/{name}"

    def add_uplink(self, suffix: str, mtu: int = 1500) -> str:
        """Another veth pair in the host namespace; returns the name of its end used as master."""
        name, peer = f"{self.tag}{suffix}", f"{self.tag}{suffix}x"
        sh("ip", "-n", self.host, "link", "add", name, "mtu", str(mtu), "type", "veth", "peer", "name", peer)
        for dev in (name, peer):
            sh("ip", "-n", self.host, "link", "set", dev, "up")
        return name

    def run(self, plugin: str, command: str, conf: Mapping[str, Any] | bytes, *, netns: str = "",
            ifname: str = "net1", container_id: str = "c1", cni_args: str = "",
            env: Mapping[str, str] | None = None, path: str = "/usr/lib/cni",
            seams: Sequence[str] = ()) -> Call:
        """Run `plugin` inside the host namespace, as a runtime would (`seams`: see plugin_command)."""
        data = conf if isinstance(conf, bytes) else jsonio.dumps(dict(conf))
        proc = self._spawn(plugin, command, netns, ifname, container_id, cni_args, env, path, seams,
                           subprocess.PIPE)
        stdout, stderr = proc.communicate(data)
        out = jsonio.loads(stdout) if stdout.strip() else None
        return Call(proc.returncode, out, stderr.decode(errors="replace"))

    def start(self, plugin: str, command: str, conf: Mapping[str, Any], *, netns: str = "",
              ifname: str = "net1", container_id: str = "c1", env: Mapping[str, str] | None = None,
              path: str = "/usr/lib/cni") -> subprocess.Popen[bytes]:
        """`run` without waiting for the plugin: its process (`ip netns exec` execs it: the pid is the
        plugin's), its stdin a pipe holding the configuration (a few hundred bytes: far below a pipe's
        buffer), its stdout and stderr pipes."""
        r, w = os.pipe()
        try:
            os.write(w, jsonio.dumps(dict(conf)))
        finally:
            os.close(w)
        try:
            return self._spawn(plugin, command, netns, ifname, container_id, "", env, path, (), r)
        finally:
            os.close(r)

    def _spawn(self, plugin: str, command: str, netns: str, ifname: str, container_id: str, cni_args: str,
               env: Mapping[str, str] | None, path: str, seams: Sequence[str], stdin: int
               ) -> subprocess.Popen[bytes]:  # fmt: skip
        full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
        full.update(CNI_COMMAND=command, CNI_CONTAINERID=container_id, CNI_NETNS=netns,
                    CNI_IFNAME=ifname, CNI_PATH=path, CNI_ARGS=cni_args, PYTHONPATH=PYTHONPATH)
        full.update(env or {})
        cmd = ["ip", "netns", "exec", self.host, *plugin_command(plugin, seams)]
        return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full,
                                cwd=REPO)

    def ip(self, ns: str, *args: str) -> str:
        """`ip` inside a namespace given by name or /run/netns path."""
        return sh("ip", "-n", os.path.basename(ns), *args).stdout

    def links(self, ns: str) -> list[dict[str, Any]]:
        return list(jsonio.loads(sh("ip", "-j", "-d", "-n", os.path.basename(ns), "link", "show").stdout))

    def link(self, ns: str, name: str) -> dict[str, Any] | None:
        return next((link for link in self.links(ns) if link["ifname"] == name), None)

    def addrs(self, ns: str, name: str) -> list[str]:
        out = sh("ip", "-j", "-n", os.path.basename(ns), "addr", "show", "dev", name, check=False).stdout
        if not out.strip():
            return []
        return [f"{a['local']}/{a['prefixlen']}" for dev in jsonio.loads(out)
                for a in dev.get("addr_info", []) if a.get("scope") != "link"]

    def close(self) -> None:
        for name in reversed(self.namespaces):
            delete_netns(name)
        self.namespaces.clear()


NETNS_DIR = "/run/netns"


def delete_netns(name: str) -> None:
    """`ip netns del name`, and the copy of its mount a shared "/" may have left behind.

    While a cluster runs, "/" is a shared mount (../shared/upstream kube-node-up), and the bind mount
    `ip` makes of /run/netns (the first time it needs one) joins "/"'s peer group: each namespace
    mounted there is propagated to "/" as a copy at the same path, hidden under the /run/netns mount.
    Unmounted while the two are peers, the copy goes too. If the cluster went down meanwhile ("/"
    private again), `ip netns del` unmounts ours but not the copy, and the file stays (EBUSY): the
    namespace outlives the test. Then the /run/netns mount is moved aside for the time of one umount
    (it hides the copy; its parent "/" is private now, so it may be moved) and put back."""
    sh("ip", "netns", "del", name, check=False)
    path = os.path.join(NETNS_DIR, name)
    if not os.path.exists(path) or not _shadowed(path):
        return
    import fcntl
    import tempfile

    with open("/run/lock/pycni-tests-netns-unshadow.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hold = tempfile.mkdtemp(prefix="pycni-netns-")
        sh("mount", "--move", NETNS_DIR, hold)
        try:
            sh("umount", path, check=False)
            os.unlink(path)
        finally:
            sh("mount", "--move", hold, NETNS_DIR)
            os.rmdir(hold)


def _shadowed(path: str) -> bool:
    """Whether a mount at `path` hangs from another mount than the one at /run/netns (see
    delete_netns): a copy the /run/netns mount hides."""
    rows = [line.split() for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    netns_mounts = {r[0] for r in rows if r[4] == NETNS_DIR}
    return bool(netns_mounts) and any(r[4] == path and r[1] not in netns_mounts for r in rows)


def leftovers() -> list[str]:
    """Namespaces and root-namespace links of this run still present."""
    ns = [line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line.startswith(RUN)]
    links = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").stdout.splitlines()
             if line.split(":")[1].strip().startswith(RUN)]
    return ns + links


def cleanup_run() -> None:
    for name in leftovers():
        delete_netns(name)
        sh("ip", "link", "del", name, check=False)
