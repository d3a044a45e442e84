"""The netlink messages the VF seam sends, encoded with pyroute2's message classes and checked twice:
decoded again by pyroute2, and walked byte by byte against the kernel's uapi (if_link.h) numbers and
struct sizes. Nothing is sent."""

from __future__ import annotations

import struct

import pytest

from cni.sriov import vf
from cni.sriov.vf import Setting, VfState

NLMSG_HDR, IFINFOMSG = 16, 16
IFLA_VFINFO_LIST, IFLA_VF_INFO = 22, 1
# enum IFLA_VF_* (include/uapi/linux/if_link.h)
IFLA_VF = {"mac": 1, "vlan_legacy": 2, "spoofchk": 4, "link_state": 5, "rate": 6, "trust": 9, "vlan": 12}
IFLA_VF_VLAN_INFO = 1
# struct payload sizes: ifla_vf_mac {u32 vf; u8 mac[32]}, ifla_vf_vlan_info {u32 vf, vlan, qos; __be16
# proto} padded to 16, ifla_vf_rate {u32 vf, min, max}, ifla_vf_{spoofchk,trust,link_state} {u32, u32}
SIZES = {"mac": 36, "vlan": 16, "rate": 12, "spoofchk": 8, "trust": 8, "link_state": 8}

CASES = [
    Setting("vlan", (100, 5, "802.1q")),
    Setting("vlan", (4094, 7, "802.1ad")),
    Setting("vlan", (0, 0, "802.1q")),
    Setting("mac", ("02:11:22:33:44:55",)),
    Setting("rate", (100, 2500)),
    Setting("spoofchk", (0,)),
    Setting("spoofchk", (1,)),
    Setting("trust", (1,)),
    Setting("link_state", (2,)),
]


def nlas(buf: bytes) -> list[tuple[int, bytes]]:
    """(type, payload) of each attribute in `buf` (flags stripped), checking lengths and padding."""
    out, off = [], 0
    while off < len(buf):
        length, kind = struct.unpack_from("=HH", buf, off)
        assert length >= 4 and off + length <= len(buf), "attribute overruns its container"
        out.append((kind & 0x3FFF, buf[off + 4 : off + length]))
        off += (length + 3) & ~3
    assert off == len(buf)
    return out


def vf_attribute(setting: Setting, pf_index: int = 7, vf_index: int = 3) -> tuple[int, bytes]:
    msg = vf.message(pf_index, vf_index, setting)
    msg.encode()
    data = bytes(msg.data)
    assert struct.unpack_from("=I", data)[0] == len(data)
    assert struct.unpack_from("=BxHiII", data, NLMSG_HDR)[2] == pf_index
    [(top, body)] = nlas(data[NLMSG_HDR + IFINFOMSG :])
    assert top == IFLA_VFINFO_LIST
    [(info, inner)] = nlas(body)
    assert info == IFLA_VF_INFO
    [attr] = nlas(inner)
    return attr


@pytest.mark.parametrize("setting", CASES, ids=lambda s: s.describe().replace(" ", "_"))
def test_bytes_match_the_kernel_structs(setting: Setting) -> None:
    kind, payload = vf_attribute(setting)
    assert kind == IFLA_VF[setting.kind]
    v = setting.fields()
    if setting.kind == "vlan":
        [(item, info)] = nlas(payload)
        assert item == IFLA_VF_VLAN_INFO
        assert len(info) == SIZES["vlan"]
        assert struct.unpack("=III", info[:12]) == (3, v["vlan"], v["qos"])
        assert struct.unpack("!H", info[12:14])[0] == vf.PROTOS[str(v["proto"])]  # __be16
        return
    assert len(payload) == SIZES[setting.kind]
    if setting.kind == "mac":
        assert struct.unpack_from("=I", payload)[0] == 3
        assert payload[4:10] == bytes.fromhex(str(v["mac"]).replace(":", ""))
        assert payload[10:] == bytes(26)
    else:
        assert struct.unpack(f"={len(payload) // 4}I", payload) == (3, *setting.values)


@pytest.mark.parametrize("setting", CASES, ids=lambda s: s.describe().replace(" ", "_"))
def test_pyroute2_decodes_what_we_encode(setting: Setting) -> None:
    msg = vf.message(9, 1, setting)
    msg.encode()
    back = vf.codec()(msg.data)
    back.decode()
    assert back["index"] == 9
    info = back.get_attr("IFLA_VFINFO_LIST").get_attr("IFLA_VF_INFO")
    name, _ = vf.attribute(1, setting)
    got = info.get_attr(name)
    v = setting.fields()
    if setting.kind == "vlan":
        item = got.get_attr("IFLA_VF_VLAN_INFO")
        assert (item["vf"], item["vlan"], item["qos"]) == (1, v["vlan"], v["qos"])
        assert vf.PROTO_NAMES[item["proto"]] == v["proto"]
    else:
        assert got["vf"] == 1
        assert {k: got[k] for k in v} == v


def _reply() -> bytes:
    """An RTM_NEWLINK reply of a PF with two VFs, as the kernel fills it (legacy IFLA_VF_VLAN and
    IFLA_VF_VLAN_LIST both present; trust unknown on VF 1)."""

    def info(n: int, mac: str, vlan: int, qos: int, proto: int, spoof: int, trust: int, link: int,
             rate: tuple[int, int]) -> tuple[str, dict[str, object]]:
        return ("IFLA_VF_INFO", {"attrs": [
            ("IFLA_VF_MAC", {"vf": n, "mac": mac}),
            ("IFLA_VF_VLAN", {"vf": n, "vlan": vlan, "qos": qos}),
            ("IFLA_VF_VLAN_LIST", {"attrs": [("IFLA_VF_VLAN_INFO",
                                              {"vf": n, "vlan": vlan, "qos": qos, "proto": proto})]}),
            ("IFLA_VF_RATE", {"vf": n, "min_tx_rate": rate[0], "max_tx_rate": rate[1]}),
            ("IFLA_VF_SPOOFCHK", {"vf": n, "spoofchk": spoof}),
            ("IFLA_VF_LINK_STATE", {"vf": n, "link_state": link}),
            ("IFLA_VF_TRUST", {"vf": n, "trust": trust}),
        ]})

    msg = vf.codec()()
    msg["family"], msg["index"] = 0, 4
    msg["attrs"] = [("IFLA_IFNAME", "pf0"), ("IFLA_NUM_VF", 2), ("IFLA_VFINFO_LIST", {"attrs": [
        info(0, "02:00:00:00:00:01", 0, 0, 0x8100, 1, 0, 0, (0, 0)),
        info(1, "02:00:00:00:00:02", 300, 4, 0x88A8, 0, vf.UNKNOWN, 2, (10, 900)),
    ]})]
    msg.encode()
    return bytes(msg.data)


def test_decode_vf_table() -> None:
    reply = vf.codec()(_reply())
    reply.decode()
    assert vf.decode_vfs(reply) == {
        0: VfState(mac="02:00:00:00:00:01", spoofchk=1, trust=0),
        1: VfState(mac="02:00:00:00:00:02", vlan=300, qos=4, proto="802.1ad", spoofchk=0, trust=-1,
                   link_state=2, min_tx_rate=10, max_tx_rate=900),
    }


def test_a_link_without_vfs_has_an_empty_table() -> None:
    msg = vf.codec()()
    msg["family"], msg["index"], msg["attrs"] = 0, 2, [("IFLA_IFNAME", "veth0")]
    msg.encode()
    back = vf.codec()(msg.data)
    back.decode()
    assert vf.decode_vfs(back) == {}


def test_setting_helpers() -> None:
    state = VfState(mac="02:00:00:00:00:01", vlan=5, qos=1, proto="802.1ad", spoofchk=-1)
    assert Setting.of("vlan", state) == Setting("vlan", (5, 1, "802.1ad"))
    assert Setting("vlan", (7, 0, "802.1q")).applied_to(state).vlan == 7
    assert not Setting.of("spoofchk", state).restorable()
    assert VfState.from_dict(state.to_dict()) == state
    with pytest.raises(ValueError, match="unknown VF setting"):
        vf.attribute(0, Setting("guid", ("x",)))


def test_control_is_netlink_unless_a_test_installs_the_seam(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.fakevf import FakeVf

    monkeypatch.setenv("PYCNI_SRIOV_FAKE_PF", "/nonexistent.json")  # the former switch: nothing now
    assert isinstance(vf.control(), vf.NetlinkVf)
    monkeypatch.setattr(vf, "factory", lambda: FakeVf("/nonexistent.json"))
    assert isinstance(vf.control(), FakeVf)


def test_vlan_info_stays_16_bytes_after_pyroute2_compiled_its_own_classes() -> None:
    """pyroute2 compiles attribute tables per class on first use; a PF's VF list decoded with the
    stock classes (links.get does that) must not leak the stock 14-byte layout into ours."""
    from cni.netlink.codec import ifinfmsg

    stock = ifinfmsg()
    stock["family"], stock["index"] = 0, 1
    stock["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": [
        ("IFLA_VF_MAC", {"vf": 0, "mac": "02:00:00:00:00:01"}),
        ("IFLA_VF_VLAN_LIST", {"attrs": [("IFLA_VF_VLAN_INFO",
                                          {"vf": 0, "vlan": 1, "qos": 0, "proto": 0x8100})]})]})]})]
    stock.encode()
    again = ifinfmsg(stock.data)
    again.decode()
    vf.codec.cache_clear()
    try:
        _, payload = vf_attribute(Setting("vlan", (5, 0, "802.1q")))
        [(_, info)] = nlas(payload)
        assert len(info) == 16
    finally:
        vf.codec.cache_clear()
