"""A real single-node cluster for the cluster suite (../shared/upstream/kube-node-up: kube-apiserver,
scheduler, controller-manager, kubelet, containerd + runc, Multus thin plugin, kube-proxy) and pycni
installed on it as an operator does: the image built offline and imported into the node's containerd
(no registry), then `kubectl apply -k` of docs/install.md's overlay for a node with other CNI directories,
under the suite's own layer (`write_overlay`).

One cluster per session. `KUBE_PROXY=1` (the `kubernetes` Service, which the installer's kubeconfig and
the reconciler's in-cluster client use) allows one cluster per host, and two CI runs may share this
machine: `KubeProxyLock` serialises them with a host-wide flock, held from before kube-node-up until
kube-node-down has returned, and then waits (bounded) for a claim of the kit's own by a cluster that
is not ours to go away.

The node's runtime environment carries PYCNI_AGENT_FIFO (containerd inherits kube-node-up's
environment, Multus and the plugins inherit containerd's): the agent's FIFO lives in the test's own
directory, never in /run/pycni, and two clusters on one host never share an agent."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests import kubeup
from tests.nsutil import REPO, RUN

UPSTREAM = kubeup.UPSTREAM
MANIFESTS = REPO / "bundler" / "manifests"
# one kube-proxy per host (the kit refuses a second one at once): every pycni cluster suite on this host
# takes this lock first. /run/lock is the host's lock directory; the file is empty and stays there.
KUBE_PROXY_LOCK = Path("/run/lock/pycni-cluster-kube-proxy.lock")
REGISTRY = "registry.pycni.test/pycni"  # the image as a user's registry would name it (never pulled)
NS = "pycni-system"


def absent() -> str:
    """Why the suite cannot run here ("" when it can): only ../shared missing is a reason to skip."""
    return kubeup.shared_missing("kube-node-up")


def wait_for[T](what: str, probe: Callable[[], T | None], timeout: float = 180.0, every: float = 0.5) -> T:
    """Poll `probe` until it returns something other than None/False; AssertionError after `timeout`
    naming `what` (a bounded wait on a condition, never a sleep standing for synchronisation)."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class KubeProxyLock:
    """The host-wide flock serialising KUBE_PROXY=1 clusters of pycni suites (see the module doc)."""

    def __init__(self, path: Path = KUBE_PROXY_LOCK) -> None:
        self.path = path
        self.fd = -1

    def acquire(self, timeout: float = 1800.0) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{self.path}: another cluster suite held it for {timeout:.0f} s") from None
                time.sleep(1.0)
        # a cluster of someone else (kube-node-smoke by hand) may hold the kit's kube-proxy claim
        shared = Path(os.environ.get("KUBE_NODE_SHARED", "/run/kube-node"))

        def free() -> bool:
            try:
                owner = (shared / "kube-proxy").read_text().strip()
            except OSError:
                return True
            return not owner or not Path(owner).is_dir()

        wait_for("the kit's kube-proxy claim held by another cluster to go away", free, timeout=900.0,
                 every=2.0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing the last descriptor releases the flock
            self.fd = -1


@dataclass
class Cluster:
    dir: Path
    env: dict[str, str]
    host: Path  # directories of the test's own standing for the node's /run/pycni and /var/lib/cni

    @property
    def cni_bin_dir(self) -> Path:
        return Path(self.env["CNI_BIN_DIR"])

    @property
    def cni_conf_dir(self) -> Path:
        return Path(self.env["CNI_CONF_DIR"])

    @property
    def agent_fifo_dir(self) -> Path:
        return self.host / "run-pycni"

    @property
    def devinfo_dir(self) -> Path:
        """The node's device-info directory as this test has it (the agent mounts it read-only)."""
        return self.host / "devinfo"

    @property
    def state_dir(self) -> Path:
        """The node's /var/lib/cni as this test has it (the agent mounts it at the same path)."""
        return self.host / "var-lib-cni"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 300) -> subprocess.CompletedProcess[str]:
        got = subprocess.run(["kubectl", "--kubeconfig", self.env["KUBECONFIG"], *args], input=input,
                             capture_output=True, text=True, check=False, timeout=timeout)
        if check and got.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({got.returncode}): {got.stderr[-2000:]}")
        return got

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def drop_namespace(self, ns: str, timeout: float = 300.0) -> None:
        """Delete `ns` and wait until its pods are gone (the kubelet tore their sandboxes down: every
        DEL ran), not for the rest of the namespace's finalization: the namespace controller takes
        seconds more for objects nothing here reads again (the cluster goes with the suite). A
        terminating namespace takes no new pods, so no controller of it brings one back meanwhile."""
        self.kubectl("delete", "namespace", ns, "--wait=false", check=False)

        def gone() -> bool:
            got = self.kubectl("-n", ns, "get", "pods", "-o", "name", check=False)
            return got.returncode == 0 and not got.stdout.strip()

        wait_for(f"the pods of namespace {ns} to go", gone, timeout)

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    def ctr_ok(self, *args: str) -> bool:
        """`ctr ARGS` succeeded (containerd answering)."""
        return subprocess.run([*self.env["CTR"].split(), *args], capture_output=True, check=False,
                              timeout=60).returncode == 0

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.env["CTR"].split(), *args], capture_output=True, text=True,
                              check=True, timeout=300)


def up(workdir: Path, kube_proxy: bool = True) -> Cluster:
    """kube-node-up with MULTUS=1 and KUBE_PROXY=1 (the caller holds KubeProxyLock); `kube_proxy=False`:
    without kube-proxy (no lock needed; then the `kubernetes` Service does not work: see `api_env`)."""
    host = workdir / "host"
    (host / "run-pycni").mkdir(parents=True)
    (host / "var-lib-cni").mkdir()
    (host / "devinfo").mkdir()
    env = {**os.environ, "MULTUS": "1", "KUBE_PROXY": "1" if kube_proxy else "0", "UP_TMPDIR": str(workdir),
           "PYCNI_AGENT_FIFO": str(host / "run-pycni" / "agent.fifo")}
    try:
        proc = subprocess.run([str(UPSTREAM / "kube-node-up")], capture_output=True, text=True, env=env,
                              check=False, timeout=900)  # fmt: skip
    except BaseException:  # interrupted (SIGTERM, a timeout) before it could clean up: what it started
        for started in workdir.glob("kube-up.*"):  # runs on (nohup): undo it as after a crash
            down(started)
        raise
    if proc.returncode != 0:  # kube-node-up cleans up after itself on failure
        raise AssertionError(f"kube-node-up failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    state = Path(proc.stdout.strip().splitlines()[-1])
    values = {}
    for line in (state / "env").read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            values[k] = v.strip('"')
    return Cluster(state, values, host)


def api_env(cluster: Cluster) -> dict[str, str]:
    """KUBERNETES_SERVICE_HOST/PORT naming the API server itself: what in-cluster clients on the host
    network need on a cluster without kube-proxy (a container's own env wins over the kubelet's)."""
    url = urlsplit(cluster.env["APISERVER_URL"])
    return {"KUBERNETES_SERVICE_HOST": url.hostname or "", "KUBERNETES_SERVICE_PORT": str(url.port)}


def down(cluster_dir: Path) -> None:
    subprocess.run([str(UPSTREAM / "kube-node-down"), str(cluster_dir)], capture_output=True, check=False,
                   timeout=900)


def short_workdir() -> Path:
    """A short directory in /tmp (unix socket paths under it, the node's own, stay well below 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=f"{RUN}-kn-"))


# ---- the install -------------------------------------------------------------------------------

def image_archive(tag: str, work: Path, version_suffix: str = "") -> Path:
    """`make image` (bundler.image, podman offline, test-private storage) of the current bundle, saved
    as a docker-archive for `ctr images import`; `version_suffix`: the same bundle as another build
    (another version, hence another build id: a second image version for an upgrade)."""
    from bundler import image
    from tests.e2e.test_image import CONTAINERS_CONF, Podman

    subprocess.run([str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else "python3",
                    "-m", "bundler.build"], cwd=REPO, check=True, capture_output=True, timeout=1800)
    work.mkdir(parents=True, exist_ok=True)
    (work / "containers.conf").write_text(CONTAINERS_CONF.format(tmp=work))
    pm = Podman(work, Path(tempfile.mkdtemp(prefix=f"{RUN}-pm-")))
    layout = REPO / "dist" / "cni-bin"
    if version_suffix:
        from bundler import manifest
        from tests.bundle_layouts import variant

        version = manifest.load(layout / manifest.FILENAME).version + version_suffix
        layout = variant(layout, work / "layout" / "cni-bin", version)
    try:
        image.build_image(layout, tag, work / "build", pm.prefix())
        out = work / "pycni.tar"
        pm.ok("save", "--format", "docker-archive", "--output", str(out), tag)
        return out
    finally:
        pm("rmi", "--all", "--force")
        shutil.rmtree(pm.short, ignore_errors=True)
        shutil.rmtree(work / "root", ignore_errors=True)
        shutil.rmtree(work / "build", ignore_errors=True)
        shutil.rmtree(work / "layout", ignore_errors=True)


# What the suite's own layer over the documented overlay changes, and why (tests/cluster/test_install.py
# checks the rendered result differs from the documented overlay's by exactly these paths). Index paths
# are checked against the names they stand for.
def overlay_changes(cluster: Cluster) -> list[tuple[str, str, Any, str]]:
    """(op, JSON-patch path into the DaemonSet, value, why)."""
    spec = "/spec/template/spec"
    return [
        ("replace", f"{spec}/volumes/2/hostPath/path", str(cluster.agent_fifo_dir),
         "agent-fifo: the test's own directory (never the host's /run/pycni; the node's runtime has "
         "PYCNI_AGENT_FIFO pointing there)"),
        ("replace", f"{spec}/volumes/4/hostPath/path", str(cluster.state_dir),
         "cni-state: the test's own directory for the node's /var/lib/cni (the test NADs' stateDir and "
         "local_db, hence the pool locks, are under it)"),
        ("replace", f"{spec}/volumes/6/hostPath/path", str(cluster.devinfo_dir),
         "devinfo: the test's own directory (never the host's /var/run/k8s.cni.cncf.io/devinfo, which "
         "the kubelet would create)"),
        ("replace", f"{spec}/containers/1/volumeMounts/4/mountPath", str(cluster.state_dir),
         "the agent sees host paths at the same paths: the state dir"),
        ("add", f"{spec}/containers/1/command/-", f"--claim-records={cluster.state_dir}/pycni/claims",
         "the IPAMClaim records the plugins write beside the test NADs' local_db (under the test's own "
         "state dir)"),
    ]


EXPECTED_NAMES = {  # what each index of overlay_changes must name in the shipped DaemonSet
    "/spec/template/spec/volumes/2": "agent-fifo", "/spec/template/spec/volumes/4": "cni-state",
    "/spec/template/spec/volumes/6": "devinfo", "/spec/template/spec/containers/1": "agent",
    "/spec/template/spec/containers/1/volumeMounts/4": "cni-state",
}


def write_overlay(cluster: Cluster, tag: str, where: Path) -> Path:
    """pycni's install as docs/install.md shows it for a node whose CNI directories are not the defaults
    (tests/docoverlay.py: `where`/my-overlay, the page's two files, this node's directories in
    cni-dirs.yaml), under a layer of the suite's own (`where`/kustomization.yaml): the image (the
    registry name and tag the suite imported) and the DaemonSet patch of overlay_changes, each change
    commented."""
    from tests import docoverlay

    documented = docoverlay.write(where, str(cluster.cni_bin_dir), str(cluster.cni_conf_dir))
    shown_image = yaml.safe_load(docoverlay.blocks()["kustomization.yaml"])["images"][0]["newName"]
    name, _, version = tag.rpartition(":")
    patch = [{"op": op, "path": path, "value": value} for op, path, value, _ in overlay_changes(cluster)]
    why = "\n".join(f"#  {path}: {reason}" for _, path, _, reason in overlay_changes(cluster))
    kust = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [documented.name],
        "images": [{"name": shown_image, "newName": name, "newTag": version}],
        "patches": [{"target": {"kind": "DaemonSet", "name": "pycni-node"}, "patch": json.dumps(patch)}],
    }
    (where / "kustomization.yaml").write_text(
        "# the test node's layer over docs/install.md's overlay (tests/cluster/kubenode.py): the image the\n"
        "# suite imported, and\n" + why + "\n" + yaml.safe_dump(kust, sort_keys=False))
    return where


def render(cluster: Cluster, where: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", str(where)).stdout) if d]


def posted_since(cluster: Cluster, beat: str | None) -> bool:
    """containerd answers and the node is Ready with a heartbeat other than `beat`."""
    now = ready_heartbeat(cluster)
    return cluster.ctr_ok("version") and now is not None and now != beat


def ready_heartbeat(cluster: Cluster) -> str | None:
    """The lastHeartbeatTime of the node's Ready condition when it is True (None when not Ready): a
    kubelet started again has posted its status once this moves past what it was before the start."""
    conds = cluster.get("node", cluster.env["NODE_NAME"])["status"]["conditions"]
    ready = [c for c in conds if c["type"] == "Ready" and c["status"] == "True"]
    return str(ready[0]["lastHeartbeatTime"]) if ready else None


# ---- the node's own processes: stopped and started again as the kit started them ------------------

@dataclass(frozen=True)
class Stopped:
    """A node process the test stopped: what `start_again` needs to start it as kube-node-up did."""
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: Path


def _pid_of(cluster: Cluster, name: str) -> int:
    """The last pid recorded for `name` in the kit's DIR/pids.named (kube-node-down reads the same)."""
    pids = [int(p) for n, p in (line.split() for line in (cluster.dir / "pids.named").read_text().splitlines()
                                if line.strip()) if n == name]
    if not pids:
        raise AssertionError(f"no {name} in {cluster.dir}/pids.named")
    return pids[-1]


def stop(cluster: Cluster, name: str, timeout: float = 60.0) -> Stopped:
    """SIGTERM the node's `name` (kubelet, containerd) and wait (bounded) until it has exited."""
    pid = _pid_of(cluster, name)
    proc = Path(f"/proc/{pid}")
    argv = proc.joinpath("cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    if not any(str(cluster.dir).encode() in a for a in argv):
        raise AssertionError(f"pid {pid} ({name}) does not belong to {cluster.dir}")
    environ = proc.joinpath("environ").read_bytes().decode().split("\0")
    env = dict(e.split("=", 1) for e in environ if "=" in e)
    got = Stopped(name, [a.decode() for a in argv], env, os.readlink(proc / "cwd"),
                  cluster.dir / f"{name}.log")
    os.kill(pid, 15)
    wait_for(f"{name} ({pid}) to exit", lambda: not proc.exists() or _zombie(proc), timeout, every=0.2)
    return got


def _zombie(proc: Path) -> bool:
    try:
        return proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def start_again(cluster: Cluster, stopped: Stopped) -> int:
    """Start a stopped node process as kube-node-up does (nohup, its log appended, stdin /dev/null), in
    its own session, and record its pid where kube-node-down looks
    for it (DIR/node-pids, DIR/pids.named)."""
    # through a shell that exits at once (as the kit's `nohup ... &`): the process is not our child, so
    # it never lingers as our zombie when kube-node-down stops it
    out = subprocess.run(["sh", "-c", 'cd "$1" && shift && log=$1 && shift && '
                          'nohup setsid "$@" >>"$log" 2>&1 </dev/null & echo $!',
                          "sh", stopped.cwd, str(stopped.log), *stopped.argv],
                         env=stopped.env, capture_output=True, text=True, check=True, timeout=30)
    pid = int(out.stdout.strip())
    with (cluster.dir / "node-pids").open("a") as f:
        f.write(f"{pid}\n")
    with (cluster.dir / "pids.named").open("a") as f:
        f.write(f"{stopped.name} {pid}\n")
    return pid


@contextmanager
def stopped(cluster: Cluster, name: str, settle: float = 180.0) -> Iterator[Stopped]:
    """The node's `name` (kubelet, containerd) stopped for the block and started again after it as the
    kit started it, also on failure; on leaving normally, waited for (bounded by `settle`) until
    containerd answers and the kubelet has posted the node's status since (posted_since)."""
    got = stop(cluster, name)
    beat = ready_heartbeat(cluster)
    try:
        yield got
    finally:
        start_again(cluster, got)
    wait_for(f"{name} started again and the node's status posted after it",
             lambda: posted_since(cluster, beat), settle)
