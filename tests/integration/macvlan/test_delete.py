"""DEL is idempotent and best effort: it succeeds whatever is already gone, always releases the IPAM
allocation, and never removes a link that is not a macvlan."""

from __future__ import annotations

import os

import pytest

from tests.integration.macvlan.harness import Env, error
from tests.nsutil import sh


def added(env: Env) -> dict[str, object]:
    conf = env.conf()
    env.add(conf)
    assert env.allocations() == ["c1--net1"]
    return conf


def released(env: Env, dels: int = 1) -> None:
    assert env.allocations() == []
    assert env.calls().count(("DEL", "c1", "net1")) == dels


def test_del_twice(env: Env) -> None:
    conf = added(env)
    assert env.run("DEL", conf).ok
    second = env.run("DEL", conf)
    assert second.ok, second.out
    assert second.out is None  # DEL prints nothing on success
    assert env.pod_links() == ["lo"]
    released(env, dels=2)


def test_del_after_netns_deleted(env: Env) -> None:
    conf = added(env)
    sh("ip", "netns", "del", os.path.basename(env.pod))
    call = env.run("DEL", conf)
    assert call.ok, call.out
    released(env)


def test_del_with_unmounted_netns_file(env: Env) -> None:
    """The runtime unmounted the namespace but the bind-mount target file is still there."""
    conf = added(env)
    sh("umount", env.pod)
    assert os.path.isfile(env.pod) and os.path.getsize(env.pod) == 0
    call = env.run("DEL", conf)
    assert call.ok, call.out
    released(env)


def test_del_without_netns(env: Env) -> None:
    conf = added(env)
    call = env.run("DEL", conf, netns="")
    assert call.ok, call.out
    released(env)
    assert "net1" in env.pod_links()  # nothing told the plugin where the link is
    env.topo.ip(env.pod, "link", "del", "net1")


def test_del_when_link_already_gone(env: Env) -> None:
    conf = added(env)
    env.topo.ip(env.pod, "link", "del", "net1")
    call = env.run("DEL", conf)
    assert call.ok, call.out
    released(env)


def test_del_leaves_a_foreign_link_alone(env: Env) -> None:
    """A veth called net1 (not ours: not a macvlan) survives DEL; the IPAM is still released."""
    conf = env.conf()
    env.topo.ip(env.pod, "link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    call = env.run("DEL", conf)
    assert call.ok, call.out
    assert env.link()["linkinfo"]["info_kind"] == "veth"
    released(env)


@pytest.mark.parametrize("kind", ["directory", "mount-namespace"])
def test_del_netns_path_that_is_not_a_network_namespace(env: Env, kind: str) -> None:
    """A path that exists but is no network namespace: an error naming it (the runtime sent something
    wrong), after the IPAM release (no retry could ever reach the link; the address must not leak)."""
    conf = added(env)
    if kind == "directory":
        path = str(env.state.parent / "not-a-netns")
        os.mkdir(path)
    else:
        path = "/proc/self/ns/mnt"  # the plugin's own mount namespace: a live namespace, not a netns
    error(env.run("DEL", conf, netns=path), 4, path, "not a network namespace")
    released(env)
    assert env.link()["linkinfo"]["info_kind"] == "macvlan"  # out of reach, so untouched


def test_del_leaves_a_macvlan_with_that_altname_alone(env: Env) -> None:
    """The kernel resolves a name through altnames too: a macvlan of someone else that merely carries
    net1 as an alternative name is not the attachment's link."""
    conf = env.conf()
    other = f"{env.topo.tag}mv"
    env.topo.ip(env.topo.host, "link", "add", other, "link", env.topo.uplink, "type", "macvlan")
    env.topo.ip(env.topo.host, "link", "set", other, "netns", os.path.basename(env.pod))
    env.topo.ip(env.pod, "link", "property", "add", "dev", other, "altname", "net1")
    call = env.run("DEL", conf)
    assert call.ok, call.out
    assert env.pod_links() == ["lo", other]
    released(env)


def test_del_after_master_gone(env: Env) -> None:
    """Deleting the uplink takes its macvlans with it; DEL still succeeds and releases the IPAM."""
    conf = added(env)
    env.topo.ip(env.topo.host, "link", "del", env.topo.uplink)
    assert env.pod_links() == ["lo"]
    call = env.run("DEL", conf)
    assert call.ok, call.out
    released(env)
