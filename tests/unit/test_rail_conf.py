"""cni.plugins.rail without a kernel: the `rail` and `sysctl` options parsed (code 7 naming the field),
sysctl keys mapped to /proc/sys/net paths only for the interface's own keys, and the rail table's routes
computed from an IPAM result."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from cni.errors import ConfigError
from cni.plugins.rail import RailConf, sources, table_routes, wanted_sysctls
from cni.types.result import IPConfig, Result, Route


def parse(ifname: str = "net1", **conf: Any) -> RailConf:
    return RailConf.from_conf(conf, ifname)


def test_off_by_default_and_forms_of_rail() -> None:
    assert parse() == RailConf() and not parse().active
    assert parse(rail=False) == RailConf()
    assert parse(rail=True) == RailConf(rail=True)
    assert parse(rail={}) == RailConf(rail=True)
    assert parse(rail={"table": 1001}) == RailConf(rail=True, table=1001)


def test_sysctl_keys_of_the_interface() -> None:
    conf = parse(sysctl={"net.ipv4.conf.IFNAME.arp_notify": "1", "net.ipv6.conf.net1.accept_ra": " 0 ",
                         "net.ipv4.neigh.net1.gc_stale_time": "30",
                         "net.ipv6.neigh.IFNAME.retrans_time_ms": "9"})
    assert conf.sysctl == (("ipv4/conf/net1/arp_notify", "1"), ("ipv6/conf/net1/accept_ra", "0"),
                           ("ipv4/neigh/net1/gc_stale_time", "30"), ("ipv6/neigh/net1/retrans_time_ms", "9"))
    assert conf.active and not conf.rail
    # an interface name with a dot is still one name
    assert parse("net1.5", sysctl={"net.ipv4.conf.net1.5.rp_filter": "1"}).sysctl == (
        ("ipv4/conf/net1.5/rp_filter", "1"),)


def test_a_sysctl_entry_wins_over_rail() -> None:
    conf = parse(rail=True, sysctl={"net.ipv4.conf.net1.rp_filter": "1"})
    assert dict(wanted_sysctls(conf, "net1")) == {
        "ipv4/conf/net1/arp_ignore": "1", "ipv4/conf/net1/arp_announce": "2", "ipv4/conf/net1/rp_filter": "1"}


def test_without_ifname_only_the_shape_is_checked() -> None:
    """STATUS and GC carry no CNI_IFNAME."""
    assert parse("", sysctl={"net.ipv4.conf.net7.arp_notify": "1"}).active
    with pytest.raises(ConfigError, match=r"sysctl\.net\.core\.somaxconn"):
        parse("", sysctl={"net.core.somaxconn": "1"})


@pytest.mark.parametrize(("conf", "message"), [
    ({"rail": "yes"}, "rail: \"yes\" must be true, false or an object"),
    ({"rail": 1}, "rail: 1 must be"),
    ({"rail": {"tabel": 5}}, "rail.tabel: unknown field"),
    ({"rail": {"table": "5"}}, "rail.table"),
    ({"rail": {"table": 0}}, "rail.table: 0 out of range"),
    ({"rail": {"table": 255}}, "rail.table: 255 is a reserved table"),
    ({"rail": {"table": 2**32}}, "rail.table"),
    ({"sysctl": ["net.ipv4.conf.net1.arp_ignore=1"]}, "sysctl"),
    ({"sysctl": {"net.ipv4.conf.net1.arp_ignore": 1}},
     "sysctl.net.ipv4.conf.net1.arp_ignore: 1 must be a string"),
    ({"sysctl": {"net.ipv4.conf.all.rp_filter": "0"}}, "sysctl.net.ipv4.conf.all.rp_filter: only settings"),
    ({"sysctl": {"net.ipv4.conf.net2.rp_filter": "0"}}, "sysctl.net.ipv4.conf.net2.rp_filter"),
    ({"sysctl": {"net.ipv4.conf.net1.../x": "0"}}, "sysctl.net.ipv4.conf.net1.../x"),
    ({"sysctl": {"net/ipv4/conf/net1/rp_filter": "0"}}, "sysctl.net/ipv4/conf/net1/rp_filter"),
])
def test_errors_name_the_field(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        RailConf.from_conf(conf, "net1")
    assert e.value.code == 7
    assert message in e.value.msg


def ip(address: str, gateway: str | None = None) -> IPConfig:
    return IPConfig(ipaddress.ip_interface(address), ipaddress.ip_address(gateway) if gateway else None,
                    interface=0)


def net(text: str) -> Any:
    return ipaddress.ip_network(text)


def test_table_routes() -> None:
    result = Result(ips=(ip("198.51.100.5/24", "198.51.100.1"), ip("198.51.100.6/24"),
                         ip("2001:db8:1::5/64")),
                    routes=(Route(net("198.18.0.0/15")),
                            Route(net("2001:db8:ff::/48"), ipaddress.ip_address("2001:db8:1::fe")),
                            Route(net("198.18.8.0/24"), table=7)))
    assert table_routes(result, 102) == [
        Route(net("198.51.100.0/24"), None, table=102, scope=253),
        Route(net("2001:db8:1::/64"), None, table=102, scope=253),
        Route(net("198.18.0.0/15"), ipaddress.ip_address("198.51.100.1"), table=102),
        Route(net("2001:db8:ff::/48"), ipaddress.ip_address("2001:db8:1::fe"), table=102),
        Route(net("0.0.0.0/0"), ipaddress.ip_address("198.51.100.1"), table=102),
    ]
    assert sources(result) == [net("198.51.100.5/32"), net("198.51.100.6/32"), net("2001:db8:1::5/128")]
    with_default = Result(ips=(ip("198.51.100.5/24", "198.51.100.1"),), routes=(Route(net("0.0.0.0/0")),))
    assert table_routes(with_default, 9)[1:] == [Route(net("0.0.0.0/0"), ipaddress.ip_address("198.51.100.1"),
                                                       table=9)]
