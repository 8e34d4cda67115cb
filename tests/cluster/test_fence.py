"""The fence and Ray's token as planned (bootstrap.cluster.fence, pure) and applied (cluster.guard, on fakes)."""
from dataclasses import replace

import pytest

from bootstrap.cluster import fence as FN
from bootstrap.cluster import guard as GD
from bootstrap.cluster.facts import HostFacts
from bootstrap.cluster.plan import container_spec, plan_up, ray_auth
from bootstrap.errors import PreflightFailed
from bootstrap.fleet.plan import replica_inventory
from bootstrap.model import Router
from tests.support.fake_hosts import GUARD_FACTS, FakeHost, fake_session
from tests.support.plan_fixtures import cpu_inventory

ROOT = FN.parse_guard(GUARD_FACTS)


def guards(inv, g=ROOT):
    return {h.name: g for h in inv.hosts}


def ports_in(ranges):
    return {p for lo, hi in ranges for p in range(lo, hi + 1)}


def test_guard_facts_parse_what_the_host_prints_and_survive_garbage():
    g = FN.parse_guard(GUARD_FACTS)
    assert (g.home, g.client, g.sshd_port, g.root, g.nft, g.ephemeral, g.token) == (
        "/root", "10.0.0.100", 22, True, True, (32768, 60999), "0123456789abcdef")
    odd = FN.parse_guard("home=\nclient=not-an-ip\nsshd_port=99999\nuid=1000\nsudo=yes\nephemeral=9 1\n")
    assert (odd.home, odd.client, odd.sshd_port, odd.root, odd.sudo, odd.nft, odd.ephemeral, odd.token) == (
        None, None, None, False, True, False, FN.DEFAULT_EPHEMERAL, "")
    assert FN.parse_guard("") == FN.GuardFacts()


def test_the_fence_closes_the_cluster_ports_but_never_ssh_or_the_endpoint():
    inv = cpu_inventory(3)
    head, worker = inv.hosts[0], inv.hosts[1]
    g = replace(ROOT, sshd_port=2222)
    on_head = ports_in(FN.fenced_ranges(inv, head, g))
    on_worker = ports_in(FN.fenced_ranges(inv, worker, g))
    # the served endpoint (the head's vLLM port) is open on the head only; SSH everywhere
    assert 8000 not in on_head and 8000 in on_worker
    assert not {22, 2222} & (on_head | on_worker)
    # Ray's fixed and ranged ports, the rendezvous range and the ephemeral range are closed
    assert {6379, 8265, 8080, 10001, 19999, 29500, 29899, 29599, 29600, 5600, 8476, 32768, 60999} <= on_head
    assert not {9999, 20000, 61000, 443} & on_head
    # a host whose ephemeral range is wider gets it whole
    wide = FN.fenced_ranges(inv, worker, replace(ROOT, ephemeral=(1024, 65535)))
    assert ports_in(wide) >= set(range(1024, 65536)) - {22, 2222, 8000} - {22}


def test_the_rules_admit_members_the_controller_and_allowed_networks_and_touch_only_our_table():
    inv = cpu_inventory(3, name="big-llama", fence_allow=("10.9.0.0/16",))
    script = FN.ruleset(inv, inv.hosts[1], guards(inv))
    lines = script.splitlines()
    # replaced whole, atomically: create-if-missing, delete, define (one `nft -f` transaction)
    assert lines[:3] == ["table inet bootstrap_big_llama", "delete table inet bootstrap_big_llama",
                         "table inet bootstrap_big_llama {"]
    assert "10.0.0.100" in script and "10.9.0.0/16" in script  # the controller, fence_allow
    assert "172.31.240.11" in script and "172.31.240.12/31" in script  # the members, collapsed
    assert "ct state new counter reject with tcp reset" in script
    assert "policy accept" in script and " drop" not in script  # it never drops what it does not fence
    assert FN.remove_script(inv) == "table inet bootstrap_big_llama\ndelete table inet bootstrap_big_llama\n"
    v4, v6 = FN.members(replace(inv, cluster=replace(inv.cluster, fence_allow=("fd00::/64",))), guards(inv))
    assert v6 == ["fd00::/64"] and "10.0.0.100/32" in v4


def test_a_fleet_replica_admits_the_other_replicas_and_opens_the_router_not_its_vllm_port():
    inv = cpu_inventory(4, replicas=2, router=Router(port=30000))
    inv = replace(inv, hosts=tuple(replace(h, replica=i // 2, role="head" if i % 2 == 0 else "worker")
                                   for i, h in enumerate(inv.hosts)))
    r1 = replica_inventory(inv, 1)
    v4, _ = FN.members(r1, guards(r1))
    # its own hosts (.13, .14), the other replica's (.11, .12) and the controller
    assert v4 == ["10.0.0.100/32", "172.31.240.11/32", "172.31.240.12/31", "172.31.240.14/32"]
    r1_head = r1.hosts[0]
    assert 8000 in ports_in(FN.fenced_ranges(r1, r1_head, ROOT))  # behind the router: members only
    r0 = replica_inventory(inv, 0)
    assert FN.endpoint_ports(r0, r0.hosts[0]) == (30000,) and FN.endpoint_ports(r0, r0.hosts[1]) == ()
    assert 30000 not in ports_in(FN.fenced_ranges(r0, r0.hosts[0], ROOT))


def test_where_the_fence_cannot_go_up_refuses_naming_the_fix():
    inv = cpu_inventory(2)
    facts = {inv.hosts[0].name: HostFacts("27", guard=ROOT),
             inv.hosts[1].name: HostFacts("27", guard=replace(ROOT, nft=False))}
    res = GD.fence_refusals(inv, facts, inv.hosts)
    assert res[inv.hosts[0].name] is True
    err = res[inv.hosts[1].name]
    assert isinstance(err, PreflightFailed) and "no `nft`" in str(err) and "cluster.fence: false" in str(err)
    user = replace(ROOT, root=False, sudo=False)
    assert "asks for a password" in FN.fence_refusal(user)[0]
    assert FN.install_argv(replace(ROOT, root=False, sudo=True)) == ("sudo", "-n", "nft", "-f", "-")
    off = replace(inv, cluster=replace(inv.cluster, fence=False))
    assert GD.fence_refusals(off, facts, inv.hosts)[inv.hosts[1].name] is True


def test_ray_runs_with_the_token_file_mounted_and_a_new_token_recreates_the_nodes():
    inv = cpu_inventory(2)
    f = HostFacts("27", nofile_hard=20000, guard=ROOT)
    auth = ray_auth(inv, f)
    assert auth == ("/root/.bootstrap/sandbox/ray-auth-token", "0123456789abcdef")
    spec = container_spec(inv, inv.hosts[1], 20000, auth=auth)
    argv = " ".join(spec.run_argv())
    assert "-v /root/.bootstrap/sandbox/ray-auth-token:/run/bootstrap/ray-auth-token:ro" in argv
    assert "RAY_AUTH_MODE=token" in argv and "RAY_AUTH_TOKEN_PATH=/run/bootstrap/ray-auth-token" in argv
    other = container_spec(inv, inv.hosts[1], 20000, auth=(auth[0], "fedcba9876543210"))
    assert other.spec_hash != spec.spec_hash  # a new token: the containers are recreated with it
    assert ray_auth(replace(inv, cluster=replace(inv.cluster, ray_auth="off")), f) is None
    assert ray_auth(replace(inv, cluster=replace(inv.cluster, runtime="none")), f) is None
    assert all(a.spec.auth == "0123456789abcdef" for a in plan_up(inv, {h.name: f for h in inv.hosts}))


def _token_hosts(inv, head_token: str | None):
    hosts = {}
    for h in inv.hosts:
        answers = [("ray-auth-token.new", (0, "", ""))]
        if h.is_head and head_token:
            answers.insert(0, ("cat /root/.bootstrap/sandbox/ray-auth-token", (0, head_token + "\n", "")))
        hosts[h.name] = FakeHost(h.name, answers)
    return hosts


@pytest.mark.parametrize("head_has_one", [True, False])
def test_the_token_is_the_heads_or_a_new_one_written_only_where_it_differs(head_has_one):
    inv = cpu_inventory(3)
    token = "t" * 64
    digest = FN.token_digest(token)
    g = {inv.hosts[0].name: replace(ROOT, token=digest if head_has_one else ""),
         inv.hosts[1].name: replace(ROOT, token=digest if head_has_one else ""),
         inv.hosts[2].name: replace(ROOT, token="")}
    facts = {n: HostFacts("27", guard=x) for n, x in g.items()}
    hosts = _token_hosts(inv, token if head_has_one else None)
    with fake_session(inv, hosts) as sess:
        out = GD.share_token(sess, facts)
    written = sorted(n for n, h in hosts.items() if any("ray-auth-token.new" in c for c in h.commands))
    if head_has_one:
        assert written == [inv.hosts[2].name]
        assert {f.guard.token for f in out.values()} == {digest}
    else:
        assert written == [h.name for h in inv.hosts]
        new = {f.guard.token for f in out.values()}
        assert len(new) == 1 and new != {digest} and new != {""}
    for h in hosts.values():  # the value never on a command line
        assert not any(token in c for c in h.commands)
