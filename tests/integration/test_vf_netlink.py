"""The netlink VF seam against a real kernel. A veth has no VFs, so the kernel parses each RTM_SETLINK
(the attribute lengths are checked against its policy before any driver is asked) and then refuses
it with EOPNOTSUPP; a malformed attribute is refused earlier (EINVAL, or ERANGE on newer kernels).
That tells the encodings apart without SR-IOV hardware. Its answer to RTM_GETLINK with
RTEXT_FILTER_VF (no IFLA_NUM_VF, no IFLA_VFINFO_LIST: it has no bus parent) goes through the same
decoder as a PF's."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator

import pytest

from cni import netns
from cni.errors import KernelError
from cni.netlink import links, vfinfo
from cni.netlink.socket import Netlink, opened
from cni.sriov import vf
from cni.sriov.vf import NetlinkVf, Setting
from tests.nsutil import Topology

SETTINGS = [Setting("vlan", (100, 3, "802.1ad")), Setting("mac", ("02:11:22:33:44:55",)),
            Setting("rate", (10, 1000)), Setting("spoofchk", (0,)), Setting("trust", (1,)),
            Setting("link_state", (2,))]


@pytest.fixture
def in_host(topo: Topology) -> Iterator[str]:
    """Run the test body inside the topology's host namespace; yields the 'PF' (a veth end)."""
    with netns.opened(f"/run/netns/{topo.host}") as fd, netns.entered(fd):
        yield topo.uplink


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.kind)
def test_kernel_parses_each_request_and_the_veth_refuses_it(in_host: str, setting: Setting) -> None:
    with pytest.raises(KernelError) as info:
        NetlinkVf().set(in_host, 0, setting)
    assert f"PF {in_host}: set VF 0 {setting.kind}" in info.value.msg
    assert "Operation not supported" in info.value.msg


def _send_raw(nl: Netlink, data: bytearray) -> int:
    """Send an encoded request as is; the kernel's error code (0 = success)."""
    struct.pack_into("=HHI", data, 4, vfinfo.RTM_SETLINK, 0x5, 4242)  # NLM_F_REQUEST|NLM_F_ACK, seq
    nl.sock.send(bytes(data))
    while True:
        reply = nl.sock.recv(65536)
        _, kind, _, seq, _ = struct.unpack_from("=IHHII", reply)
        if seq == 4242 and kind == 2:  # NLMSG_ERROR
            return -int(struct.unpack_from("=i", reply, 16)[0])


def test_a_short_attribute_is_refused_before_the_driver(in_host: str) -> None:
    """Control for the test above: an IFLA_VF_MAC carrying only 8 bytes fails parsing, not the driver."""
    with opened(None) as nl:
        index = links.get(nl, in_host).index  # type: ignore[union-attr]
        data = bytearray(vf.message(index, 0, Setting("spoofchk", (1,))).encode(0, 0, 0))
        inner = 16 + 16 + 4 + 4  # nlmsghdr, ifinfomsg, IFLA_VFINFO_LIST and IFLA_VF_INFO headers
        assert struct.unpack_from("=HH", data, inner) == (12, 4)  # IFLA_VF_SPOOFCHK, 8-byte payload
        struct.pack_into("=H", data, inner + 2, 1)  # relabel it IFLA_VF_MAC (needs 36 bytes)
        assert _send_raw(nl, data) in (errno.EINVAL, errno.ERANGE)  # the policy's minimum length
        good = vf.message(index, 0, Setting("mac", ("02:11:22:33:44:55",))).encode(0, 0, 0)
        assert _send_raw(nl, bytearray(good)) == errno.EOPNOTSUPP


def test_reading_a_pf_without_vfs(in_host: str) -> None:
    with pytest.raises(KernelError, match=f"PF {in_host}: reports no VF 0"):
        NetlinkVf().read(in_host, 0)
    with pytest.raises(KernelError, match="PF nosuchpf0: no such interface"):
        NetlinkVf().read("nosuchpf0", 0)


def test_a_link_without_vfs_decodes_to_an_empty_vf_list(in_host: str) -> None:
    with opened(None) as nl:
        pf = vfinfo.get(nl, in_host)
        plain = links.get(nl, in_host)
        assert vfinfo.get(nl, "nosuchpf0") is None
    assert pf is not None and plain is not None
    assert pf.link == plain and pf.link.name == in_host and pf.link.kind == "veth"
    assert (pf.num_vf, pf.vfs) == (None, ())
