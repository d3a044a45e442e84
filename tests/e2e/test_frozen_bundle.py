"""The frozen bundle itself (runs in the frozen pass: `make test` sets PYCNI_PLUGIN_DIR=dist/cni-bin after
`make bundle`): layout and manifest (no pyroute2 in it), VERSION of every entry, netlink without
pyroute2 on a plugin call and in the agent's warm-up (the VF codec included), the frozen installer,
and the upgrade storm with the real executable."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bundler import cli, install, manifest, state
from cni import jsonio, spec
from cni.registry import PLUGINS, TOOLS, entries
from tests import upgrade_storm
from tests.bundle_layouts import snapshot, variant, version_call
from tests.e2e import bundle_driver
from tests.skips import FROZEN_ONLY


@pytest.fixture
def cni_bin() -> Path:
    d = bundle_driver.frozen_dir()
    if d is None:
        pytest.skip(FROZEN_ONLY)
    return d


def test_layout_matches_manifest_and_registry(cni_bin: Path) -> None:
    m = manifest.load(cni_bin / manifest.FILENAME)
    assert manifest.problems(cni_bin, m) == []
    assert (m.plugins, m.tools) == (tuple(sorted(PLUGINS)), tuple(sorted(TOOLS)))
    for name in entries():
        assert os.readlink(cni_bin / name) == m.executable, name
    exe = cni_bin / m.executable
    assert exe.stat().st_mode & 0o111 and (cni_bin / m.bundle / "_internal").is_dir()
    assert sum(info.size for info in m.files.values()) < 80 << 20, "bundle grew past 80 MiB"
    # pyroute2 is a test dependency only (the netlink tests' reference codec)
    assert "pyroute2" not in m.locked and not [p for p in m.files if "pyroute2" in p]


def test_every_entry_answers_version(cni_bin: Path) -> None:
    build = manifest.load(cni_bin / manifest.FILENAME).build
    for name in entries():
        call = version_call(cni_bin / name)
        assert call.returncode == 0, (name, call.stdout, call.stderr)
        want = {"cniVersion": spec.LATEST, "supportedVersions": list(spec.SUPPORTED)}
        assert jsonio.loads(call.stdout) == want
    for name in PLUGINS:
        about = subprocess.run([str(cni_bin / name)], env={}, capture_output=True, check=False, timeout=60)
        assert about.returncode == 0 and f"pycni {name} {build}" in about.stderr.decode()


def test_plugin_calls_speak_netlink_without_pyroute2(cni_bin: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    # STATUS looks the master up over netlink (a DEL without a netns would not touch netlink at all)
    env = {"CNI_COMMAND": "STATUS", "CNI_PATH": "/usr/lib/cni", "PYCNI_AGENT": "off"}
    conf = jsonio.dumps({"cniVersion": "1.1.0", "name": "n", "type": "macvlan", "master": "none0"})
    proc = subprocess.run(["strace", "-f", "-e", "trace=openat", "-o", str(trace), str(cni_bin / "macvlan")],
                          input=conf, env=env, capture_output=True, check=False, timeout=60)
    assert proc.returncode == 1 and jsonio.loads(proc.stdout)["code"] == 50, (proc.stdout, proc.stderr)
    opened = [line for line in trace.read_text().splitlines() if "= -1" not in line]
    assert any("cni/netlink/nla" in line for line in opened), "cni.netlink.nla not loaded"
    assert not any("pyroute2/" in line for line in opened), "pyroute2 loaded on a macvlan call"


def test_agent_warms_the_vf_codec_without_pyroute2(cni_bin: Path, tmp_path: Path) -> None:
    """The agent imports every netlink module up front (cni.agent.server.warm), the SR-IOV VF codec
    included, and none of it is pyroute2."""
    trace, sock = tmp_path / "trace", tmp_path / "run" / "agent.fifo"
    agent = subprocess.Popen(["strace", "-f", "-e", "trace=openat", "-o", str(trace),
                              str(cni_bin / "pycni-agent"), "--fifo", str(sock),
                              "--metrics=127.0.0.1:0"],  # any free port: never the node default
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert agent.poll() is None and time.monotonic() < deadline, agent.stderr
            time.sleep(0.05)
    finally:  # SIGTERM to the agent itself (strace's child): it stops; strace follows
        children = Path(f"/proc/{agent.pid}/task/{agent.pid}/children")
        for pid in children.read_text().split() if children.exists() else ():
            os.kill(int(pid), signal.SIGTERM)
        try:
            agent.wait(60)
        finally:
            agent.kill()
    opened = [line for line in trace.read_text().splitlines() if "= -1" not in line]
    assert any("cni/netlink/vfinfo" in line for line in opened), "the VF codec was not loaded"
    for heavy in ("pyroute2/", "asyncio/"):
        assert not any(heavy in line for line in opened), f"{heavy} was loaded"


def test_frozen_installer_installs_its_own_bundle(cni_bin: Path, tmp_path: Path) -> None:
    bin_dir, conf_dir = tmp_path / "opt-cni-bin", tmp_path / "net.d"
    bin_dir.mkdir()
    conf_dir.mkdir()
    before = (snapshot(bin_dir), snapshot(conf_dir))
    args = ["--cni-bin-dir", str(bin_dir), "--cni-conf-dir", str(conf_dir), "--ipam-datastore", "local"]

    def installer(*extra: str) -> subprocess.CompletedProcess[bytes]:
        cmd = [str(cni_bin / "pycni-install"), *args, *extra]
        return subprocess.run(cmd, capture_output=True, check=False)

    run = installer("--once")
    assert run.returncode == 0 and run.stdout == b"changed\n", run.stderr
    for name in PLUGINS:
        assert version_call(bin_dir / name).returncode == 0
    again = installer("--once")
    assert again.stdout == b"unchanged\n", again.stderr
    gone = installer("--uninstall", "--once")
    assert gone.returncode == 0, gone.stderr
    assert (snapshot(bin_dir), snapshot(conf_dir)) == before


def test_frozen_ipam_tool_names_itself_and_never_creates_a_database(cni_bin: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    run = [cni_bin / "pycni-ipam"]
    usage = subprocess.run([*run, "--help"], capture_output=True, text=True, env=env, check=False)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: pycni-ipam "), usage.stdout
    missing = tmp_path / "typo" / "ipam.db"
    pools = subprocess.run([*run, "--local-db", str(missing), "pools"], capture_output=True, text=True,
                           env=env, check=False)
    assert (pools.returncode, pools.stdout) == (2, ""), (pools.stdout, pools.stderr)
    assert f"--local-db: no database at {missing}" in pools.stderr
    assert not missing.parent.exists()


def test_upgrade_storm_with_the_frozen_bundle(cni_bin: Path, tmp_path: Path) -> None:
    """20 upgrades between two frozen bundles while the entry is called: at least 1,000 calls (about 50
    per upgrade, as tests/unit/test_installer_storm.py makes against stand-in entries), and the calls go
    on until the last upgrade is done."""
    b = variant(cni_bin, tmp_path / "b", manifest.load(cni_bin / manifest.FILENAME).version + "+storm")
    storm = upgrade_storm.run((cni_bin, b), tmp_path / "bin", tmp_path / "conf", "macvlan", grace=10)
    assert storm.upgrades == 20, storm.unfinished(20)
    assert storm.calls >= 1000
    assert not storm.failures, storm.failures
    assert storm.switches == 20 and storm.expired > 0
    install.uninstall(cli.options(cli.parse(
        ["--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir", str(tmp_path / "conf")])))
    assert not (tmp_path / "bin" / state.HOME).exists()


def test_dockerfile_and_manifest_paths_exist_in_the_layout(cni_bin: Path) -> None:
    from tests.nsutil import REPO
    from tests.unit import test_manifests as tm

    copies, _ = tm.dockerfile()
    for src, dst in copies:
        assert (REPO / src).resolve() == cni_bin.resolve(), "the image copies the layout tested here"
        for cmd in [*tm.commands(), tm.dockerfile()[1]]:
            rel = Path(cmd[0]).relative_to(dst)
            assert (cni_bin / rel).exists(), f"{cmd[0]} is not in the bundle layout"


def test_every_first_party_module_is_in_the_bundle(cni_bin: Path) -> None:
    from bundler import freeze

    internal = cni_bin / manifest.load(cni_bin / manifest.FILENAME).bundle / "_internal"
    for module in freeze.first_party_modules():
        path = internal / module.replace(".", "/")
        assert path.with_suffix(".pyc").exists() or path.is_dir(), module  # (namespace) package: a dir


@pytest.mark.parametrize("runtime_value", ["/opt/runtime/lib", None])
def test_an_execd_ipam_gets_the_runtimes_environment_not_the_bootloaders(
    cni_bin: Path, tmp_path: Path, runtime_value: str | None
) -> None:
    """The bootloader puts the bundle's _internal first in LD_LIBRARY_PATH; an IPAM linked against
    the system's libraries must not load ours. GC forwards to the IPAM without needing a netns."""
    bindir, dump = tmp_path / "bin", tmp_path / "env"
    bindir.mkdir()
    ipam = bindir / "envipam"
    ipam.write_text(f"#!/bin/sh\nenv > {dump}\n")
    ipam.chmod(0o755)
    env = {"CNI_COMMAND": "GC", "CNI_PATH": str(bindir), "PATH": os.defpath, "PYCNI_AGENT": "off"}
    if runtime_value is not None:
        env["LD_LIBRARY_PATH"] = runtime_value
    conf = {"cniVersion": "1.1.0", "name": "n", "type": "macvlan", "master": "none0",
            "ipam": {"type": "envipam"}, "cni.dev/valid-attachments": []}
    proc = subprocess.run([str(cni_bin / "macvlan")], input=jsonio.dumps(conf), env=env, capture_output=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    seen = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert seen.get("LD_LIBRARY_PATH") == runtime_value
    assert [k for k in seen if k.startswith("_PYI_") or k == "LD_LIBRARY_PATH_ORIG"] == []


def test_bundle_carries_no_test_code(cni_bin: Path) -> None:
    """The seams' test doubles (tests/launch.py, tests/fakevf.py) live under tests/, outside the bundle."""
    m = manifest.load(cni_bin / manifest.FILENAME)
    test_code = [f for f in m.files if "/tests/" in f"/{f}" or "fakevf" in f]
    assert test_code == []
    assert any(f.endswith("cni/sriov/vf.pyc") for f in m.files)  # the file list is the .pyc tree
