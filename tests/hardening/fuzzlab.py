"""A lab for calling every plugin in-process with hostile input and proving nothing is left behind.

The test process plays the runtime: each call runs `cni.skel.run` on this thread after entering the
lab's "host" namespace (setns is per thread), so `opened(None)` reaches the lab's veths, never the
machine's. Device plugins see the fake sysfs tree and the recording VF seam (tests/devlab.py); the
IPAM is pycni's whereabouts, run in-process as the frozen bundle does, on a SQLite file in the lab or
on one shared in-memory store. `leftovers()` lists every kernel object, record or allocation that a
call left: links in the pod, changed host links, device records, changed VF settings, allocations."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio, log, netns, skel
from cni.netlink import links
from cni.netlink.socket import opened
from ipam.store.base import Store
from tests import launch
from tests.concurrency.stores import Target
from tests.devlab import VF_PCIS, Lab
from tests.fakevf import FakeVf
from tests.logtee import PYTHONPATH
from tests.memstore import Backend, MemoryStore
from tests.nsutil import REPO, Topology

SECRET = "PYCNI-SECRET-fuzz-7f3a"  # never valid anywhere; the log grep looks for the prefix


@dataclass
class Outcome:
    rc: int
    out: Any  # the decoded stdout (None when empty)
    raw: bytes

    def error(self) -> tuple[int, str]:
        return int(self.out["code"]), f"{self.out.get('msg', '')} {self.out.get('details', '')}"


@dataclass
class FuzzLab:
    tmp: Path
    store: str = "local"  # "local" (SQLite file) or "memory" (one shared backend, in-process only)
    topo: Topology = field(default_factory=Topology)
    target: Target | None = None  # a tests/concurrency/stores.py target: its ipam keys and store

    def __post_init__(self) -> None:
        self.host_fd = -1
        try:
            self._build()
        except BaseException:  # nobody holds the lab yet: its namespaces and links go here
            self.close()
            raise

    def _build(self) -> None:
        self.lab = Lab(self.topo, self.tmp)
        self.pod = self.topo.pod()
        self.host_fd = os.open(f"/run/netns/{self.topo.host}", os.O_RDONLY | os.O_CLOEXEC)
        self.db = self.tmp / "ipam-state" / "whereabouts.db"
        self.default_db = self.tmp / "default-ipam" / "whereabouts.db"
        self.default_state = self.tmp / "default-devices"
        self.flat = self.tmp / "whereabouts.conf"
        self.flat.write_text("{}")
        wrapper = self.lab.bin / "whereabouts"  # what a CNI_PATH holds; in-process it is only found
        wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m cni whereabouts\n")
        wrapper.chmod(0o755)
        self.a_file = self.tmp / "not-a-netns"
        self.a_file.write_text("x")
        self.a_dir = self.tmp / "a-dir"
        self.a_dir.mkdir()
        self.backend = Backend()
        self.baseline = self.host_links()
        self.vfs0 = self.lab.vf_table()
        self.calls = 0

    def close(self) -> None:
        if self.host_fd >= 0:
            os.close(self.host_fd)
            self.host_fd = -1
        self.topo.close()

    # ---- configurations and environments -----------------------------------------------------------

    def ipam(self, **extra: Any) -> dict[str, Any]:
        local = {"datastore": "local", "local_db": str(self.db), "etcd_password": SECRET}
        store = self.target.ipam if self.target is not None else local
        return {"type": "whereabouts", "range": "198.18.4.0/28", "configuration_path": str(self.flat),
                "log_level": "debug", **store, **extra}

    def conf(self, plugin: str, **extra: Any) -> dict[str, Any]:
        """A valid configuration of `plugin` in this lab (ADD succeeds with it)."""
        base: dict[str, Any] = {"cniVersion": "1.0.0", "name": f"fz-{plugin}", "type": plugin}
        if plugin == "macvlan":
            base |= {"master": self.topo.uplink, "mode": "bridge", "ipam": self.ipam()}
        elif plugin == "host-device":
            base |= {"device": self.lab.nic, "stateDir": str(self.lab.state_dir), "ipam": self.ipam()}
        elif plugin == "sriov":
            base |= {"deviceID": VF_PCIS[0], "vlan": 100, "spoofchk": "off", "mac": "02:00:00:00:aa:01",
                     "stateDir": str(self.lab.state_dir), "ipam": self.ipam()}
        else:
            base |= {"ipam": self.ipam()}
        return base | extra

    def env(self, command: str, **extra: str) -> dict[str, str]:
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "fz0123", "CNI_NETNS": self.pod,
               "CNI_IFNAME": "net1", "CNI_PATH": str(self.lab.bin), "NODENAME": "node-fz",
               "CNI_ARGS": "IgnoreUnknown=true;K8S_POD_NAMESPACE=fz;K8S_POD_NAME=p;K8S_POD_UID=u-1",
               **self.lab.env()}
        env.update(extra)
        return env

    @property
    def pod_name(self) -> str:
        return os.path.basename(self.pod)

    def netns_paths(self) -> dict[str, str]:
        """Netns choices: the pod, a plain file, a directory, a missing path, the plugin's own
        namespace, a namespace that is not a network namespace, empty, relative."""
        return {"pod": self.pod, "file": str(self.a_file), "dir": str(self.a_dir),
                "missing": str(self.tmp / "gone"), "own": "/proc/self/ns/net", "mnt": "/proc/self/ns/mnt",
                "empty": "", "relative": "run/netns/x", "dev-null": "/dev/null"}

    # ---- calling -----------------------------------------------------------------------------------

    def call(self, plugin: str, env: Mapping[str, str], stdin: bytes) -> Outcome:
        out = io.BytesIO()
        saved = log._STATE.get()
        self.calls += 1
        try:
            with netns.entered(self.host_fd), self._store():
                rc = skel.run(plugin, env, io.BytesIO(stdin), out)
        finally:
            opened = log._STATE.get().file
            if opened is not None and opened != saved.file:
                os.close(opened[1])
            log._STATE.set(saved)
        raw = out.getvalue()
        return Outcome(rc, jsonio.loads(raw) if raw.strip() else None, raw)

    @contextlib.contextmanager
    def _store(self) -> Iterator[None]:
        """The IPAM runs in-process (as in the frozen bundle); the memory store replaces the local one."""
        import pytest

        from cni.registry import IN_PROCESS_IPAM

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("cni.delegate._in_process_module", lambda kind, binary: IN_PROCESS_IPAM.get(kind))
            # a path field mutated to null or "" selects the default: the lab's stand-ins, never the node's
            mp.setattr("ipam.config.DEFAULT_LOCAL_DB", str(self.default_db))
            mp.setattr("cni.device.conf.DEFAULT_DIR", str(self.default_state))
            if self.store == "memory":
                mp.setattr("ipam.store.select.open_store", lambda conf: MemoryStore(self.backend))
            # the sysfs root is the process's (cni.sriov.sysfs), as in the lab's plugin processes
            mp.setenv("PYCNI_SYSFS_ROOT", str(self.lab.sysfs))
            # the recording VF seam, installed as tests/launch.py installs it in a plugin process
            fake_pf = str(self.lab.fake_pf)
            mp.setattr("cni.sriov.vf.factory", lambda: FakeVf(fake_pf))
            yield

    def open_store(self) -> Store:
        if self.target is not None:
            return self.target.open()
        if self.store == "memory":
            return MemoryStore(self.backend)
        from ipam.store.local import LocalStore

        return LocalStore(str(self.db))

    # ---- what is left ------------------------------------------------------------------------------

    def host_links(self) -> dict[str, tuple[str, int, bool]]:
        with opened(self.host_fd) as nl:
            return {link.name: (link.mac, link.mtu, link.up) for link in links.dump(nl)}

    def pod_links(self) -> list[str]:
        with netns.opened(self.pod) as fd, opened(fd) as nl:
            return sorted(link.name for link in links.dump(nl) if link.name != "lo")

    def allocations(self) -> list[str]:
        found = self._allocations(self.open_store())
        if self.default_db.exists():
            from ipam.store.local import LocalStore

            found += [f"default store: {x}" for x in self._allocations(LocalStore(str(self.default_db)))]
        return found

    @staticmethod
    def _allocations(store: Store) -> list[str]:
        try:
            held = [f"{p.name}/{k}:{a.container_id}" for p in store.iter_pools()
                    for k, a in p.allocations.items()]
            return held + [f"reservation {r.name}" for r in store.iter_reservations()]
        except Exception as e:  # a store the fuzz made unusable is a finding too
            return [f"store unreadable: {e}"]
        finally:
            store.close()

    def leftovers(self) -> list[str]:
        found = [f"pod link {n}" for n in self.pod_links()]
        now = self.host_links()
        for name in sorted(set(now) | set(self.baseline)):
            if now.get(name) != self.baseline.get(name):
                found.append(f"host link {name}: {self.baseline.get(name)} -> {now.get(name)}")
        found += [f"record {k}/{n}" for k, v in self.lab.records().items() for n in v]
        for sub in ("attachments", "owners", "locks"):
            d = self.default_state / sub
            found += [f"default state dir: {sub}/{n}" for n in (os.listdir(d) if d.is_dir() else [])]
        locks = self.lab.state_dir / "locks"
        found += [f"lock file {n}" for n in (os.listdir(locks) if locks.is_dir() else [])]
        if self.lab.vf_table() != self.vfs0:
            found.append("VF settings changed")
        found += self.allocations()
        return found

    def restore_standins(self) -> list[str]:
        """Recreate the veth stand-ins that died with a temporary namespace (a physical device
        returns to the initial namespace instead; a virtual one is destroyed). Returns their names."""
        from tests.nsutil import sh

        now = self.host_links()
        gone = [n for n in self.baseline if n not in now]
        for name in gone:
            if name.endswith("x") and name[:-1] in gone:
                continue  # the peer of a pair recreated below
            peer = name + "x"
            sh("ip", "-n", self.topo.host, "link", "add", name, "type", "veth", "peer", "name", peer)
            for dev in (name, peer):
                mac, mtu, up = self.baseline[dev]
                sh("ip", "-n", self.topo.host, "link", "set", dev, "address", mac, "mtu", str(mtu),
                   *(["up"] if up else []))
        return gone

    def reset(self) -> None:
        """After a finding: put the lab back so the next example starts clean (best effort)."""
        import shutil

        for name in self.pod_links():
            with netns.opened(self.pod) as fd, opened(fd) as nl:
                link = links.get(nl, name)
                if link is not None:
                    links.delete(nl, link.index)
        shutil.rmtree(self.lab.state_dir, ignore_errors=True)
        shutil.rmtree(self.db.parent, ignore_errors=True)
        self.backend.pools.clear()
        self.backend.reservations.clear()


def run_process(lab: FuzzLab, plugin: str, env: Mapping[str, str], stdin: bytes,
                cwd: Path | None = None, faults: str = "") -> Outcome:
    """The same call as a real process (`python -m cni PLUGIN` with the recording VF seam and `faults`
    installed by tests/launch.py, inside the lab's host namespace; the IPAM alone stays in this
    namespace: it touches no link, and its store may listen on loopback)."""
    import subprocess

    full = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    full.update(env)
    full["PYTHONPATH"] = PYTHONPATH
    cmd = launch.command(plugin, faults, lab.lab.fake_pf)
    if plugin != "whereabouts":
        cmd = ["ip", "netns", "exec", lab.topo.host, *cmd]
    envb = {os.fsencode(k): os.fsencode(v) for k, v in full.items()}
    proc = subprocess.run(cmd, input=stdin, env=envb, capture_output=True, check=False,
                          cwd=cwd or REPO, timeout=120)
    out = jsonio.loads(proc.stdout) if proc.stdout.strip() else None
    return Outcome(proc.returncode, out, proc.stdout + b"\n--stderr--\n" + proc.stderr)
