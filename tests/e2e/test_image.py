"""The image, built and run for real (issue 15): `bundler.image` builds bundler/Dockerfile offline with
podman (Debian's, runc) on a base of exactly the libraries the frozen bundle loads from the system,
once per session and twice (a second build id for the upgrade); then the containers run as
bundler/manifests describes them. Every podman option below is derived from the manifests (command,
host namespaces, securityContext, env, volume mounts), so what is tested is what a cluster runs:

- the image is the Dockerfile's: its entry point, /pycni/cni-bin identical to the frozen layout, and
  nothing else but the base, whose every library belongs to a Debian package the registry base has;
- every command the manifests name runs in the image, as the user and with the root filesystem the
  manifests give it;
- the installer container installs into host directories mounted as the DaemonSet mounts them, is
  replaced by the second image version while plugin entries run in a loop on the host (0 failures,
  the old build until the switch, the new one after it), and uninstalls;
- the agent container, with the DaemonSet's mounts and host network and pids, serves a macvlan ADD and
  DEL made on the host.

Runs once, in make test's frozen pass without the agent (it needs the frozen bundle; the agent pass
would only build the same image again). Podman uses a test-private --root/--runroot, containers.conf,
tmp dir and network config dir; images and containers carry the run prefix and are removed at the end.
Host paths are directories of the test's own, except /var/run/netns, which the agent must share with
the host to open the pod namespaces the test creates there (with the run prefix, as every test does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bundler import image, manifest, state
from cni import jsonio
from tests import agentutil
from tests.bundle_layouts import snapshot, variant
from tests.e2e import bundle_driver
from tests.nsutil import RUN, Topology, is_root
from tests.skips import FROZEN_ONLY, ROOT
from tests.unit import test_manifests as tm

NODE, NAMESPACE = "node-image-test", "pycni-system"  # the downward API values the DaemonSet reads
# status.podIP: with hostNetwork the node's address; the agent container runs in the test's own host
# namespace, where 127.0.0.1 is that namespace's loopback
FIELDS = {"spec.nodeName": NODE, "metadata.namespace": NAMESPACE, "status.podIP": "127.0.0.1"}


def container_env(c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet gives it: the downward API's FIELDS, the ConfigMaps of
    the manifests as shipped (the node's CNI directories: pycni-node)."""
    return tm.env_of(c, tm.docs(), **FIELDS)


def expand(args: list[str], c: dict[str, Any]) -> list[str]:
    """The container's args with $(VAR) references to its env expanded, as the kubelet does."""
    env = container_env(c)
    return [tm.expand(arg, env) for arg in args]
START_TIMEOUT = 120.0  # a container start plus an install pass on a loaded 2-core machine


def frozen_layout() -> Path:
    frozen = bundle_driver.frozen_dir()
    if frozen is None:
        pytest.skip(FROZEN_ONLY)  # the image holds the frozen bundle
    if not is_root():
        pytest.skip(f"{ROOT}podman with runc, host namespaces")
    for tool in ("podman", "runc", "nsenter", "ldd", "dpkg"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} missing: bash .ci/apt-deps installs it")
    return frozen


@dataclass
class Podman:
    tmp: Path
    short: Path  # podman refuses a runroot longer than 50 characters

    def prefix(self) -> list[str]:
        return ["env", f"CONTAINERS_CONF={self.tmp / 'containers.conf'}", "podman", "--root",
                str(self.tmp / "root"), "--runroot", str(self.short / "rr"), "--storage-driver", "vfs"]

    def __call__(self, *args: str, netns: str = "", timeout: float = 180) -> subprocess.CompletedProcess[str]:
        enter = ["nsenter", f"--net=/run/netns/{netns}"] if netns else []
        return subprocess.run([*enter, *self.prefix(), *args], capture_output=True, text=True, check=False,
                              timeout=timeout)

    def ok(self, *args: str, netns: str = "") -> str:
        got = self(*args, netns=netns)
        assert got.returncode == 0, (args, got.stdout, got.stderr)
        return got.stdout


CONTAINERS_CONF = """[containers]
default_ulimits = ["nproc=1024:1024", "nofile=1024:1024"]
[network]
network_backend = "cni"
network_config_dir = "{tmp}/net.d"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "{tmp}/events.log"
tmp_dir = "{tmp}/podman-tmp"
"""


@dataclass
class Images:
    podman: Podman
    v1: image.Built
    v2: image.Built
    layout: Path  # the frozen cni-bin layout in v1
    tmp: Path


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    layout = frozen_layout()
    tmp = tmp_path_factory.mktemp("image")
    (tmp / "containers.conf").write_text(CONTAINERS_CONF.format(tmp=tmp))
    pm = Podman(tmp, Path(tempfile.mkdtemp(prefix="pycni-im-")))
    bridge = Path("/sys/class/net/cni-podman0")  # podman's default network, should a run ever use it
    had_bridge = bridge.exists()
    try:
        v1 = image.build_image(layout, f"localhost/{RUN}-pycni:1", tmp / "work1", pm.prefix())
        version = manifest.load(layout / manifest.FILENAME).version
        second = variant(layout, tmp / "layout2" / "cni-bin", version + "+image2")
        v2 = image.build_image(second, f"localhost/{RUN}-pycni:2", tmp / "work2", pm.prefix())
        yield Images(pm, v1, v2, layout, tmp)
    finally:
        pm("rm", "--all", "--force", "--time", "0")
        pm("rmi", "--all", "--force")
        shutil.rmtree(pm.short, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)  # the storage, build contexts and the second layout
        if not had_bridge and bridge.exists():  # made by this session's podman: remove exactly that
            subprocess.run(["ip", "link", "delete", "cni-podman0"], check=False)


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = tm.by_kind("DaemonSet")[0]["spec"]["template"]["spec"]
    return spec


def container_of(spec: dict[str, Any], name: str) -> dict[str, Any]:
    c: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == name)
    return c


def run_options(spec: dict[str, Any], c: dict[str, Any], host: Callable[[str], Path]) -> list[str]:
    """podman options for container c of pod spec, as the manifests say; `host` maps a hostPath (or
    `emptyDir/<name>`, `configMap/<name>`) to the directory of the test's own that stands for it.
    Resources are not applied (cgroup limits are the kubelet's, not something the image decides)."""
    # a pod network is the kubelet's business: no podman network (its default one would add the bridge
    # cni-podman0 to the machine's root namespace)
    opts = ["--network", "host" if spec.get("hostNetwork") else "none"]
    opts += ["--pid", "host"] if spec.get("hostPID") else []
    sc = c.get("securityContext", {})
    if sc.get("privileged"):
        opts.append("--privileged")
    if sc.get("readOnlyRootFilesystem"):
        opts += ["--read-only", "--read-only-tmpfs=false"]  # a kubelet adds no tmpfs either
    if sc.get("allowPrivilegeEscalation") is False:
        opts += ["--security-opt", "no-new-privileges"]
    for cap in sc.get("capabilities", {}).get("drop", []):
        opts += ["--cap-drop", cap]
    if "runAsUser" in sc:
        opts += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
    for name, value in container_env(c).items():
        opts += ["--env", f"{name}={value}"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for m in c.get("volumeMounts", []):
        v = volumes[m["name"]]
        source = next(k for k in v if k != "name")  # hostPath, emptyDir, configMap
        src = host(v["hostPath"]["path"] if source == "hostPath" else f"{source}/{m['name']}")
        mode = ["ro" if m.get("readOnly") else "rw"]
        if m.get("mountPropagation") == "HostToContainer":
            mode.append("rslave")
        opts += ["--volume", f"{src}:{m['mountPath']}:{','.join(mode)}"]
    return opts


@dataclass
class HostDirs:
    """The node's directories, as directories of the test's own (DirectoryOrCreate: made on demand),
    but for `shared`, used as they are (the agent's /var/run/netns, see the module docstring)."""

    root: Path
    shared: frozenset[str] = frozenset()

    def __call__(self, path: str) -> Path:
        if path in self.shared:
            return Path(path)
        d = self.root / path.strip("/").replace("/", "_")
        d.mkdir(parents=True, exist_ok=True)
        return d


def test_the_image_is_the_dockerfile_on_a_base_of_the_bundles_libraries(images: Images) -> None:
    pm, v1 = images.podman, images.v1
    config = json.loads(pm.ok("image", "inspect", "--format", "{{json .Config}}", v1.tag))
    assert config["Entrypoint"] == tm.dockerfile()[1] == ["/pycni/cni-bin/pycni-install"]
    assert config["Labels"]["io.pycni.build"] == v1.build
    mounted = Path(pm.ok("image", "mount", v1.tag).strip())
    try:
        tree = snapshot(mounted)
    finally:
        pm("image", "unmount", v1.tag)
    [(src, dst)] = tm.dockerfile()[0]
    assert src == image.IMAGE_LAYOUT
    inside = dst.strip("/") + "/"
    layout = {k[len(inside):]: v for k, v in tree.items() if k.startswith(inside)}
    assert layout == snapshot(images.layout), "the image's /pycni/cni-bin is the frozen layout"
    copied = {str(Path(*Path(dst.strip("/")).parts[:n])) for n in range(1, len(Path(dst).parts))}
    base = {k: v for k, v in tree.items() if k not in copied and not k.startswith(inside)}
    assert base == snapshot(images.tmp / "work1" / "rootfs"), "the rest is the base, nothing else"
    libs = image.libraries(images.layout)
    assert {Path(p).name for p in libs} >= {"libc.so.6", "libz.so.1", "libgcc_s.so.1"}
    for lib in libs:
        owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True, check=True).stdout
        assert owner.split(":")[0] in image.REGISTRY_BASE_PACKAGES, (lib, owner)


def test_every_command_the_manifests_name_runs_in_the_image(images: Images, tmp_path: Path) -> None:
    """Each container's own command, as its own user, read-only root and mounts, from the image: the
    program is there and starts (its --help; the installer and agent then run for real below)."""
    host = HostDirs(tmp_path)
    seen = set()
    for kind in ("DaemonSet", "Deployment"):
        spec = tm.by_kind(kind)[0]["spec"]["template"]["spec"]
        for c in spec["containers"]:
            for cmd in (c["command"], c.get("readinessProbe", {}).get("exec", {}).get("command")):
                if not cmd:
                    continue
                got = images.podman("run", "--rm", *run_options(spec, c, host),
                                    "--entrypoint", cmd[0], images.v1.tag, "--help")
                assert got.returncode == 0 and "usage:" in got.stdout, (c["name"], cmd, got.stderr)
                seen.add(cmd[0])
    assert seen == {"/pycni/cni-bin/pycni-install", "/pycni/cni-bin/pycni-agent", "/pycni/cni-bin/pycni-ipam"}


@dataclass
class Loop:
    """Plugin entries of the host bin dir called one after another until stopped: what answered each
    call (the build in the entry's about line), and every failure."""

    entry: Path
    builds: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:  # no CNI_COMMAND: the entry prints "pycni macvlan <build>" (skel's about)
                call = subprocess.run([str(self.entry)], env={}, capture_output=True, timeout=60, check=False)
            except (OSError, subprocess.SubprocessError) as e:
                self.failures.append(repr(e))
                continue
            words = call.stderr.decode(errors="replace").split()
            if call.returncode != 0 or words[:2] != ["pycni", self.entry.name] or len(words) < 3:
                self.failures.append(f"rc={call.returncode} {call.stdout[:80]!r} {call.stderr[-200:]!r}")
            else:
                self.builds.append(words[2])

    def wait_for(self, what: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline and not self.stop.is_set(), (self.builds[-5:], self.failures)
            time.sleep(0.05)


def wait_ready(pm: Podman, name: str, probe: list[str]) -> None:
    """The DaemonSet's readinessProbe, exec'd in the container, until it passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while pm("exec", name, *probe).returncode != 0:
        running = pm("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
        logs = pm("logs", name)
        assert running == "true" and time.monotonic() < deadline, (running, logs.stdout, logs.stderr)
        time.sleep(0.5)


def test_installer_container_installs_upgrades_under_load_and_uninstalls(images: Images,
                                                                         tmp_path: Path) -> None:
    pm, spec = images.podman, pod_spec()
    c = container_of(spec, "installer")
    host = HostDirs(tmp_path)
    opts = run_options(spec, c, host)
    bin_dir, conf_dir = host("/opt/cni/bin"), host("/etc/cni/net.d")
    before = (snapshot(bin_dir), snapshot(conf_dir))
    probe = c["readinessProbe"]["exec"]["command"]

    def start(built: image.Built) -> str:
        name = f"{RUN}-installer-{built.tag.rsplit(':', 1)[1]}"
        pm.ok("run", "--detach", "--name", name, *opts, "--entrypoint", c["command"][0], built.tag,
              *expand(c["command"][1:], c))
        wait_ready(pm, name, probe)
        return name

    first = start(images.v1)
    assert state.load(bin_dir).build == images.v1.build
    v1_dir = state.load(bin_dir).current
    flat = (conf_dir / "whereabouts.d" / "whereabouts.conf").read_text()
    assert "/etc/cni/net.d/" in flat and "/host/" not in flat and NODE in (conf_dir / "whereabouts.d" /
                                                                          "nodename").read_text()
    loop = Loop(bin_dir / "macvlan")
    t = threading.Thread(target=loop.run, daemon=True)
    t.start()
    try:
        loop.wait_for(lambda: len(loop.builds) >= 5)
        pm.ok("stop", "--time", "10", first)  # a rolling update: SIGTERM, then the new version starts
        assert state.load(bin_dir).build == images.v1.build, "a stopped installer removes nothing"
        second = start(images.v2)
        assert state.load(bin_dir).build == images.v2.build
        loop.wait_for(lambda: loop.builds[-5:] == [images.v2.build] * 5)
    finally:
        loop.stop.set()
        t.join(60)
    assert not loop.failures, loop.failures[:5]
    switch = loop.builds.index(images.v2.build)
    assert switch >= 5 and set(loop.builds[:switch]) == {images.v1.build}
    assert set(loop.builds[switch:]) == {images.v2.build}, "once switched, never back"
    st = state.load(bin_dir)
    assert list(st.retired) == [v1_dir] and (bin_dir / state.HOME / v1_dir).is_dir(), "kept for --grace"
    pm.ok("stop", "--time", "10", second)
    gone = pm("run", "--rm", *opts, "--entrypoint", c["command"][0], images.v2.tag,
              *expand(c["command"][1:], c), "--uninstall", "--once")
    assert gone.returncode == 0, gone.stderr
    assert (snapshot(bin_dir), snapshot(conf_dir)) == before


def test_agent_container_serves_a_plugin_call_made_on_the_host(images: Images, topo: Topology,
                                                               tmp_path: Path) -> None:
    pm, spec = images.podman, pod_spec()
    c = container_of(spec, "agent")
    host = HostDirs(tmp_path, shared=frozenset({"/var/run/netns"}))
    opts = run_options(spec, c, host)
    shutil.copytree(images.layout, host("/opt/cni/bin"), symlinks=True, dirs_exist_ok=True)
    name = f"{RUN}-agent"
    pm.ok("run", "--detach", "--name", name, *opts, "--entrypoint", c["command"][0], images.v1.tag,
          *expand(c["command"][1:], c), netns=topo.host)  # host network: the test's host namespace
    try:
        sock = host("/run/pycni") / "agent.fifo"
        deadline = time.monotonic() + START_TIMEOUT
        while not agentutil.connectable(sock):
            running = pm("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert running == "true" and time.monotonic() < deadline, pm("logs", name).stderr
            time.sleep(0.2)
        pod = topo.pod().replace("/run/netns/", "/var/run/netns/")  # the path the DaemonSet mounts
        conf = {"cniVersion": "1.0.0", "name": "image-net", "type": "macvlan", "master": topo.uplink,
                "ipam": {"type": "whereabouts", "range": "198.51.100.0/24", "datastore": "local",
                         "local_db": f"/var/lib/cni/{RUN}/whereabouts.db"}}

        def call(command: str) -> subprocess.CompletedProcess[bytes]:
            env = {"CNI_COMMAND": command, "CNI_CONTAINERID": f"{RUN}-image", "CNI_NETNS": pod,
                   "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin", "PATH": os.defpath,
                   "PYCNI_AGENT_FIFO": str(sock)}
            return subprocess.run(["nsenter", f"--net=/run/netns/{topo.host}",
                                   str(images.layout / "macvlan")], input=jsonio.dumps(conf), env=env,
                                  capture_output=True, timeout=120, check=False)

        added = call("ADD")
        assert added.returncode == 0, (added.stdout, added.stderr, pm("logs", name).stderr)
        result = jsonio.loads(added.stdout)
        assert result["ips"][0]["address"].startswith("198.51.100.")
        assert topo.link(topo.namespaces[-1], "net1") is not None
        assert (host("/var/lib/cni") / RUN / "whereabouts.db").exists(), "the IPAM ran in the container"
        deleted = call("DEL")
        assert deleted.returncode == 0, (deleted.stdout, deleted.stderr)
        assert topo.link(topo.namespaces[-1], "net1") is None
        pm.ok("stop", "--time", "10", name)
        logs = pm("logs", name)
        log = logs.stdout + logs.stderr
        assert f"(build {images.v1.build}" in log
        assert "served macvlan ADD rc=0" in log and "served macvlan DEL rc=0" in log, log
        assert not sock.exists(), "a stopped agent removes its FIFO (calls then run in-process)"
    finally:
        pm("rm", "--force", "--time", "0", name)
