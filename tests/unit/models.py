"""Result models the golden files are written for (by hand, from the Go result structs)."""

from __future__ import annotations

from ipaddress import ip_address, ip_interface, ip_network

from cni.types.result import DNS, Interface, IPConfig, Result, Route


def full() -> Result:
    """Every field of the 1.1.0 model; the first IPv6 address comes before the first IPv4 one,
    and each family has a second address, to pin down which ones 0.2.0 keeps."""
    return Result(
        interfaces=(
            Interface(
                name="eth1",
                mac="02:00:5e:00:53:01",
                sandbox="/var/run/netns/pod-a",
                mtu=9000,
                socket_path="/run/vhost-user/sock0",
                pci_id="0000:3b:00.2",
            ),
            Interface(name="mvhost0", mac="02:00:5e:00:53:02"),
        ),
        ips=(
            IPConfig(ip_interface("2001:db8::7/64"), ip_address("2001:db8::1"), 0),
            IPConfig(ip_interface("198.51.100.7/24"), ip_address("198.51.100.1"), 0),
            IPConfig(ip_interface("198.18.0.7/15"), None, 1),
            IPConfig(ip_interface("2001:db8:1::7/64")),
        ),
        routes=(
            Route(ip_network("0.0.0.0/0"), ip_address("198.51.100.1"), 9000, 8960, 100, 100, 0),
            Route(ip_network("2001:db8:ffff::/48"), scope=253),
            Route(ip_network("198.18.0.0/15"), priority=10),
            Route(ip_network("::/0"), ip_address("2001:db8::1"), table=100),
        ),
        dns=DNS(
            nameservers=("198.51.100.53", "2001:db8::53"),
            domain="cluster.example",
            search=("svc.cluster.example", "cluster.example"),
            options=("ndots:5",),
        ),
    )


def l2() -> Result:
    """An attachment without IPAM: one interface, nothing else."""
    return Result(interfaces=(Interface("eth1", "02:00:5e:00:53:01", "/var/run/netns/pod-a", mtu=1500),))


def ipam_only() -> Result:
    """What an IPAM returns: addresses and routes, no interfaces."""
    return Result(
        ips=(IPConfig(ip_interface("198.51.100.7/24"), ip_address("198.51.100.1")),),
        routes=(Route(ip_network("0.0.0.0/0")),),
    )
