"""Requested addresses (ipam.requested): where they come from, which the config can give (code 7 naming the
address and the rule), and how allocation and the engine hold exactly them (the allocator's decision
with a requested offset, reservations across overlapping ranges, code 109 naming the holder, nothing
left behind, DEL, GC, dual stack)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni.errors import AddressTakenError, CniError, Code
from cni.types import args as cni_args
from cni.types.netconf import Request
from ipam import decide, requested
from ipam.config import from_dict
from ipam.engine import Engine, Retry
from ipam.model import Allocation, Pool
from tests.memstore import Backend, MemoryStore
from tests.unit.helpers import decided
from tests.unit.ipam.test_decide import owners, pools, segments  # the core's own strategies

A = Allocation("ca", "ns/a", "net1", "uid-a", "netA", "node1")
B = Allocation("cb", "ns/b", "net1", "uid-b", "netA", "node1")


def request(conf: dict[str, Any] | None = None, cni_arg_text: str = "") -> Request:
    return Request("ADD", "1.1.0", conf or {}, b"", args=cni_args.parse(cni_arg_text))


def texts(want: tuple[requested.Wanted, ...]) -> list[tuple[str, int | None, str]]:
    return [(str(w.address), w.prefixlen, w.path) for w in want]


# ---- sources ---------------------------------------------------------------------------------------


def test_no_request_is_empty() -> None:
    assert requested.wanted(request()) == ()
    assert requested.wanted(request({"runtimeConfig": {"ips": []}}, "IgnoreUnknown=1")) == ()


def test_cni_args_ip_is_comma_separated_as_the_static_plugin_reads_it() -> None:
    want = requested.wanted(request(cni_arg_text="IgnoreUnknown=1;IP=198.51.100.7/24, 2001:db8::7"))
    assert texts(want) == [("198.51.100.7", 24, "CNI_ARGS IP[0]"), ("2001:db8::7", None, "CNI_ARGS IP[1]")]


def test_args_cni_ips_win_over_cni_args_and_runtime_config_over_both() -> None:
    env = "IP=198.51.100.5"
    assert texts(requested.wanted(request({"args": {"cni": {"ips": ["198.51.100.6"]}}}, env))) == [
        ("198.51.100.6", None, "args.cni.ips[0]")
    ]
    conf = {"args": {"cni": {"ips": ["198.51.100.6"]}}, "runtimeConfig": {"ips": ["198.51.100.7/24"]}}
    assert texts(requested.wanted(request(conf, env))) == [("198.51.100.7", 24, "runtimeConfig.ips[0]")]


def test_a_malformed_cni_args_ip_is_code_4_and_a_malformed_runtime_config_entry_code_7() -> None:
    with pytest.raises(CniError) as err:
        requested.wanted(request(cni_arg_text="IP=198.51.100.7,nonsense"))
    assert err.value.code == Code.INVALID_ENV and "CNI_ARGS IP[1]" in err.value.msg
    with pytest.raises(CniError) as err:
        requested.wanted(request({"runtimeConfig": {"ips": ["198.51.100.7", 7]}}))
    assert err.value.code == Code.INVALID_CONFIG and "runtimeConfig.ips[1]" in err.value.msg
    with pytest.raises(CniError) as err:
        requested.wanted(request({"args": {"cni": {"ips": "198.51.100.7"}}}))
    assert err.value.code == Code.INVALID_CONFIG and "args.cni.ips" in err.value.msg


# ---- rules -----------------------------------------------------------------------------------------

DUAL = {
    "datastore": "local",
    "ipRanges": [
        {"range": "198.51.100.0/24", "range_start": "198.51.100.10", "range_end": "198.51.100.200",
         "exclude": ["198.51.100.64/28"]},
        {"range": "2001:db8::/64"},
    ],
    "gateway": "198.51.100.1",
}  # fmt: skip


def place(*ips: str, ipam: dict[str, Any] | None = None) -> dict[int, int]:
    conf = from_dict(ipam or DUAL)
    want = requested.wanted(request({"runtimeConfig": {"ips": list(ips)}}))
    return requested.place(conf.ranges, conf.gateway, want)


def test_one_address_per_family_is_placed_in_its_range() -> None:
    assert place("2001:db8::7/64", "198.51.100.20/24") == {0: 20, 1: 7}
    assert place("198.51.100.20") == {0: 20}


@pytest.mark.parametrize(
    ("ip", "rule"),
    [
        ("198.51.100.0", "is the network address of 198.51.100.0/24"),
        ("198.51.100.255", "is the broadcast address of 198.51.100.0/24"),
        ("198.51.100.1", "is the gateway"),
        ("198.51.100.70", "is excluded (198.51.100.64/28)"),
        ("198.51.100.5", "is outside range_start-range_end 198.51.100.10-198.51.100.200"),
        ("198.51.100.201", "is outside range_start-range_end 198.51.100.10-198.51.100.200"),
        ("2001:db8::", "is the network address of 2001:db8::/64"),
        ("198.18.0.7", "is not inside any IPv4 range of this config (198.51.100.0/24)"),
        ("2001:db8:1::7", "is not inside any IPv6 range of this config (2001:db8::/64)"),
        ("198.51.100.20/25", "prefix /25 is not the range's /24"),
    ],
)
def test_an_address_the_config_cannot_give_is_code_7_naming_it_and_the_rule(ip: str, rule: str) -> None:
    with pytest.raises(CniError) as err:
        place(ip)
    assert err.value.code == Code.INVALID_CONFIG
    assert err.value.msg.startswith("runtimeConfig.ips[0]: ") and ip.partition("/")[0] in err.value.msg
    assert rule in err.value.msg


def test_a_family_without_a_range_is_code_7() -> None:
    with pytest.raises(CniError) as err:
        place("2001:db8::7", ipam={"datastore": "local", "range": "198.51.100.0/24"})
    assert err.value.code == Code.INVALID_CONFIG
    assert "2001:db8::7: this config has no IPv6 range (it has 198.51.100.0/24)" in err.value.msg


def test_two_addresses_in_one_range_are_code_7() -> None:
    with pytest.raises(CniError) as err:
        place("198.51.100.20", "198.51.100.21")
    assert err.value.code == Code.INVALID_CONFIG
    assert "runtimeConfig.ips[1]: 198.51.100.21: runtimeConfig.ips[0] already asks for" in err.value.msg


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=255))
def test_an_address_is_placed_exactly_when_the_range_could_hand_it_out(last: int) -> None:
    conf = from_dict(DUAL)
    rng = conf.ranges[0]
    ip = ipaddress.ip_address(f"198.51.100.{last}")
    try:
        got = place(str(ip))
    except CniError as e:
        assert e.code == Code.INVALID_CONFIG
        assert not rng.allocatable(int(ip))
    else:
        assert rng.allocatable(int(ip)) and got == {0: last}


# ---- the core's decision, as the executor acts on it -----------------------------------------

RNG = from_dict({"datastore": "local", "range": "198.51.100.0/24"}).ranges[0]


def pool(**entries: Allocation) -> Pool:
    return Pool("p", RNG.cidr, {k.removeprefix("o"): v for k, v in entries.items()}, "1")


def test_a_free_requested_offset_is_taken_exactly() -> None:
    d = decided(RNG, pool(o1=B), A, want=9)
    assert (d.offset, d.kind) == (9, "new")


def test_a_requested_offset_held_by_another_pod_is_code_109_naming_it() -> None:
    with pytest.raises(AddressTakenError) as err:
        decided(RNG, pool(o9=B), A, want=9)
    assert err.value.code == Code.ADDRESS_TAKEN == 109
    assert err.value.msg == "requested address 198.51.100.9 is held by pod ns/b (container cb net1)"
    assert err.value.details == "pool p; nothing allocated"
    with pytest.raises(AddressTakenError):
        decided(RNG, pool(), A, blocked=frozenset({9}), want=9)


def test_the_same_attachment_keeps_it_and_the_same_pod_interface_takes_it_over() -> None:
    d = decided(RNG, pool(o9=A), A, want=9)
    assert (d.offset, d.kind) == (9, "existing")
    again = A._replace(container_id="ca2")
    d = decided(RNG, pool(o9=A), again, want=9)
    assert (d.offset, d.kind) == (9, "takeover")
    d = decided(RNG, pool(o5=A), again, want=9)  # a request moves no other entry
    assert (d.offset, d.kind) == (9, "new")


def test_the_same_attachment_holding_another_address_is_code_7() -> None:
    with pytest.raises(CniError) as err:
        decided(RNG, pool(o5=A), A, want=9)
    assert err.value.code == Code.INVALID_CONFIG and "already holds 198.51.100.5" in err.value.msg


# ---- the engine over the memory store --------------------------------------------------------------


def make(ipam: dict[str, Any], backend: Backend) -> Engine:
    conf = from_dict({"datastore": "local", **ipam})
    retry = Retry(clock=lambda: 0.0, sleep=lambda s: None, rand=lambda: 0.5)
    return Engine(MemoryStore(backend), conf, retry)


def addrs(got: list[Any]) -> list[str]:
    return [str(r.address(o)) for r, o in got]


def reservations(backend: Backend) -> dict[str, str]:
    return {r.name: r.owner.podref for r in MemoryStore(backend).iter_reservations()}


def test_engine_takes_the_request_others_skip_it_and_del_frees_it() -> None:
    backend = Backend()
    e = make({"range": "198.51.100.0/24"}, backend)
    assert addrs(e.add(A, {0: 1})) == ["198.51.100.1"]
    assert addrs(e.add(A, {0: 1})) == ["198.51.100.1"]  # a repeated ADD
    assert addrs(e.add(B)) == ["198.51.100.2"]  # allocated as usual, past it
    e.delete(A)
    assert "198.51.100.1" not in reservations(backend)
    assert addrs(e.add(B._replace(container_id="cc", podref="ns/c"), {0: 1})) == ["198.51.100.1"]


def test_engine_refuses_an_address_another_network_reserved_and_leaves_nothing_behind() -> None:
    backend = Backend()
    wide = make({"range": "198.51.100.0/24"}, backend)
    narrow = make({"range": "198.51.100.0/28", "network_name": ""}, backend)
    assert addrs(narrow.add(B, {0: 7})) == ["198.51.100.7"]
    before = (reservations(backend), {n: dict(p.allocations) for n, p in backend.pools.items()})
    with pytest.raises(AddressTakenError) as err:
        wide.add(A, {0: 7})
    assert err.value.msg == "requested address 198.51.100.7 is held by pod ns/b (container cb net1)"
    assert "reservation 198.51.100.7" in err.value.details
    assert (reservations(backend), {n: dict(p.allocations) for n, p in backend.pools.items()}) == before
    assert addrs(wide.add(A)) == ["198.51.100.1"]  # an unrequested ADD never gets it either
    assert addrs(wide.add(A._replace(container_id="c3", podref="ns/c"))) == ["198.51.100.2"]


def test_dual_stack_one_family_requested_the_other_allocated_and_a_failure_rolls_both_back() -> None:
    backend = Backend()
    e = make({"ipRanges": [{"range": "198.51.100.0/24"}, {"range": "2001:db8::/64"}]}, backend)
    assert addrs(e.add(A, {1: 0x77})) == ["198.51.100.1", "2001:db8::77"]
    with pytest.raises(AddressTakenError):
        e.add(B, {1: 0x77})  # its IPv4 address was allocated first: released again
    assert all(a.container_id != "cb" for p in backend.pools.values() for a in p.allocations.values())
    assert sorted(reservations(backend).values()) == ["ns/a", "ns/a"]


def test_gc_releases_a_requested_address_like_any_other() -> None:
    backend = Backend()
    e = make({"range": "198.51.100.0/24"}, backend)
    e.add(A, {0: 50})
    e.add(B)
    e.gc("netA", "node1", {("cb", "net1")})
    assert list(reservations(backend).values()) == ["ns/b"]
    assert addrs(e.add(B._replace(container_id="cc", podref="ns/c"), {0: 50})) == ["198.51.100.50"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "ask", "del"]), st.integers(0, 5), st.integers(1, 6),
                          st.booleans()), max_size=25))  # fmt: skip
def test_requests_never_share_an_address_and_a_refusal_names_the_real_holder(
    steps: list[tuple[str, int, int, bool]],
) -> None:
    """Random ADDs (with and without a request) and DELs of six pods on two networks over overlapping
    ranges (a /29 and a /28): every address held once cluster-wide, a granted request is exactly the
    address asked for, a refused one names the pod whose reservation holds it, and a refused ADD leaves
    nothing of its pod."""
    backend = Backend()
    nets = [make({"range": "198.51.100.0/29"}, backend), make({"range": "198.51.100.0/28"}, backend)]
    holding: dict[str, tuple[str, int]] = {}  # pod -> (address, network index)
    for kind, n, offset, wide in steps:
        pod = f"ns/p{n}"
        owner = Allocation(f"c{n}", pod, "net1", f"uid-{n}", "netA", "node1")
        net = int(wide) if pod not in holding else holding[pod][1]
        e = nets[net]
        if kind == "del":
            e.delete(owner)
            holding.pop(pod, None)
            continue
        want = {0: offset} if kind == "ask" else None
        try:
            got = addrs(e.add(owner, want))
        except AddressTakenError as err:
            holder = reservations(backend)[f"198.51.100.{offset}"]
            assert f"held by pod {holder} " in err.msg and holder != pod
            assert pod not in reservations(backend).values()
            continue
        except CniError as err:  # a pod asking again for another address, or a /29 exhausted
            assert err.code in (Code.INVALID_CONFIG, Code.POOL_EXHAUSTED)
            continue
        if want is not None:
            assert got == [f"198.51.100.{offset}"]
        holding[pod] = (got[0], net)
        held = sorted(reservations(backend).items())
        assert sorted((f"198.51.100.{a.rsplit('.', 1)[1]}", p) for p, (a, _) in holding.items()) == held


# ---- the decision core (ipam.decide) with a requested offset ----------------------------------------


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[tuple[int, int]], Pool, Allocation, int]:
    segs = draw(segments())
    inside = [o for lo, hi in segs for o in range(lo, hi + 1)]
    return segs, draw(pools(segs)), draw(owners), draw(st.sampled_from(inside))


@settings(max_examples=300, deadline=None)
@given(requests(), st.sets(st.integers(1, 40), max_size=4))
def test_decide_gives_exactly_the_requested_offset_or_names_who_holds_it(
    case: tuple[list[tuple[int, int]], Pool, Allocation, int], blocked: set[int]
) -> None:
    segs, pool, who, want = case
    entry = pool.allocations.get(str(want))
    mine = [int(k) for k, a in pool.allocations.items() if a.same_attachment(who)]
    changes = decide.Changes(decide.SnapshotView(pool))
    outcome = decide.one(changes, decide.Add(who, blocked=frozenset(blocked), want=want), segs)
    if mine and mine[0] != want:
        assert outcome == decide.Elsewhere(mine[0], want) and not changes.update()
    elif entry is not None and (entry.same_attachment(who) or entry.same_pod_interface(who)):
        assert isinstance(outcome, decide.Took) and outcome.offset == want  # existing, or a takeover
        assert outcome.kind == ("existing" if entry.same_attachment(who) else "takeover")
    elif entry is not None or want in blocked:
        assert outcome == decide.Taken(want, entry) and not changes.update()
    else:
        assert outcome == decide.Took(want, "new") and dict(changes.update().put) == {str(want): who}
