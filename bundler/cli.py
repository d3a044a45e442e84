"""Command line of the installer: flags, environment defaults (the DaemonSet's downward API values)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from bundler import hostconf
from bundler.hostconf import HostConf, KubeSettings


@dataclass(frozen=True)
class Options:
    bin_dir: Path
    conf_dir: Path
    source: Path
    prefix: str
    grace: float
    conf: HostConf
    take_over: bool = False  # displace a foreign file at a name pycni never held (bundler.binaries)
    reclaim: tuple[str, ...] = ()  # entry names given back to pycni (--once only)


def default_source() -> Path:
    """The cni-bin layout this installer belongs to: beside the frozen bundle, or dist/cni-bin."""
    if getattr(sys, "frozen", False):
        return Path(sys.executable).resolve().parent.parent
    return Path(__file__).resolve().parent.parent / "dist" / "cni-bin"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="pycni-install", description="Install pycni on this node.")
    ap.add_argument("--cni-bin-dir", type=Path, help="host CNI bin dir as mounted here (/host/opt/cni/bin)")
    ap.add_argument("--cni-conf-dir", type=Path, help="host CNI conf dir as mounted here")
    ap.add_argument("--once", action="store_true", help="install (or verify and repair) once and exit")
    ap.add_argument("--uninstall", action="store_true", help="remove exactly what was installed")
    ap.add_argument("--source", type=Path, default=None, help="cni-bin layout to install (default: own)")
    ap.add_argument("--prefix", default="", help="entry name prefix, to live beside upstream plugins")
    ap.add_argument("--take-over", action="store_true",
                    help="replace (and keep, for --uninstall) a foreign file at a name pycni has never held; "
                         "a name another installer writes after pycni is left alone regardless")
    ap.add_argument("--reclaim", action="append", default=[], metavar="NAME",
                    help="with --once: take back an entry name left to another installer (repeatable)")
    ap.add_argument("--grace", type=float, default=600.0, help="seconds to keep the previous version")
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between verify passes")
    ap.add_argument("--full-verify-every", type=int, default=6, help="full sha256 check every N passes")
    ap.add_argument("--ready-file", type=Path, default=None, help="written after the first full install")
    ap.add_argument("--probe", action="store_true", help="exit 0 iff --ready-file exists (readinessProbe)")
    ap.add_argument("--host-cni-conf-dir", default=None,
                    help="the conf dir as the host sees it (default: --cni-conf-dir without /host)")
    ap.add_argument("--ipam-datastore", choices=("kubernetes", "local", "none"), default=None,
                    help="flat file datastore (default: kubernetes inside a cluster, else local)")
    ap.add_argument("--node-name", default=os.environ.get("NODENAME") or os.environ.get("NODE_NAME"))
    ap.add_argument("--namespace", default=None, help="namespace of the IPAM objects")
    ap.add_argument("--kube-server", default=None, help="API server URL (default: in-cluster env)")
    ap.add_argument("--token-file", type=Path, default=Path(hostconf.SA_DIR) / "token")
    ap.add_argument("--ca-file", type=Path, default=Path(hostconf.SA_DIR) / "ca.crt")
    ap.add_argument("--skip-tls-verify", action="store_true")
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args(argv)
    if not args.probe and (args.cni_bin_dir is None or args.cni_conf_dir is None):
        ap.error("--cni-bin-dir and --cni-conf-dir are required")
    if args.full_verify_every < 1 or args.interval <= 0 or args.grace < 0:
        ap.error("--interval > 0, --full-verify-every >= 1 and --grace >= 0 are required")
    if args.reclaim and not args.once:
        ap.error("--reclaim: only with --once (a running installer never takes a name back by itself)")
    if any("/" in n or n.startswith(".") or not n for n in args.reclaim):
        ap.error("--reclaim: an entry name in the CNI bin dir (no /, not starting with .)")
    if args.prefix and ("/" in args.prefix or args.prefix.startswith(".")):
        ap.error("--prefix: may not contain / or start with .")
    return args


def _namespace(args: argparse.Namespace) -> str:
    if args.namespace:
        return str(args.namespace)
    env = os.environ.get("WHEREABOUTS_NAMESPACE") or os.environ.get("POD_NAMESPACE")
    if env:
        return env
    try:
        return (Path(hostconf.SA_DIR) / "namespace").read_text().strip() or "kube-system"
    except OSError:
        return "kube-system"


def host_conf(args: argparse.Namespace) -> HostConf:
    server = args.kube_server or hostconf.server_from_env(os.environ)
    datastore = args.ipam_datastore or ("kubernetes" if server else "local")
    conf_dir = str(args.cni_conf_dir)
    stripped = conf_dir[len("/host"):] if conf_dir.startswith("/host/") else conf_dir
    host_dir = args.host_cni_conf_dir or stripped
    kube = None
    if datastore == "kubernetes":
        if not server:
            raise ValueError("--ipam-datastore kubernetes: no API server (--kube-server or in-cluster env)")
        ca = None if args.skip_tls_verify else args.ca_file
        kube = KubeSettings(server, _namespace(args), args.token_file, ca, args.skip_tls_verify)
    node = args.node_name or os.uname().nodename
    return HostConf(host_conf_dir=host_dir, datastore=datastore, node_name=node, kube=kube)


def options(args: argparse.Namespace) -> Options:
    return Options(bin_dir=args.cni_bin_dir.absolute(), conf_dir=args.cni_conf_dir.absolute(),
                   source=(args.source or default_source()).absolute(), prefix=args.prefix,
                   grace=args.grace, conf=host_conf(args), take_over=args.take_over,
                   reclaim=tuple(args.reclaim))
