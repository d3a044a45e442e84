"""Range math and the allocator at the edges: small and huge prefixes, excludes at start and end,
gateway, start/end, IPv6 end to end, nearly full and very large pools (no address-by-address walk)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from cni.errors import Code, ConfigError, ExhaustedError
from ipam import decide
from ipam.allocator import segments_as_offsets
from ipam.config import from_dict
from ipam.model import Allocation, Pool
from ipam.ranges import IPRange
from tests.unit.helpers import decided

OWNER = Allocation("c1", "ns/p1", "net1")


def rng(**ipam: object) -> IPRange:
    return from_dict({"datastore": "local", **ipam}).ranges[0]


def fill(r: IPRange, offsets: list[int] | range) -> Pool:
    return Pool("p", r.cidr, {str(o): Allocation(f"x{o}", f"ns/x{o}", "net1") for o in offsets})


def all_addresses(r: IPRange, limit: int = 10_000) -> list[str]:
    """Allocate repeatedly until exhausted; the handed-out addresses in order."""
    pool, out = Pool("p", r.cidr), []
    for i in range(limit):
        try:
            d = decided(r, pool, Allocation(f"c{i}", "", "net1"))
        except ExhaustedError:
            return out
        pool = Pool("p", r.cidr, {**pool.allocations, str(d.offset): Allocation(f"c{i}", "", "net1")})
        out.append(str(r.address(d.offset)))
    raise AssertionError("never exhausted")


@pytest.mark.parametrize(
    ("cidr", "expected"),
    [
        ("198.51.100.0/30", ["198.51.100.1", "198.51.100.2"]),
        ("198.51.100.8/29", [f"198.51.100.{i}" for i in range(9, 15)]),
        ("2001:db8::/127", ["2001:db8::1"]),
        ("2001:db8::/126", ["2001:db8::1", "2001:db8::2", "2001:db8::3"]),
    ],
)
def test_small_ranges_hand_out_exactly_the_usable_addresses(cidr: str, expected: list[str]) -> None:
    assert all_addresses(rng(range=cidr)) == expected


@pytest.mark.parametrize("cidr", ["198.51.100.0/31", "198.51.100.7/32", "2001:db8::/128"])
def test_ranges_without_a_usable_address_are_config_errors(cidr: str) -> None:
    with pytest.raises(ConfigError, match=r"ipam\.range: no usable address"):
        rng(range=cidr)


def test_ipv6_120_uses_last_address_never_network() -> None:
    got = all_addresses(rng(range="2001:db8::100/120"))
    assert len(got) == 255 and got[0] == "2001:db8::101" and got[-1] == "2001:db8::1ff"


def test_ipv4_never_network_broadcast_or_gateway() -> None:
    got = all_addresses(rng(range="198.51.100.0/24", gateway="198.51.100.1"))
    assert "198.51.100.0" not in got and "198.51.100.255" not in got and "198.51.100.1" not in got
    assert len(got) == 253 and got[0] == "198.51.100.2"


def test_gateway_of_the_other_family_is_ignored_per_range() -> None:
    r = rng(range="2001:db8::/64", gateway="198.51.100.1")
    assert r.size == 2**64 - 1


def test_ipv6_64_end_to_end() -> None:
    r = rng(range="2001:db8:0:1::/64", range_start="2001:db8:0:1:ffff:ffff:ffff:fffe")
    assert all_addresses(r) == ["2001:db8:0:1:ffff:ffff:ffff:fffe", "2001:db8:0:1:ffff:ffff:ffff:ffff"]


def test_excludes_touching_start_and_end() -> None:
    r = rng(
        range="198.51.100.0/24",
        range_start="198.51.100.10",
        range_end="198.51.100.20",
        exclude=["198.51.100.8/30", "198.51.100.20", "198.51.100.16/30"],
    )
    # 8/30 covers .8-.11 (touches the start), 16/30 covers .16-.19 and .20 is the end itself
    assert all_addresses(r) == ["198.51.100.12", "198.51.100.13", "198.51.100.14", "198.51.100.15"]


def test_exclude_everything_is_a_config_error_naming_the_range() -> None:
    with pytest.raises(ConfigError, match=r"ipam\.range: no usable address in 198\.51\.100\.0/30 after"):
        rng(range="198.51.100.0/30", exclude=["198.51.100.0/30"])


def test_start_end_notation() -> None:
    r = rng(range="198.51.100.100-198.51.100.102/24")
    assert r.cidr == "198.51.100.0/24"
    assert all_addresses(r) == ["198.51.100.100", "198.51.100.101", "198.51.100.102"]


def test_host_bits_are_cleared() -> None:
    assert rng(range="198.51.100.225/28").cidr == "198.51.100.224/28"


def test_dual_stack_ranges_one_each() -> None:
    conf = from_dict(
        {"datastore": "local", "ipRanges": [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/64"}]}
    )
    assert [r.cidr for r in conf.ranges] == ["198.51.100.0/24", "2001:db8::/64"]
    assert conf.ranges[1].size == 2**64 - 1


def test_lowest_free_fills_the_first_gap() -> None:
    r = rng(range="198.51.100.0/24")
    pool = fill(r, [1, 2, 3, 5, 6])
    assert decided(r, pool, OWNER).offset == 4
    assert decided(r, fill(r, range(1, 100)), OWNER).offset == 100


def test_blocked_offsets_are_skipped() -> None:
    r = rng(range="198.51.100.0/24")
    assert decided(r, fill(r, [1]), OWNER, blocked=frozenset({2, 3})).offset == 4


def test_same_owner_gets_the_same_address_without_a_write() -> None:
    r = rng(range="198.51.100.0/24")
    pool = Pool("p", r.cidr, {"7": OWNER, "1": Allocation("c9", "ns/p9", "net1")})
    d = decided(r, pool, OWNER._replace(pod_uid="u"))
    assert (d.offset, d.kind) == (7, "existing")


def test_same_pod_and_ifname_with_a_new_container_takes_over() -> None:
    r = rng(range="198.51.100.0/24")
    pool = Pool("p", r.cidr, {"7": OWNER})
    newer = OWNER._replace(container_id="c2")
    d = decided(r, pool, newer)
    assert (d.offset, d.kind) == (7, "takeover")
    other_if = decided(r, pool, newer._replace(ifname="net2"))
    assert other_if.kind == "new" and other_if.offset == 1


def test_no_takeover_without_a_pod_reference() -> None:
    r = rng(range="198.51.100.0/24")
    anon = Allocation("c1", "", "net1")
    pool = Pool("p", r.cidr, {"7": anon})
    assert decided(r, pool, anon._replace(container_id="c2")).kind == "new"


def test_exhausted_names_the_range() -> None:
    r = rng(range="198.51.100.0/30")
    with pytest.raises(ExhaustedError, match=r"no free address in range 198\.51\.100\.0/30") as e:
        decided(r, fill(r, [1, 2]), OWNER)
    assert e.value.code == Code.POOL_EXHAUSTED and e.value.code >= 100


def test_bad_keys_are_skipped_not_fatal() -> None:
    r = rng(range="198.51.100.0/24")
    other = Allocation("a", "ns/other", "net1")
    pool = Pool(
        "p",
        r.cidr,
        {"1": other, "x": other._replace(container_id="b"), "01": other._replace(container_id="d")},
    )
    assert decided(r, pool, OWNER).offset == 2


def test_a_del_frees_only_the_attachment() -> None:
    r = rng(range="198.51.100.0/24")
    pool = Pool(
        "p", r.cidr, {"1": OWNER, "2": OWNER._replace(ifname="net2"), "3": OWNER._replace(container_id="z")}
    )
    done = decide.decide(decide.SnapshotView(pool), [decide.Del(OWNER)], segments_as_offsets(r))
    assert done.outcomes == [decide.Freed((("1", OWNER),))] and done.update().remove == frozenset({"1"})


class Probed(list[int]):
    """A sorted list of taken offsets that counts how many of its items are read."""

    reads = 0

    def __getitem__(self, i: Any) -> Any:
        self.reads += 1
        return super().__getitem__(i)


def test_nearly_full_and_huge_pools_are_fast() -> None:
    """100,000 allocations packed at the start of a /64 and 60,000 in a /16 with one hole near the end:
    the answer comes from a binary search, not a walk (a few dozen reads of the taken offsets, where a
    walk reads them all)."""
    r6 = rng(range="2001:db8::/64")
    pool6 = fill(r6, range(1, 100_001))
    r4 = rng(range="198.18.0.0/16")
    taken = [o for o in range(1, 60_001) if o != 59_990]
    pool4 = fill(r4, taken)
    assert decided(r6, pool6, OWNER).offset == 100_001
    assert decided(r4, pool4, OWNER).offset == 59_990
    packed, holed = Probed(range(1, 100_001)), Probed(taken)
    assert decide.lowest_free(segments_as_offsets(r6), packed) == 100_001
    assert decide.lowest_free(segments_as_offsets(r4), holed) == 59_990
    assert packed.reads < 200 and holed.reads < 200  # binary searches: ~50 reads; a walk: 60,000 or more
    assert decide.lowest_free([(1, 2**64 - 1)], [1, 2, 2**63]) == 3
    assert decide.lowest_free([(5, 5), (2**100, 2**100 + 1)], [5, 2**100]) == 2**100 + 1


def test_address_math_is_128_bit() -> None:
    r = rng(range="2001:db8::/32")
    assert r.address(2**96 - 1) == ipaddress.ip_address("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")
    assert r.offset(ipaddress.ip_address("2001:db8::1:0:0:0")) == 2**48
