"""State files: atomic, 0600 in 0700 directories, never through a symlink; locks; records."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

import pytest

from cni.device.records import Attachment, Netdev, Records, netns_id, owner_alive, same_attachment
from cni.device.statedir import StateDir
from cni.errors import CniError


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_write_is_atomic_and_private(tmp_path: Path) -> None:
    top = tmp_path / "a" / "state"
    sd = StateDir(str(top))
    sd.write("attachments", "c1:net1", b"one")
    sd.write("attachments", "c1:net1", b"two")
    assert sd.read("attachments", "c1:net1") == b"two"
    assert os.listdir(top / "attachments") == ["c1:net1"]  # no temp file left behind
    assert mode(top) == 0o700 and mode(top / "attachments") == 0o700
    assert mode(top / "attachments" / "c1:net1") == 0o600
    assert sd.read("attachments", "missing") is None
    assert sd.remove("attachments", "c1:net1") and not sd.remove("attachments", "c1:net1")


def test_symlinked_file_is_refused(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path / "state"))
    sd.write("owners", "x", b"{}")
    victim = tmp_path / "victim"
    victim.write_text("secret")
    os.symlink(victim, tmp_path / "state" / "owners" / "pci-0000:af:06.0")
    with pytest.raises(CniError, match="is a symlink"):
        sd.read("owners", "pci-0000:af:06.0")
    sd.write("owners", "pci-0000:af:06.0", b"new")  # replaces the link itself, never writes through it
    assert victim.read_text() == "secret"
    assert not os.path.islink(tmp_path / "state" / "owners" / "pci-0000:af:06.0")


def test_symlinked_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "state").mkdir()
    os.symlink(elsewhere, tmp_path / "state" / "attachments")
    with pytest.raises(CniError, match="attachments is a symlink or not a directory") as info:
        StateDir(str(tmp_path / "state")).write("attachments", "c:i", b"x")
    assert info.value.code == 5
    assert os.listdir(elsewhere) == []
    os.symlink(elsewhere, tmp_path / "linked-top")
    with pytest.raises(CniError, match="is a symlink"):
        StateDir(str(tmp_path / "linked-top")).names("owners")


def test_lock_times_out_with_code_11(tmp_path: Path) -> None:
    sd = StateDir(str(tmp_path))
    with sd.lock("pci-0000:af:06.0", "VF 0000:af:06.0"):
        fd = os.open(tmp_path / "locks" / "pci-0000:af:06.0", os.O_RDWR)
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        other = StateDir(str(tmp_path)).lock("pci-0000:af:06.0", "VF 0000:af:06.0", timeout=0.1)
        with pytest.raises(CniError, match=r"VF 0000:af:06\.0 is locked by another operation") as info, other:
            pass
        assert info.value.code == 11
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit
    os.close(fd)


def attachment(**kw: object) -> Attachment:
    base = dict(plugin="sriov", network="net", container_id="c1", ifname="net1", netns="/run/netns/p",
                key="pci-0000:af:06.1", pci="0000:af:06.1",
                netdev=Netdev("ens1f0v1", 7, "02:00:00:00:00:01", 1500, True, "", ("enp175s6",)),
                extra={"pf": "ens1f0", "vf": 1})
    base.update(kw)
    return Attachment(**base)  # type: ignore[arg-type]


def test_records_round_trip_and_ownership(tmp_path: Path) -> None:
    recs = Records(str(tmp_path))
    att = attachment()
    recs.claim(att)
    recs.save(att)
    assert recs.load("c1", "net1") == att
    assert recs.all() == [att]
    owner = recs.owner(att.key)
    assert owner is not None and same_attachment(owner, att)
    other = attachment(container_id="c2")
    recs.unclaim(other)  # not its record: left alone
    assert recs.owner(att.key) is not None
    recs.forget(att)
    assert recs.owner(att.key) is None and recs.load("c1", "net1") is None
    dpdk = attachment(netdev=None)
    assert dpdk.userspace and Attachment.from_dict(dpdk.to_dict()) == dpdk


def test_corrupt_record_is_moved_aside(tmp_path: Path) -> None:
    recs = Records(str(tmp_path))
    recs.dir.write("attachments", "c1:net1", b"{not json")
    assert recs.load("c1", "net1") is None
    assert os.listdir(tmp_path / "attachments") == ["c1:net1.corrupt"]
    assert recs.all() == []


def test_owner_liveness_follows_the_namespace_identity(tmp_path: Path) -> None:
    ns = tmp_path / "ns"
    ns.write_text("")
    owner = {"netns": str(ns), "netnsID": netns_id(str(ns))}
    assert owner_alive(owner)
    assert not owner_alive({**owner, "netnsID": "1:2"})  # the path now names another namespace
    ns.unlink()
    assert not owner_alive(owner)
