"""Files the installer writes for the IPAM (flat file, kubeconfig with tokenFile, token and CA copies,
node name) and its long-running mode: readiness, token rotation without restart, repair, SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bundler import cli, hostconf, install
from cni import jsonio
from cni.errors import CniError
from tests.bundle_layouts import FAKE_EXE, fake_layout, opts
from tests.logtee import PYTHONPATH
from tests.nsutil import REPO
from tests.unit.helpers import reaped
from tests.waits import until

pytestmark = pytest.mark.skipif(not FAKE_EXE.exists(), reason=f"{FAKE_EXE} (containernetworking-plugins)")
SERVER = "https://[2001:db8::10]:6443"


@pytest.fixture
def sa(tmp_path: Path) -> tuple[Path, Path]:
    token, ca = tmp_path / "sa" / "token", tmp_path / "sa" / "ca.crt"
    token.parent.mkdir()
    token.write_bytes(b"token-generation-1")
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    return token, ca


def kube_args(sa: tuple[Path, Path], *extra: str) -> tuple[str, ...]:
    return ("--ipam-datastore", "kubernetes", "--kube-server", SERVER, "--token-file", str(sa[0]),
            "--ca-file", str(sa[1]), "--namespace", "pycni-system", *extra)


def test_conf_files_are_0600_and_reference_the_token_file(tmp_path: Path, sa: tuple[Path, Path]) -> None:
    src = fake_layout(tmp_path / "src")
    conf = tmp_path / "net.d"
    o = opts(tmp_path / "bin", conf, src, *kube_args(sa, "--host-cni-conf-dir", "/etc/cni/net.d"))
    install.install_once(o)
    wb = conf / "whereabouts.d"
    assert sorted(p.name for p in wb.iterdir()) == sorted(
        ["whereabouts.conf", "whereabouts.kubeconfig", "pycni-sa-token", "pycni-ca.crt", "nodename"])
    for p in wb.iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    kc = jsonio.loads((wb / "whereabouts.kubeconfig").read_bytes())
    assert kc["users"][0]["user"] == {"tokenFile": "/etc/cni/net.d/whereabouts.d/pycni-sa-token"}
    assert b"token-generation-1" not in (wb / "whereabouts.kubeconfig").read_bytes()
    cluster = kc["clusters"][0]["cluster"]
    assert cluster == {"server": SERVER, "certificate-authority": "/etc/cni/net.d/whereabouts.d/pycni-ca.crt"}
    assert kc["contexts"][0]["context"]["namespace"] == "pycni-system"
    flat = jsonio.loads((wb / "whereabouts.conf").read_bytes())
    assert flat["kubernetes"] == {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}
    assert flat["datastore"] == "kubernetes" and flat["configuration_path"] == "/etc/cni/net.d/whereabouts.d"
    assert (wb / "nodename").read_bytes() == b"node-a"
    assert (wb / "pycni-sa-token").read_bytes() == b"token-generation-1"


def test_token_rotation_rewrites_only_the_token_copy(tmp_path: Path, sa: tuple[Path, Path]) -> None:
    src = fake_layout(tmp_path / "src")
    conf = tmp_path / "net.d"
    o = opts(tmp_path / "bin", conf, src, *kube_args(sa))
    install.install_once(o)
    kc = (conf / hostconf.KUBECONFIG).read_bytes()
    sa[0].write_bytes(b"token-generation-2")
    assert install.install_once(o)
    assert (conf / hostconf.TOKEN).read_bytes() == b"token-generation-2"
    assert (conf / hostconf.KUBECONFIG).read_bytes() == kc


def test_in_cluster_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sa: tuple[Path, Path]) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "2001:db8::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("WHEREABOUTS_NAMESPACE", "wb")
    args = cli.parse(["--cni-bin-dir", "/host/opt/cni/bin", "--cni-conf-dir", "/host/etc/cni/net.d",
                      "--token-file", str(sa[0]), "--ca-file", str(sa[1])])
    conf = cli.host_conf(args)
    assert conf.datastore == "kubernetes" and conf.host_conf_dir == "/etc/cni/net.d"
    assert conf.kube is not None and conf.kube.server == "https://[2001:db8::1]:443"
    assert conf.kube.namespace == "wb"


def test_local_datastore_writes_no_credentials(tmp_path: Path) -> None:
    src = fake_layout(tmp_path / "src")
    conf = tmp_path / "net.d"
    install.install_once(opts(tmp_path / "bin", conf, src))
    assert sorted(p.name for p in (conf / "whereabouts.d").iterdir()) == ["nodename", "whereabouts.conf"]
    assert jsonio.loads((conf / hostconf.FLAT).read_bytes())["datastore"] == "local"


def holds(cond: Callable[[], bool]) -> Callable[[], bool]:
    """`cond`, false while what it reads is not there yet, or still the broken one."""
    def check() -> bool:
        try:
            return cond()
        except (OSError, ValueError, CniError):
            return False

    return check


def log_of(tmp_path: Path) -> Path:
    """The stderr of the installers `serve` started."""
    return tmp_path / "installer.log"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    with reaped() as procs:

        def start(*args: str) -> subprocess.Popen[bytes]:
            cmd = [sys.executable, "-m", "bundler.install", "--interval", "0.1", "--full-verify-every", "2",
                   *args]
            with log_of(tmp_path).open("ab") as log:
                p = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": PYTHONPATH}, stderr=log)
            procs.append(p)
            return p

        yield start


def test_long_running_mode(tmp_path: Path, sa: tuple[Path, Path],
                           serve: Callable[..., subprocess.Popen[bytes]]) -> None:
    src = fake_layout(tmp_path / "src")
    bin_dir, conf, ready = tmp_path / "bin", tmp_path / "net.d", tmp_path / "ready"
    p = serve("--cni-bin-dir", str(bin_dir), "--cni-conf-dir", str(conf), "--source", str(src),
              "--ready-file", str(ready), *kube_args(sa))
    until(ready.exists, lambda: f"ready; the installer's log:\n{log_of(tmp_path).read_text()}")
    assert os.readlink(bin_dir / "macvlan").startswith(".pycni/")  # ready means complete
    assert (conf / hostconf.KUBECONFIG).exists() and (conf / hostconf.NODENAME).exists()
    sa[0].write_bytes(b"token-generation-2")  # the kubelet rotates the projected token
    until(holds(lambda: (conf / hostconf.TOKEN).read_bytes() == b"token-generation-2"), "the token rotated")
    (bin_dir / "macvlan").unlink()
    (conf / hostconf.FLAT).write_bytes(b'{"datastore": "kub')  # someone truncated it
    until((bin_dir / "macvlan").is_symlink, "the removed entry repaired")
    until(holds(lambda: jsonio.loads((conf / hostconf.FLAT).read_bytes())["datastore"] == "kubernetes"),
          "the truncated flat file repaired")
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
    assert not ready.exists(), "not ready once stopped"
    assert (bin_dir / "macvlan").is_symlink() and (conf / hostconf.FLAT).exists(), "a restart removes nothing"


def test_not_ready_until_a_complete_install(tmp_path: Path,
                                            serve: Callable[..., subprocess.Popen[bytes]]) -> None:
    src = fake_layout(tmp_path / "src")
    (src / "pycni" / "_internal" / "lib.dat").write_bytes(b"corrupt")
    ready = tmp_path / "ready"
    p = serve("--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir", str(tmp_path / "net.d"),
              "--source", str(src), "--ready-file", str(ready), "--ipam-datastore", "local")
    log = log_of(tmp_path)
    until(lambda: b"does not match its manifest" in log.read_bytes(), "a pass refused the layout")
    assert not ready.exists()  # that pass failed: not ready
    probe = subprocess.run([sys.executable, "-m", "bundler.install", "--probe", "--ready-file", str(ready)],
                           cwd=REPO, check=False)
    assert probe.returncode == 1
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0


def test_uninstall_mode_cleans_and_reports_ready(tmp_path: Path,
                                                 serve: Callable[..., subprocess.Popen[bytes]]) -> None:
    src = fake_layout(tmp_path / "src")
    bin_dir, conf, ready = tmp_path / "bin", tmp_path / "net.d", tmp_path / "ready"
    bin_dir.mkdir()
    install.install_once(opts(bin_dir, conf, src))
    p = serve("--cni-bin-dir", str(bin_dir), "--cni-conf-dir", str(conf), "--source", str(src),
              "--ready-file", str(ready), "--ipam-datastore", "local", "--uninstall")
    until(ready.exists, lambda: f"ready; the installer's log:\n{log_of(tmp_path).read_text()}")
    assert list(bin_dir.iterdir()) == [] and not conf.exists()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=10) == 0
