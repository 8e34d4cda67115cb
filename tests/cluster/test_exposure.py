"""Exposure warnings (pure): the host's addresses, which are public, what would listen on them."""
from dataclasses import replace

import pytest

from bootstrap.cluster.facts import addresses_cmd, parse_addresses
from bootstrap.exposure import (
    dashboard_address,
    dashboard_bind,
    is_public,
    public_addresses,
    ray_args_dashboard_host,
    warnings,
)
from tests.support.plan_fixtures import cpu_inventory, gpu_inventory

# `ip -o addr show` on a cloud GPU box: loopback, a public NIC (v4 + v6 + link-local), a private
# data-plane NIC, docker0 and an IPoIB interface.
IP_O_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host noprefixroute \\       valid_lft forever preferred_lft forever
2: ens3    inet 34.90.17.5/32 metric 100 scope global dynamic ens3\\       valid_lft 3379sec preferred_lft 3379sec
2: ens3    inet6 2600:1900:4040:af2::5/128 scope global dynamic noprefixroute \\       valid_lft 3384sec preferred_lft 3384sec
2: ens3    inet6 fe80::4001:aff:fea4:5/64 scope link \\       valid_lft forever preferred_lft forever
3: ens5    inet 10.10.0.11/24 brd 10.10.0.255 scope global ens5\\       valid_lft forever preferred_lft forever
4: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
5: ib0    inet 100.64.3.7/10 brd 100.127.255.255 scope global ib0\\       valid_lft forever preferred_lft forever
"""
PRIVATE_ONLY = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
3: ens5    inet 10.10.0.11/24 brd 10.10.0.255 scope global ens5\\       valid_lft forever preferred_lft forever
3: ens5    inet6 fd00:10::11/64 scope global \\       valid_lft forever preferred_lft forever
"""
V6_PUBLIC_ONLY = """\
3: ens5    inet 10.10.0.11/24 brd 10.10.0.255 scope global ens5\\       valid_lft forever preferred_lft forever
3: ens5    inet6 2a01:4f8:c17:b8f::2/64 scope global \\       valid_lft forever preferred_lft forever
"""


# -- facts: the command and its parser -------------------------------------------------------

def test_addresses_cmd_falls_back_to_hostname_i():
    argv = addresses_cmd()
    assert argv[:2] == ("sh", "-c") and "ip -o addr show" in argv[2] and "|| hostname -I" in argv[2]


def test_parse_ip_o_addr_show():
    assert parse_addresses(IP_O_ADDR) == (
        "127.0.0.1", "::1", "34.90.17.5", "2600:1900:4040:af2::5", "fe80::4001:aff:fea4:5",
        "10.10.0.11", "172.17.0.1", "100.64.3.7")


def test_parse_hostname_i():
    assert parse_addresses("10.10.0.11 34.90.17.5 172.17.0.1 2600:1900:4040:AF2:0::5 \n") == (
        "10.10.0.11", "34.90.17.5", "172.17.0.1", "2600:1900:4040:af2::5")


def test_parse_addresses_zone_duplicates_and_junk():
    out = ("2: eth0    inet6 fe80::1%eth0/64 scope link\n"
           "2: eth0    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0\n"
           "10.0.0.5\n"
           "sh: 1: ip: not found\n"
           "link/ether 00:11:22:33:44:55 brd ff:ff:ff:ff:ff:ff\n")
    assert parse_addresses(out) == ("fe80::1", "10.0.0.5")
    assert parse_addresses("") == ()
    assert parse_addresses("hostname: invalid option -- 'I'\n") == ()


# -- which addresses are public --------------------------------------------------------------

@pytest.mark.parametrize("addr", [
    "34.90.17.5", "8.8.8.8", "1.1.1.1", "2600:1900:4040:af2::5", "2a01:4f8:c17:b8f::2",
    "::ffff:34.90.17.5",  # IPv4-mapped: judged as the IPv4 address
])
def test_public(addr):
    assert is_public(addr)


@pytest.mark.parametrize("addr", [
    "10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1",  # RFC 1918
    "100.64.0.1", "100.127.255.254",  # CGNAT 100.64/10
    "127.0.0.1", "::1",  # loopback
    "169.254.1.1", "fe80::1", "fe80::1%eth0",  # link-local
    "fc00::1", "fd12:3456::1",  # ULA fc00::/7
    "192.0.2.1", "198.51.100.7", "203.0.113.5", "2001:db8::1",  # documentation
    "0.0.0.0", "::",  # unspecified
    "224.0.0.1", "239.1.2.3", "ff02::1", "ff0e::1",  # multicast
    "240.0.0.1", "255.255.255.255",  # reserved / broadcast
    "::ffff:10.0.0.1",  # IPv4-mapped private
    "not-an-ip", "", "10.0.0.1/24",
])
def test_not_public(addr):
    assert not is_public(addr)


def test_public_addresses_keeps_order_normalises_and_dedupes():
    assert public_addresses(parse_addresses(IP_O_ADDR)) == ("34.90.17.5", "2600:1900:4040:af2::5")
    assert public_addresses(["2600:1900:4040:AF2:0::5", "2600:1900:4040:af2::5", "::ffff:8.8.8.8",
                             "8.8.8.8"]) == ("2600:1900:4040:af2::5", "8.8.8.8")
    assert public_addresses(parse_addresses(PRIVATE_ONLY)) == ()
    assert public_addresses([]) == ()


# -- where the dashboard listens -------------------------------------------------------------

@pytest.mark.parametrize("value, addr", [
    ("localhost", "127.0.0.1"), ("data-plane", "10.10.0.11"), ("all", "0.0.0.0"),
    ("::", "::"), ("10.10.0.99", "10.10.0.99"),
])
def test_dashboard_address(value, addr):
    inv = gpu_inventory(dashboard_host=value)
    assert dashboard_address(inv.cluster, inv.head) == addr
    assert dashboard_bind(inv) == addr


def test_dashboard_bind_from_ray_args_last_wins():
    assert ray_args_dashboard_host(("--num-cpus=2",)) is None
    assert ray_args_dashboard_host(("--dashboard-host=0.0.0.0",)) == "0.0.0.0"
    assert ray_args_dashboard_host(("--dashboard-host", "::", "--num-cpus=2")) == "::"
    assert ray_args_dashboard_host(("--dashboard-host=1.2.3.4", "--dashboard-host", "10.0.0.1")) == "10.0.0.1"
    assert ray_args_dashboard_host(("--dashboard-host",)) is None  # dangling: ray itself refuses it
    assert dashboard_bind(gpu_inventory(ray_args=("--dashboard-host=0.0.0.0",))) == "0.0.0.0"


def test_no_dashboard_without_ray():
    assert dashboard_bind(cpu_inventory(2, runtime="none", dashboard_host="all")) is None


# -- the warnings ----------------------------------------------------------------------------

def addrs(text=IP_O_ADDR, host="gpu-a"):
    return {host: parse_addresses(text)}


def test_default_binds_warn_about_nothing():
    inv = gpu_inventory()
    assert warnings(inv, addrs()) == []
    assert warnings(inv, addrs(), vllm_listen=inv.head.ip) == []
    assert warnings(gpu_inventory(dashboard_host="data-plane"), addrs()) == []


def test_dashboard_on_all_interfaces_of_a_public_host():
    inv = gpu_inventory(dashboard_host="all")
    assert warnings(inv, addrs()) == [
        "gpu-a: the Ray dashboard (port 8265) would listen on all interfaces and the host has public "
        "address 34.90.17.5 -- set cluster.dashboard_host: data-plane"]


def test_dashboard_on_all_interfaces_of_a_private_host():
    assert warnings(gpu_inventory(dashboard_host="all"), addrs(PRIVATE_ONLY)) == []


def test_dashboard_port_is_the_inventorys():
    from bootstrap.model import Ports
    inv = gpu_inventory(dashboard_host="all", ports=Ports(7000, 9265, 8001))
    [w] = warnings(inv, addrs())
    assert "(port 9265)" in w


def test_ipv4_wildcard_does_not_reach_an_ipv6_only_public_address():
    assert warnings(gpu_inventory(dashboard_host="all"), addrs(V6_PUBLIC_ONLY)) == []
    [w] = warnings(gpu_inventory(dashboard_host="::"), addrs(V6_PUBLIC_ONLY))
    assert w == ("gpu-a: the Ray dashboard (port 8265) would listen on all interfaces and the host has "
                 "public address 2a01:4f8:c17:b8f::2 -- set cluster.dashboard_host: data-plane")


def test_ipv6_wildcard_reaches_every_public_address():
    [w] = warnings(gpu_inventory(dashboard_host="::"), addrs())
    assert "public addresses 34.90.17.5, 2600:1900:4040:af2::5 --" in w


def test_dashboard_host_from_ray_args_says_where_to_change_it():
    [w] = warnings(gpu_inventory(ray_args=("--dashboard-host", "0.0.0.0")), addrs())
    assert w.endswith("-- replace --dashboard-host in cluster.ray_args with cluster.dashboard_host: data-plane")


def test_dashboard_on_a_public_data_plane_ip():
    inv = gpu_inventory(dashboard_host="data-plane")
    inv = replace(inv, hosts=(replace(inv.hosts[0], ip="34.90.17.5"), inv.hosts[1]))
    [w] = warnings(inv, {})  # no facts needed: the address itself is public
    assert w.startswith("gpu-a: the Ray dashboard (port 8265) would listen on public address 34.90.17.5 -- "
                        "set cluster.dashboard_host: localhost")


def test_dashboard_literal_public_ipv6():
    [w] = warnings(gpu_inventory(dashboard_host="2600:1900:4040:af2::5"), {})
    assert "would listen on public address 2600:1900:4040:af2::5 --" in w


def test_only_the_heads_addresses_count():
    inv = gpu_inventory(dashboard_host="all")
    assert warnings(inv, addrs(host="gpu-b")) == []  # gpu-b is a worker: no dashboard there
    assert warnings(inv, {}) == []  # no facts: wildcard binds cannot be judged


def test_no_dashboard_warning_without_ray():
    inv = cpu_inventory(2, runtime="none", dashboard_host="all")
    assert warnings(inv, addrs(host="node1")) == []


def test_vllm_not_checked_unless_asked():
    inv = gpu_inventory()
    assert warnings(inv, addrs()) == []


@pytest.mark.parametrize("listen, public", [
    ("0.0.0.0", "public address 34.90.17.5"),
    ("::", "public addresses 34.90.17.5, 2600:1900:4040:af2::5"),
])
def test_vllm_listen_on_all_interfaces(listen, public):
    inv = gpu_inventory()
    assert warnings(inv, addrs(), vllm_listen=listen) == [
        f"gpu-a: the vLLM API (port 8000) would listen on all interfaces and the host has {public} "
        "-- pass --listen 10.10.0.11 (the head's data-plane IP, the default)"]


def test_vllm_listen_on_all_interfaces_of_a_private_host():
    assert warnings(gpu_inventory(), addrs(PRIVATE_ONLY), vllm_listen="0.0.0.0") == []
    assert warnings(gpu_inventory(), addrs(PRIVATE_ONLY), vllm_listen="::") == []


def test_vllm_on_a_public_address():
    [w] = warnings(gpu_inventory(), addrs(), vllm_listen="34.90.17.5")
    assert w.startswith("gpu-a: the vLLM API (port 8000) would listen on public address 34.90.17.5 -- ")
    assert warnings(gpu_inventory(), addrs(), vllm_listen="localhost") == []  # a name: not judged
    assert warnings(gpu_inventory(), addrs(), vllm_listen="127.0.0.1") == []


def test_both_warnings_dashboard_first():
    out = warnings(gpu_inventory(dashboard_host="all"), addrs(), vllm_listen="0.0.0.0")
    assert [w.split(" (")[0] for w in out] == ["gpu-a: the Ray dashboard", "gpu-a: the vLLM API"]
    assert all("\n" not in w for w in out)


def test_the_ssh_tunnel_in_a_dashboard_warning_carries_the_heads_ssh_port_user_and_address():
    inv = gpu_inventory(dashboard_host="data-plane")
    head = inv.hosts[0]
    head = replace(head, ip="34.90.17.5", ssh=replace(head.ssh, address="198.51.100.7", port=2222, user="ops"))
    [w] = warnings(replace(inv, hosts=(head, inv.hosts[1])), {})
    assert "(reach it with ssh -L 8265:127.0.0.1:8265 -p 2222 ops@198.51.100.7)" in w, w
