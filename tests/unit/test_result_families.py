"""Result parsing refuses a gateway (or a 0.2.0 ip4/ip6 address) of the other IP family, naming the
field: such a result from an IPAM would otherwise reach the kernel or be printed as is."""

from __future__ import annotations

import pytest

from cni.errors import ConfigError
from cni.types.result import parse

V6_GW_ROUTE = {"dst": "198.18.0.0/15", "gw": "2001:db8::1"}
CASES = {
    "ip gateway": ({"cniVersion": "1.0.0", "ips": [{"address": "198.51.100.5/24", "gateway": "2001:db8::1"}]},
                   "result.ips[0].gateway"),
    "route gw": ({"cniVersion": "1.0.0", "ips": [{"address": "2001:db8::5/64"}],
                  "routes": [{"dst": "2001:db8:ff::/48", "gw": "198.51.100.1"}]}, "result.routes[0].gw"),
    "0.2.0 ip4 address": ({"cniVersion": "0.2.0", "ip4": {"ip": "2001:db8::5/64"}}, "result.ip4.ip"),
    "0.2.0 ip6 gateway": ({"cniVersion": "0.2.0", "ip6": {"ip": "2001:db8::5/64", "gateway": "198.51.100.1"}},
                          "result.ip6.gateway"),
    "0.2.0 route gw": ({"cniVersion": "0.2.0", "ip4": {"ip": "198.51.100.5/24", "routes": [V6_GW_ROUTE]}},
                       "result.ip4.routes[0].gw"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_other_family_refused(case: str) -> None:
    raw, field = CASES[case]
    with pytest.raises(ConfigError) as e:
        parse(raw, str(raw["cniVersion"]))
    assert e.value.msg.startswith(f"{field}: "), e.value.msg


def test_same_family_accepted() -> None:
    r = parse({"cniVersion": "1.0.0", "ips": [{"address": "2001:db8::5/64", "gateway": "2001:db8::1"}],
               "routes": [{"dst": "198.18.0.0/15", "gw": "198.51.100.1"}]}, "1.0.0")
    assert str(r.ips[0].gateway) == "2001:db8::1" and str(r.routes[0].gw) == "198.51.100.1"
