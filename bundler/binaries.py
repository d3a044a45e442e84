"""The bundle on the host: a versioned copy under <bin>/.pycni/<build>/, entries switched by renaming a
new symlink over each name, the previous copy kept for a grace period, foreign files displaced (not lost).

Another installer writing the same names (the NVIDIA Network Operator's cni-plugins DaemonSet, a
distribution package, the SR-IOV operator's sriov-cni copy) is never fought over a name
(`settle_foreign`): a name is ours only while it is our symlink into .pycni/. A foreign file at a name
pycni never held is taken over once (displaced, restored by --uninstall) only with --take-over; a
foreign file at a name pycni held (someone wrote it after pycni did) is left alone for good. Either way
the name is recorded in the state's `yielded` and logged with what to do; no later pass writes it
again, until `--reclaim NAME` (with --once) says to take it back."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from bundler import fsutil, manifest
from bundler.state import DISPLACED, DISPLACED_CONF, HOME, State
from cni import log


@dataclass(frozen=True)
class Source:
    root: Path  # a cni-bin layout (bundle dir + manifest)
    manifest: manifest.Manifest

    @staticmethod
    def open(root: Path) -> Source:
        return Source(root, manifest.load(root / manifest.FILENAME))

    def verify(self) -> None:
        """Full check before anything is copied from it (a damaged image must not reach the host)."""
        bad = manifest.problems(self.root, self.manifest)
        if bad:
            raise RuntimeError(f"source bundle {self.root} does not match its manifest: {'; '.join(bad[:5])}")


def entry_target(dirname: str, m: manifest.Manifest) -> str:
    return f"{HOME}/{dirname}/{m.executable}"


def is_ours(link: Path) -> bool:
    return link.is_symlink() and os.readlink(link).startswith(f"{HOME}/")


def describe(path: Path) -> str:
    """What is at `path`, for a log line and the state file."""
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return f"symlink to {os.readlink(path)}"
    if stat.S_ISREG(st.st_mode):
        return f"file of {st.st_size} bytes, mode {st.st_mode & 0o7777:04o}, modified {int(st.st_mtime)}"
    return "not a regular file"


def settle_foreign(bin_dir: Path, st: State, names: list[str], take_over: bool,
                   reclaim: tuple[str, ...] = ()) -> list[str]:
    """Decide, before anything is written, which of `names` pycni leaves to another installer (see the
    module docstring); returns the names newly yielded. `reclaim`: names given back to pycni (their
    foreign file is displaced like a take-over)."""
    for name in reclaim:
        if st.yielded.pop(name, None) is not None:
            log.info("%s: reclaimed (--reclaim): the file there is kept under %s/%s and replaced",
                     bin_dir / name, HOME, DISPLACED)
    new: list[str] = []
    for name in names:
        link = bin_dir / name
        if name in st.yielded or not (link.exists() or link.is_symlink()) or is_ours(link):
            continue
        if name in st.entries:
            why = "written there after pycni had installed it: another installer writes this name"
        elif take_over or name in reclaim:
            continue  # switch() displaces it (kept, restored by --uninstall) and installs ours
        else:
            why = "there before pycni, which takes over a foreign file only with --take-over"
        what = describe(link)
        st.yielded[name] = what
        if name in st.entries:
            st.entries.remove(name)
        new.append(name)
        log.error("%s is not pycni's (%s; %s). pycni leaves it alone and does not serve the type %r on this "
                  "node; it will not write this name again. To run both, install pycni with --prefix "
                  "(NADs then name the prefixed type) or turn the other installer's copy of %s off, then "
                  "give the name back with `pycni-install --once --reclaim %s` (the file is kept and put "
                  "back by --uninstall)", link, what, why, name, name, name)
    return new


def healthy(bin_dir: Path, st: State, m: manifest.Manifest, names: list[str], full: bool) -> list[str]:
    """What is wrong with the installed copy of build m (empty: nothing)."""
    if st.build != m.build or not st.current:
        return [f"installed build {st.build or 'none'} is not {m.build}"]
    home = bin_dir / HOME / st.current
    bad = manifest.problems(home, m, full=full)
    want = entry_target(st.current, m)
    for name in names:
        link = bin_dir / name
        if not link.is_symlink() or os.readlink(link) != want:
            bad.append(f"entry {name} does not point to {want}")
    return bad


def copy_bundle(src: Source, bin_dir: Path, dirname: str) -> None:
    """Stage a full copy under a temp name, fsync everything, then rename it to .pycni/<dirname>."""
    final = bin_dir / HOME / dirname
    stage = fsutil.tmp_name(final)
    made: set[Path] = set()
    for rel, info in sorted(src.manifest.files.items()):
        dst = stage / rel
        for parent in reversed(dst.relative_to(bin_dir).parents):
            d = bin_dir / parent
            if d not in made and not d.exists():
                d.mkdir(mode=0o755)
            made.add(d)
        fsutil.copy_file(src.root / rel, dst, info.mode)
    fsutil.copy_file(src.root / manifest.FILENAME, stage / manifest.FILENAME, 0o644)
    for d in sorted(made | {stage}, key=lambda p: len(p.parts), reverse=True):
        if d.is_relative_to(stage):
            fsutil.fsync_dir(d)
    os.rename(stage, final)
    fsutil.fsync_dir(final.parent)


def fresh_dirname(bin_dir: Path, build: str) -> str:
    """`build`, or `build.rN` while a directory of that name exists (it may be executing: never write
    into it; a name comes free again only once its copy has expired)."""
    name, n = build, 1
    while (bin_dir / HOME / name).exists():
        name, n = f"{build}.r{n}", n + 1
    return name


def displace(bin_dir: Path, name: str, st: State) -> None:
    """Keep a foreign file we are about to replace (hard link: no moment without it)."""
    link = bin_dir / name
    if not (link.exists() or link.is_symlink()) or is_ours(link):
        return
    keep = bin_dir / HOME / DISPLACED / name
    keep.parent.mkdir(mode=0o755, exist_ok=True)
    keep.unlink(missing_ok=True)  # a reclaimed name: the file replaced last is the one to put back
    os.link(link, keep, follow_symlinks=False)
    if name not in st.displaced:
        st.displaced.append(name)
    log.info("keeping %s (not installed by pycni) as %s", link, keep)


def switch(bin_dir: Path, st: State, m: manifest.Manifest, dirname: str, names: list[str]) -> None:
    for name in names:
        displace(bin_dir, name, st)
        fsutil.symlink_atomic(entry_target(dirname, m), bin_dir / name)
        if name not in st.entries:
            st.entries.append(name)
    for name in [n for n in st.entries if n not in names]:
        release_entry(bin_dir, name, st)
    if st.current and st.current != dirname:
        st.retired[st.current] = time.time()
    st.retired.pop(dirname, None)
    st.current, st.build = dirname, m.build


def release_entry(bin_dir: Path, name: str, st: State) -> None:
    """Remove our entry `name`, or put back the foreign file it displaced."""
    link = bin_dir / name
    keep = bin_dir / HOME / DISPLACED / name
    if name in st.displaced and (keep.exists() or keep.is_symlink()):
        if is_ours(link) or not link.exists():
            os.replace(keep, link)
        st.displaced.remove(name)
    elif is_ours(link):
        link.unlink()
    if name in st.entries:
        st.entries.remove(name)
    fsutil.fsync_dir(bin_dir)


def tidy(bin_dir: Path, st: State) -> None:
    """After a crash: remove half-written temp entries, adopt bundle copies the state does not know
    (retired now, so they expire after the grace period like any other)."""
    for p in [*bin_dir.iterdir(), *(bin_dir / HOME).iterdir()]:
        if p.name.startswith(".") and fsutil.TMP_MARK in p.name:
            fsutil.remove_tree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for p in (bin_dir / HOME).iterdir():
        ours = (DISPLACED, DISPLACED_CONF, st.current, *st.retired)
        if p.is_dir() and p.name not in ours and not p.name.startswith("."):
            log.warning("adopting unrecorded bundle copy %s (retired now)", p)
            st.retired[p.name] = time.time()


def expire(bin_dir: Path, st: State, grace: float, now: float | None = None) -> list[str]:
    """Remove retired bundle copies whose grace period has passed; returns their names."""
    now = time.time() if now is None else now
    gone = [d for d, t in st.retired.items() if d != st.current and now - t >= grace]
    for d in gone:
        fsutil.remove_tree(bin_dir / HOME / d)
        del st.retired[d]
    return gone
