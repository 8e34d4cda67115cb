"""cluster.fence_allow and the SSH ports, as the inventory takes them: an entry admits what it says,
the entries together stay within the fence's bound, and no SSH port is one the cluster uses."""
from __future__ import annotations

import pytest

from bootstrap.cluster.guard import allow as AL
from tests.inventory.test_inventory import error, load, one_cpu_host


def allow(*entries: str) -> str:
    return one_cpu_host("fence_allow: [" + ", ".join(f"'{e}'" for e in entries) + "]")


@pytest.mark.parametrize("entry, says", [
    ("10.0.0.1/8", "10.0.0.1/8 has host bits set: did you mean 10.0.0.0/8 or 10.0.0.1/32?"),
    ("2001:db8::1/32", "has host bits set: did you mean 2001:db8::/32 or 2001:db8::1/128?"),
    ("::ffff:10.0.0.1", "is an IPv4-mapped IPv6 address: IPv4 packets never match the fence's IPv6 set, so it "
                        "admits nobody; give 10.0.0.1"),
    ("::ffff:10.0.0.0/120", "admits nobody; give 10.0.0.0/24"),
    ("fe80::1%eth0", "has a zone id (%eth0): the fence matches addresses, not interfaces"),
    ("fe80::%eth0/64", "give fe80::/64"),
    ("224.0.0.0/4", "is multicast"),
    ("ff02::1", "is multicast"),
    ("0.0.0.0", "is the unspecified address"),
    ("::", "is the unspecified address"),
    ("255.255.255.255", "is reserved (240.0.0.0/4"),
    ("127.0.0.0/8", "is loopback: the fence admits loopback already"),
    ("::1", "is loopback"),
    ("0.0.0.0/0", "admits every address: that is no fence"),
    ("0.0.0.0/8", "is \"this network\" (0.0.0.0/8): no connection comes from it"),
    ("::10.0.0.1", "::a00:1 is IPv4-compatible IPv6 (::/96, deprecated)"),
    ("::ffff:0.0.0.0/96", "its IPv4 form, 0.0.0.0/0, would not do either"),  # not "give 0.0.0.0/0"
])
def test_an_entry_that_does_not_admit_what_it_says_is_refused(tmp_path, entry, says):
    err = error(tmp_path, allow(entry))
    assert err.field == "cluster.fence_allow[0]" and err.line == 1 and says in str(err), str(err)
    assert "\n" not in str(err)


@pytest.mark.parametrize("entries, index, says", [
    (("0.0.0.0/1", "128.0.0.0/1"), 0, "0.0.0.0/1 admits 2^31 IPv4 addresses, more than the fence's bound of 2^24 "
                                      "IPv4 addresses (a /8)"),
    (("10.0.0.0/8", "11.0.0.0/8"), 1, "with the entries before it, fence_allow admits 2^25 IPv4 addresses "
                                      "(10.0.0.0/7), more than the fence's bound of 2^24 IPv4 addresses (a /8)"),
    (("2000::/3",), 0, "2000::/3 admits 2^125 IPv6 addresses, more than the fence's bound of 2^96 IPv6 addresses "
                       "(a /32)"),
    (("fd00::/8",), 0, "more than the fence's bound of 2^96 IPv6 addresses"),
    (("10.0.0.0/9", "10.128.0.0/9", "192.168.0.0/16"), 2, "admits more than 2^24 IPv4 addresses"),
    # IPv6 spellings of IPv4 hosts (NAT64/SIIT, Teredo) count against IPv4's bound
    (("64:ff9b::/96",), 0, "64:ff9b::/96 (in NAT64's well-known prefix, where IPv4 hosts appear translated: it "
                           "stands for 0.0.0.0/0) admits 2^32 IPv4 addresses"),
    (("2001::/32",), 0, "(in Teredo's prefix, where IPv4 hosts appear tunnelled: it stands for 0.0.0.0/0)"),
    (("64:ff9b:1::/64",), 0, "NAT64's local-use prefix"),
    (("10.0.0.0/8", "64:ff9b::b00:0/104"), 1, "admits 2^25 IPv4 addresses (10.0.0.0/7; 64:ff9b::b00:0/104 stands "
                                             "for 11.0.0.0/8)"),
])
def test_entries_that_together_admit_more_than_the_bound_are_refused(tmp_path, entries, index, says):
    err = error(tmp_path, allow(*entries))
    assert err.field == f"cluster.fence_allow[{index}]" and says in str(err), str(err)


def test_entries_within_the_bound_are_taken_canonical(tmp_path):
    inv = load(tmp_path, allow("10.0.0.0/9", "10.128.0.0/9", "2001:DB8::/33", "fd12:3456::/48"))
    # the two /9 halves are 10.0.0.0/8, the bound itself
    assert inv.cluster.fence_allow == ("10.0.0.0/9", "10.128.0.0/9", "2001:db8::/33", "fd12:3456::/48")
    assert load(tmp_path, allow("10.0.0.0/255.0.0.0")).cluster.fence_allow == ("10.0.0.0/8",)
    assert load(tmp_path, allow("198.51.100.7")).cluster.fence_allow == ("198.51.100.7/32",)


def test_the_bound_is_a_slash_8_and_a_slash_32():
    assert AL.BOUND == {4: 2 ** 24, 6: 2 ** 96} and AL.bound_text(4) == "2^24 IPv4 addresses (a /8)"


def test_public_size_agrees_with_is_public():
    import ipaddress

    from bootstrap.exposure import is_public
    for a in ("34.90.17.5", "8.8.8.8", "2600:1900:4040:af2::5", "10.1.2.3", "100.64.0.1", "127.0.0.1", "::1",
              "169.254.1.1", "fe80::1", "fc00::1", "192.0.2.1", "198.51.100.7", "203.0.113.5", "2001:db8::1",
              "224.0.0.1", "ff02::1", "240.0.0.1", "172.31.255.255", "192.168.1.1"):
        assert (AL.public_size(ipaddress.ip_network(a)) > 0) == is_public(a), a
    assert AL.public_size(ipaddress.ip_network("10.0.0.0/8")) == 0
    assert AL.public_size(ipaddress.ip_network("8.0.0.0/7")) == 2 ** 25
    assert AL.public_size(ipaddress.ip_network("192.0.2.0/23")) == 256  # 192.0.3.0/24 is public
    # a translated or tunnelled IPv6 entry is as public as the IPv4 hosts it stands for
    assert AL.public_size(ipaddress.ip_network("64:ff9b::808:800/120")) == 256  # 8.8.8.0/24
    assert AL.public_size(ipaddress.ip_network("64:ff9b::a00:0/104")) == 0  # 10.0.0.0/8
    assert AL.public_size(ipaddress.ip_network("2001:0:c000:201::f7f7:f700/120")) == 256  # Teredo: 8.8.8.0/24
    assert AL.stands_for_v4(ipaddress.ip_network("2002:c633:6400::/40"))[0] == ipaddress.ip_network("198.51.100.0/24")


def test_a_translated_entry_within_the_bound_is_taken(tmp_path):
    inv = load(tmp_path, allow("64:ff9b::c633:6400/120", "10.0.0.0/9"))
    assert inv.cluster.fence_allow == ("64:ff9b::c633:6400/120", "10.0.0.0/9")


# -- SSH ports: never one the cluster uses ------------------------------------------------------

@pytest.mark.parametrize("setting, field, says", [
    ("ssh: {port: 10022}", "cluster.ssh.port", "10022 is in Ray's worker ports (10002-19999)"),
    ("ssh: {port: 6379}", "cluster.ssh.port", "6379 is cluster.ports.ray_gcs"),
    ("ssh: {port: 29650}", "cluster.ssh.port", "29650 is in the range `serve` picks torch's rendezvous port from"),
    ("ssh: {port: 30000}", "cluster.ssh.port", "30000 is cluster.router.port"),
    ("ports: {vllm: 2222}, ssh: {port: 2222}", "cluster.ssh.port", "2222 is cluster.ports.vllm"),
])
def test_an_ssh_port_the_cluster_uses_is_refused(tmp_path, setting, field, says):
    err = error(tmp_path, one_cpu_host(setting))
    assert err.field == field and says in str(err) and "the fence" in str(err), str(err)


def test_a_hosts_own_ssh_port_and_ansible_port_are_checked_too(tmp_path):
    err = error(tmp_path, "cluster: {accelerator: none}\nhosts:\n  - {name: a, address: 10.0.0.1, port: 8265}\n")
    assert err.field == "hosts[0].port" and err.line == 3 and "8265 is cluster.ports.dashboard" in str(err), str(err)
    text = ("all:\n  vars:\n    bootstrap: {accelerator: none}\n"
            "  hosts:\n    a: {ansible_host: 10.0.0.1, ansible_port: 10022}\n")
    err = error(tmp_path, text)
    assert "ansible_port" in (err.field or "") and "10022 is in Ray's worker ports" in str(err), str(err)
    ok = load(tmp_path, "cluster: {accelerator: none, ssh: {port: 10022}}\n"
                        "hosts:\n  - {name: a, address: 10.0.0.1, port: 2222}\n")
    assert ok.hosts[0].ssh.port == 2222  # the default is not used by any host: nothing to refuse
    assert load(tmp_path, one_cpu_host("ssh: {port: 40022}")).hosts[0].ssh.port == 40022
