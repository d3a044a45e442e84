"""The installer (DaemonSet entrypoint; frozen entry `pycni-install`):

    python -m bundler.install --cni-bin-dir DIR --cni-conf-dir DIR [--once] [--uninstall] [options]

Installs the bundle into a versioned directory beside the plugins and switches each plugin entry by renaming
a new symlink over it; writes the IPAM flat file, a kubeconfig that follows the rotating service-account
token (tokenFile), and the node name. Without --once it keeps running: re-verifies checksums, repairs what
was removed or corrupted, refreshes the token copy, and reports ready (--ready-file) only after the first
complete install. A name another installer writes (the NVIDIA Network Operator's cni-plugins DaemonSet)
is never fought over: see bundler.binaries.settle_foreign. A restart never removes anything; --uninstall
removes exactly what was installed (with --once it then exits, without it keeps the node clean and
reports ready until SIGTERM)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from bundler import binaries, fsutil, hostconf, manifest, state
from bundler.cli import Options
from cni import log
from cni.stopsignal import StopSignal


@contextlib.contextmanager
def locked(bin_dir: Path) -> Iterator[None]:
    home = bin_dir / state.HOME
    home.mkdir(mode=0o755, exist_ok=True)
    fd = os.open(home / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def install_once(o: Options, full: bool = True) -> bool:
    """One complete pass; returns True when anything on the host changed."""
    created = not o.bin_dir.exists()
    o.bin_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    with locked(o.bin_dir):
        st = state.load(o.bin_dir)
        st.bin_dir_created = st.bin_dir_created or created
        before = st.to_dict()
        binaries.tidy(o.bin_dir, st)
        changed = _install_bundle(o, st, full)
        changed = _install_conf(o, st) or changed
        gone = binaries.expire(o.bin_dir, st, o.grace)
        if changed or gone or st.to_dict() != before:
            state.save(o.bin_dir, st)
        return changed or bool(gone)


def _install_bundle(o: Options, st: state.State, full: bool) -> bool:
    src = binaries.Source.open(o.source)
    m = src.manifest
    names = [o.prefix + p for p in m.plugins]
    binaries.settle_foreign(o.bin_dir, st, names, o.take_over, o.reclaim)
    names = [n for n in names if n not in st.yielded]
    bad = binaries.healthy(o.bin_dir, st, m, names, full)
    if not bad:
        return False
    log.info("installing build %s into %s: %s", m.build, o.bin_dir, "; ".join(bad[:5]))
    home = o.bin_dir / state.HOME / st.current if st.current else None
    reuse = st.build == m.build and home is not None and home.is_dir() and not _files_bad(home, m)
    dirname = st.current if reuse else binaries.fresh_dirname(o.bin_dir, m.build)
    if not reuse:
        src.verify()
        binaries.copy_bundle(src, o.bin_dir, dirname)
    binaries.switch(o.bin_dir, st, m, dirname, names)
    return True


def _files_bad(home: Path, m: manifest.Manifest) -> bool:
    return bool(manifest.problems(home, m))


def _install_conf(o: Options, st: state.State) -> bool:
    files = hostconf.desired(o.conf)
    changed = False
    for rel, data in files.items():
        target = o.conf_dir / rel
        _mkdirs(o.conf_dir, target.parent, st)
        fsutil.remove_stale_tmp(target.parent)
        if rel not in st.conf_files:
            _keep_foreign_conf(o, rel, st)
        changed = fsutil.write_atomic(target, data, 0o600) or changed
        if rel not in st.conf_files:
            st.conf_files.append(rel)
    for rel in [r for r in st.conf_files if r not in files]:
        _release_conf(o, rel, st)
        st.conf_files.remove(rel)
        changed = True
    return changed


def _keep_foreign_conf(o: Options, rel: str, st: state.State) -> None:
    """A file we are about to write that another installer wrote (upstream whereabouts' flat file and
    kubeconfig, on a node migrating to pycni): copied with its mode under .pycni/displaced-conf/ (a copy:
    the bin and conf dirs may be different mounts) and put back by --uninstall."""
    target = o.conf_dir / rel
    if rel in st.displaced_conf or target.is_symlink() or not target.is_file():
        return
    keep = o.bin_dir / state.HOME / state.DISPLACED_CONF / rel
    keep.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fsutil.write_atomic(keep, target.read_bytes(), target.stat().st_mode & 0o7777)
    st.displaced_conf.append(rel)
    log.info("keeping %s (not written by pycni) as %s", target, keep)


def _release_conf(o: Options, rel: str, st: state.State) -> None:
    """Remove our conf file `rel`, or put back the foreign one it replaced."""
    target, keep = o.conf_dir / rel, o.bin_dir / state.HOME / state.DISPLACED_CONF / rel
    if rel in st.displaced_conf and keep.is_file():
        fsutil.write_atomic(target, keep.read_bytes(), keep.stat().st_mode & 0o7777)
        st.displaced_conf.remove(rel)
    else:
        target.unlink(missing_ok=True)


def _mkdirs(root: Path, d: Path, st: state.State) -> None:
    """Create root and d (under it) as needed, recording each directory we made (uninstall removes them)."""
    if not root.exists():
        root.mkdir(mode=0o755, parents=True)
        st.conf_dirs.append(".")
    cur = root
    for part in d.relative_to(root).parts:
        cur = cur / part
        if cur.is_symlink():  # a planted link would send the files (the token too) elsewhere
            raise RuntimeError(f"{cur}: is a symlink; refusing to write through it")
        if not cur.exists():
            cur.mkdir(mode=0o755)
            st.conf_dirs.append(str(cur.relative_to(root)))


def remind(o: Options) -> None:
    """At a start: the names left to another installer (state `yielded`), one warning each."""
    for name, what in sorted(state.load(o.bin_dir).yielded.items()):
        log.warning("%s is left to another installer (%s): pycni does not serve %r here; see "
                    "--prefix and --reclaim in docs/network-operator.md", o.bin_dir / name, what, name)


def uninstall(o: Options) -> None:
    if not (o.bin_dir / state.HOME).exists():
        log.debug("nothing to uninstall in %s", o.bin_dir)
        return
    with locked(o.bin_dir):
        st = state.load(o.bin_dir)
        for name in list(st.entries):
            binaries.release_entry(o.bin_dir, name, st)
        for rel in list(st.conf_files):
            _release_conf(o, rel, st)
        for rel in reversed(st.conf_dirs):
            with contextlib.suppress(OSError):
                (o.conf_dir / rel).rmdir()
        fsutil.remove_tree(o.bin_dir / state.HOME)
    if st.bin_dir_created:
        with contextlib.suppress(OSError):
            o.bin_dir.rmdir()


def serve(o: Options, interval: float, full_every: int, ready_file: Path | None,
          remove: bool = False) -> int:
    """Long-running mode: install (or, with `remove`, uninstall), then re-verify and repair every
    `interval` seconds until SIGTERM. Uninstall mode lets a DaemonSet roll out `--uninstall` and report
    ready once every node is clean, before the DaemonSet is deleted."""
    stop = StopSignal().install()  # not a threading.Event set by the handler: see cni.stopsignal
    ready, n = False, 0
    while not stop.is_set():
        try:
            if remove:
                uninstall(o)
            else:
                if install_once(o, full=n % full_every == 0):
                    log.info("install pass %d changed the host", n)
                if not ready:
                    remind(o)
            if not ready and ready_file is not None:
                fsutil.write_atomic(ready_file, b"ready\n", 0o644)
            ready = True
            log.debug("install pass %d done", n)
        except Exception as e:  # reported, retried next pass; readiness stays as it was
            log.error("install pass %d failed: %s", n, e)
        n += 1
        stop.wait(interval)
    if ready_file is not None:
        ready_file.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from bundler import cli

    args = cli.parse(sys.argv[1:] if argv is None else argv)
    log.configure(level=args.log_level, tag="pycni-install")
    if args.probe:
        return 0 if args.ready_file and args.ready_file.exists() else 1
    try:
        o = cli.options(args)
        if args.once and args.uninstall:
            uninstall(o)
            return 0
        if args.once:
            print("changed" if install_once(o) else "unchanged")
            remind(o)
            return 0
    except Exception as e:
        log.error("%s", e)
        return 1
    return serve(o, args.interval, args.full_verify_every, args.ready_file, remove=args.uninstall)


if __name__ == "__main__":
    sys.exit(main())
