"""The fence and Ray's token as planned (cluster/guard/fence.py, pure) and applied (guard/run.py, on fakes)."""
from dataclasses import replace

import pytest

from bootstrap.cluster.facts import HostFacts
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import run as GD
from bootstrap.cluster.plan import container_spec, plan_up, ray_auth
from bootstrap.cluster.preflight import run as PR
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
    assert FN.parse_guard("uid=0\nfirewalld=yes\n").firewalld and not FN.parse_guard("firewalld=no\n").firewalld
    odd = FN.parse_guard("home=\nclient=not-an-ip\nsshd_port=99999\nuid=1000\nsudo=yes\nephemeral=9 1\n")
    assert (odd.home, odd.client, odd.sshd_port, odd.root, odd.sudo, odd.nft, odd.ephemeral, odd.token) == (
        None, None, None, False, True, False, FN.DEFAULT_EPHEMERAL, "")
    assert FN.parse_guard("") == FN.GuardFacts()
    assert FN.parse_guard("sshd_port=\u00b2\nephemeral=\u00b2 3\n").sshd_port is None  # '²' is a digit to isdigit()
    assert FN.parse_listeners("LISTEN 0 1 1.2.3.4:\u00b2 x\nLISTEN 0 1 [::1]:99 x\n") == [FN.Listener("::1", 99)]
    assert FN.parse_fenced("tcp dport { \u00b2, 5-9 } ct state new reject") == [(5, 9)]


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
    res = PR.fence_refusals(inv, facts, inv.hosts)
    assert res[inv.hosts[0].name] is True
    err = res[inv.hosts[1].name]
    assert isinstance(err, PreflightFailed) and "neither `nft` nor iptables-restore" in str(err)
    assert "cluster.fence: false" in str(err)
    with_iptables = {**facts, inv.hosts[1].name: HostFacts("27", guard=replace(ROOT, nft=False, iptables=True))}
    assert PR.fence_refusals(inv, with_iptables, inv.hosts)[inv.hosts[1].name] is True
    user = replace(ROOT, root=False, sudo=False)
    what, fix = FN.fence_refusal(user)
    assert "asks for a password" in what and "pass -K" in fix and "BOOTSTRAP_BECOME_PASSWORD" in fix
    # the password given, and refused: sudo's own line, and no word of "passwordless"
    what, fix = FN.fence_refusal(replace(user, become_refused="sudo: 1 incorrect password attempt"))
    assert "sudo refused the become password (sudo: 1 incorrect password attempt)" in what and "-K" in fix
    # root comes from the SSH layer (run_as_root): the argv is the tool's own
    assert FN.install_argv() == ("nft", "-f", "-")
    off = replace(inv, cluster=replace(inv.cluster, fence=False))
    assert PR.fence_refusals(off, facts, inv.hosts)[inv.hosts[1].name] is True


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
        planned, out = GD.plan_token(sess, facts)
        # deciding writes nothing (up asks before its first change: issue 68.2)
        assert not any("ray-auth-token.new" in c for h in hosts.values() for c in h.commands)
        GD.write_token(sess, facts, planned)
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


#: `ss -ltnpH` on the sandbox head after `up` and a 3-node `serve` (trimmed), and the fence's rule
SS_HEAD = """\
LISTEN 0      4096         0.0.0.0:6379       0.0.0.0:*    users:(("gcs_server",pid=467,fd=9))
LISTEN 0      4096         0.0.0.0:33025      0.0.0.0:*    users:(("raylet",pid=797,fd=40))
LISTEN 0      128          0.0.0.0:8080       0.0.0.0:*    users:(("ray::DashboardA",pid=838,fd=12))
LISTEN 0      128        127.0.0.1:8265       0.0.0.0:*    users:(("python3",pid=503,fd=59))
LISTEN 0      4096   172.31.240.11:10001      0.0.0.0:*    users:(("python3",pid=502,fd=16))
LISTEN 0      2048   172.31.240.11:8000       0.0.0.0:*    users:(("vllm",pid=1201,fd=20))
LISTEN 0      128                *:29866            *:*    users:(("VLLM::Worker_PP",pid=1300,fd=30))
LISTEN 0      128          0.0.0.0:22         0.0.0.0:*    users:(("sshd",pid=7,fd=3))
LISTEN 0      128             [::]:22            [::]:*    users:(("sshd",pid=7,fd=4))
LISTEN 0      4096      127.0.0.11:38927      0.0.0.0:*
LISTEN 0      128          0.0.0.0:631        0.0.0.0:*    users:(("cupsd",pid=9,fd=4))
"""
NFT_LISTING = """\
table inet bootstrap_sandbox {
\tchain input {
\t\ttype filter hook input priority filter; policy accept;
\t\ttcp dport { 5600, 6379, 8080, 8265, 8476, 9090, 9100, 9400, 10001-19999, 29000,
\t\t\t    29500-29899, 30000, 32768-60999 } ct state new counter packets 65 bytes 3900 reject with tcp reset
\t}
}
"""


def test_the_exposure_report_reads_ss_and_the_fence_and_says_who_reaches_what():
    inv = cpu_inventory(3)
    head = inv.hosts[0]
    fenced = FN.parse_fenced(NFT_LISTING)
    assert fenced[:2] == [(5600, 5600), (6379, 6379)] and (32768, 60999) in fenced and (10001, 19999) in fenced
    assert FN.parse_fenced("table inet x {}") is None
    rows = {(e.address, e.port): e for e in FN.exposure(inv, head, FN.parse_listeners(SS_HEAD), fenced, ROOT)}
    # not the cluster's: Docker's DNS on loopback outside the cluster's ports, the host's own cupsd
    assert ("127.0.0.11", 38927) in rows and ("0.0.0.0", 631) not in rows
    gcs = rows[("0.0.0.0", 6379)]
    assert (gcs.what, gcs.bind, gcs.auth, gcs.reach, gcs.open_beyond) == (
        "Ray GCS", "all interfaces", "Ray token", "members", False)
    assert rows[("0.0.0.0", 33025)].auth == "Ray token" and rows[("0.0.0.0", 8080)].auth == "none"
    assert rows[("127.0.0.1", 8265)].reach == "this host"
    rdv = rows[("*", 29866)]
    assert (rdv.what, rdv.bind, rdv.reach) == ("torch rendezvous", "all interfaces", "members")
    api = rows[("172.31.240.11", 8000)]
    assert (api.what, api.bind, api.reach, api.expected, api.open_beyond) == (
        "vLLM API", "data-plane", "anyone", True, False)
    assert rows[("::", 22)].expected and rows[("::", 22)].auth == "SSH key"
    assert not any(e.open_beyond for e in rows.values())
    # without the fence, everything not on loopback is open to anyone who routes to the host
    bare = FN.exposure(inv, head, FN.parse_listeners(SS_HEAD), None, ROOT)
    assert {e.port for e in bare if e.open_beyond} == {6379, 33025, 8080, 10001, 29866}
    # a fence that could not be read counts as open (fail closed)
    unread = FN.exposure(inv, head, FN.parse_listeners(SS_HEAD), None, ROOT, fence_read=False)
    assert {e.reach for e in unread if e.port == 6379} == {"unknown"} and any(e.open_beyond for e in unread)


def test_a_host_left_out_by_allow_partial_stays_a_member_of_the_others_fences():
    full = cpu_inventory(3)
    live = replace(full, hosts=full.hosts[:2])  # node3 unreachable, left out
    hosts = {h.name: FakeHost(h.name, [("nft -f -", (0, "", ""))]) for h in live.hosts}
    facts = {h.name: HostFacts("27", guard=ROOT) for h in live.hosts}
    with fake_session(live, hosts) as sess:
        GD.put_fences(sess, facts, full)
    for h in hosts.values():
        script = h.inputs[-1].decode()
        assert "172.31.240.11" in script and "172.31.240.12/31" in script, script  # .12 and .13 (node3)


IPT = replace(ROOT, nft=False, iptables=True)


def test_without_nft_the_fence_is_our_own_iptables_chain_in_both_families():
    inv = cpu_inventory(3, fence_allow=("fd00::/64",))
    assert FN.backend(IPT) == "iptables" and FN.backend(ROOT) == "nft" and FN.backend(FN.GuardFacts()) is None
    g = {h.name: IPT for h in inv.hosts}
    v4 = FN.iptables_restore(inv, inv.hosts[1], g, 4).splitlines()
    assert v4[:3] == ["*filter", ":bootstrap-sandbox - [0:0]", "-A bootstrap-sandbox -i lo -j RETURN"]
    assert "-A bootstrap-sandbox -s 172.31.240.12/31 -j RETURN" in v4 and v4[-1] == "COMMIT"
    rejects = [ln for ln in v4 if "REJECT --reject-with tcp-reset" in ln]
    # multiport takes 15 ports a rule (a range counts 2): every fenced port is in one of them
    costs = [sum(2 if ":" in x else 1 for x in ln.split("--dports ")[1].split()[0].split(",")) for ln in rejects]
    assert len(rejects) >= 2 and max(costs) <= 15, costs
    listing = "-N bootstrap-sandbox\n" + "\n".join(ln for ln in v4 if ln.startswith("-A"))
    assert FN.parse_iptables_fenced(listing) == FN.fenced_ranges(inv, inv.hosts[1], IPT)
    v6 = FN.iptables_restore(inv, inv.hosts[1], g, 6)
    assert "-s fd00::/64 -j RETURN" in v6 and "172.31.240" not in v6
    assert FN.iptables_restore_argv(6) == ("ip6tables-restore", "--noflush")
    long = cpu_inventory(1, name="a-very-long-cluster-name-for-iptables")
    assert len(FN.chain_name(long)) <= 28 and FN.chain_name(long) != FN.chain_name(cpu_inventory(1, name="a-very-long"))


def test_the_iptables_fence_is_filled_then_jumped_to_and_taken_off_whole():
    inv = cpu_inventory(2)
    hosts = {h.name: FakeHost(h.name, [("iptables-restore --noflush", (0, "", "")),
                                       ("ip6tables-restore --noflush", (0, "", "")),
                                       ("-C INPUT -j", (0, "", ""))]) for h in inv.hosts}
    facts = {h.name: HostFacts("27", guard=IPT) for h in inv.hosts}
    with fake_session(inv, hosts) as sess:
        GD.put_fences(sess, facts)
    for h in hosts.values():
        assert [c.split()[0] for c in h.commands] == ["iptables-restore", "ip6tables-restore", "sh"]
        assert h.roots == h.commands  # each one as root
        assert h.inputs[0].startswith(b"*filter\n:bootstrap-sandbox - [0:0]")
    argv = FN.iptables_remove_argv(inv)
    assert argv[-1] == "bootstrap-sandbox" and "-X" in argv[2] and "-D INPUT" in argv[2]


# -- the SSH port the fence leaves open: sshd's, as the host reports it ----------------------------

def test_the_fence_exempts_sshds_port_as_the_host_reports_it_not_the_inventorys():
    inv = cpu_inventory(2)
    # behind a NAT port forward: the inventory says 10022 (the NAT's), sshd took our session on 22
    nat = replace(inv, hosts=tuple(replace(h, ssh=replace(h.ssh, port=10022)) for h in inv.hosts))
    worker = nat.hosts[1]
    fenced = ports_in(FN.fenced_ranges(nat, worker, ROOT))
    assert 10022 in fenced and 22 not in fenced  # 10022 is a Ray worker port on the host: members only
    assert FN.ssh_ports(worker, ROOT) == {22}
    # sshd on 2222 (no NAT, the inventory says 2222 too): that port, and not 22
    g = replace(ROOT, sshd_port=2222)
    assert FN.ssh_ports(worker, g) == {2222} and 2222 not in ports_in(FN.fenced_ranges(nat, worker, g))
    # the host did not say (no SSH_CLIENT): the inventory's port, else 22
    assert FN.ssh_ports(worker, replace(ROOT, sshd_port=None)) == {10022}
    assert FN.ssh_ports(inv.hosts[1], replace(ROOT, sshd_port=None)) == {22}
    # the exposure report: a Ray worker on the host's 10022 is no SSH, and the fence covers it
    ss = ("LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:((\"sshd\",pid=7,fd=3))\n"
          "LISTEN 0 128 0.0.0.0:10022 0.0.0.0:* users:((\"raylet\",pid=9,fd=3))\n")
    rows = {e.port: e for e in FN.exposure(nat, worker, FN.parse_listeners(ss), FN.fenced_ranges(nat, worker, ROOT),
                                           ROOT)}
    assert rows[22].what == "SSH" and rows[22].expected
    assert (rows[10022].what, rows[10022].expected, rows[10022].reach) == ("raylet", False, "members")


def test_the_port_table_names_every_port_the_fence_closes_on_every_host():
    inv = cpu_inventory(2)
    table = FN.port_table(inv.cluster)
    covered = {p for lo, hi, _ in table for p in range(lo, hi + 1)}
    assert FN.cluster_ports(inv) <= covered
    assert set(range(*FN.RAY_PORT_RANGE)) | set(range(*FN.MASTER_PORT_RANGE)) <= covered
    assert (6379, 6379, "cluster.ports.ray_gcs") in table and (30000, 30000, "cluster.router.port") in table
    assert FN.port_clash(inv.cluster, 10022) == "in Ray's worker ports (10002-19999)"
    assert FN.port_clash(inv.cluster, 8000) == "cluster.ports.vllm" and FN.port_clash(inv.cluster, 2222) is None


# -- the exposure report and fence_allow; the endpoint's credentials --------------------------------

def test_the_exposure_report_says_who_fence_allow_admits_and_counts_public_space_as_open():
    ss = FN.parse_listeners(SS_HEAD)
    fenced = FN.parse_fenced(NFT_LISTING)
    private = cpu_inventory(3, fence_allow=("10.9.0.0/16",))
    rows = {(e.address, e.port): e for e in FN.exposure(private, private.hosts[0], ss, fenced, ROOT)}
    gcs = rows[("0.0.0.0", 6379)]
    assert (gcs.reach, gcs.allowed, gcs.public, gcs.open_beyond) == ("members", ("10.9.0.0/16",), (), False)
    assert rows[("127.0.0.1", 8265)].allowed == ()  # loopback: fence_allow does not reach it
    # a public network in fence_allow: every fenced port is open to it, and the report says so
    public = cpu_inventory(3, fence_allow=("10.9.0.0/16", "8.8.0.0/16", "2600:1900::/32"))
    found = FN.exposure(public, public.hosts[0], ss, fenced, ROOT)
    rows = {(e.address, e.port): e for e in found}
    gcs = rows[("0.0.0.0", 6379)]
    assert (gcs.reach, gcs.allowed, gcs.public, gcs.open_beyond) == (
        "members", ("10.9.0.0/16", "8.8.0.0/16"), ("8.8.0.0/16",), True)
    assert {e.port for e in found if e.open_beyond} == {6379, 33025, 8080, 10001, 29866}
    # an IPv4-only bind is not reached by an IPv6 network, and SSH and the endpoint stay by design
    assert rows[("0.0.0.0", 8080)].public == ("8.8.0.0/16",) and rows[("*", 29866)].public == (
        "8.8.0.0/16", "2600:1900::/32")
    assert not rows[("172.31.240.11", 8000)].open_beyond and not rows[("::", 22)].open_beyond
    assert not any(e.open_beyond for e in FN.exposure(public, public.hosts[0], ss, fenced, ROOT)
                   if e.reach == "this host")


def test_the_exposure_report_names_the_api_key_where_vllm_asks_for_it():
    from bootstrap.model import Secret
    key = (Secret("FLEET_KEY", "sk-x"),)
    ss = FN.parse_listeners("LISTEN 0 128 0.0.0.0:30000 0.0.0.0:* users:((\"vllm-router\",pid=5,fd=3))\n"
                            "LISTEN 0 128 172.31.240.11:8000 0.0.0.0:* users:((\"vllm\",pid=6,fd=3))\n")
    # the whole fleet's inventory, as `status --exposure` reads it: the router's endpoint and each
    # replica's vLLM ask for the key
    fleet = cpu_inventory(4, replicas=2, secrets=key, router=Router(port=30000, api_key="FLEET_KEY"))
    fleet = replace(fleet, hosts=tuple(replace(h, replica=i // 2, role="head" if i % 2 == 0 else "worker")
                                       for i, h in enumerate(fleet.hosts)))
    rows = {e.port: e for e in FN.exposure(fleet, fleet.hosts[0], ss, None, ROOT)}
    assert rows[30000].auth == "API key" and rows[30000].expected
    assert rows[8000].auth == "API key"
    # one replica with VLLM_API_KEY under cluster.secrets: vLLM asks for it
    one = cpu_inventory(2, secrets=(Secret("VLLM_API_KEY", "sk-y"),))
    rows = {e.port: e for e in FN.exposure(one, one.hosts[0], ss, None, ROOT)}
    assert rows[8000].auth == "API key" and rows[8000].expected
    # without a key: none, whatever the router's settings
    bare = cpu_inventory(2)
    assert {e.port: e.auth for e in FN.exposure(bare, bare.hosts[0], ss, None, ROOT)}[8000] == "none"


def test_status_exposure_says_fence_allow_admits_public_space_and_exits_1(monkeypatch):
    import io

    from click.testing import CliRunner
    from rich.console import Console

    from bootstrap.cli import main, render
    inv = cpu_inventory(3, fence_allow=("8.8.0.0/16",))
    found = FN.exposure(inv, inv.hosts[0], FN.parse_listeners(SS_HEAD), FN.parse_fenced(NFT_LISTING), ROOT)
    con = Console(file=io.StringIO(), width=400)
    monkeypatch.setattr(render, "out", con)
    render.exposure(inv, found, False)
    text = con.file.getvalue()
    assert "members and 8.8.0.0/16 (public)" in text and "nothing open" not in text
    assert "cluster.fence_allow admits public address space (8.8.0.0/16)" in text
    # the command: exit 1, as for a port open to anyone
    monkeypatch.setattr("bootstrap.cli.commands_cluster.read_inventory", lambda path: inv)
    monkeypatch.setattr(GD, "exposure_report", lambda inv, **kw: found)
    r = CliRunner().invoke(main, ["status", "--exposure", "-i", "x.yaml", "--json"])
    assert r.exit_code == 1, r.output
    import json
    doc = json.loads(con.file.getvalue()[len(text):])
    gcs = next(x for x in doc["listeners"] if x["port"] == 6379)
    assert gcs["public"] == ["8.8.0.0/16"] and gcs["open_beyond"] and doc["open_beyond"] == 5


def test_docs_security_shows_what_the_fence_admits_generated_with_the_bound_in_the_code():
    import re

    from bootstrap.cluster.guard import allow as AL
    from tests.support.checks import docs_page
    hooks, page, shown = docs_page("security.md")
    assert hooks.MARK_FENCE in page
    assert hooks.MARK_FENCE not in shown
    assert f"at most {AL.bound_text(4)} and {AL.bound_text(6)}" in shown
    assert "2^24 IPv4 addresses (a /8)" in shown  # the bound the inventory enforces, as the error names it
    # the page's own words name the same prefixes
    said = re.search(r"a /(\d+) of\s+IPv4 and a /(\d+) of IPv6", page)
    assert said and (int(said[1]), int(said[2])) == (AL.BOUND_PREFIX[4], AL.BOUND_PREFIX[6])
    for lo, hi, _ in FN.port_table(cpu_inventory(1).cluster):
        assert (f"| {lo} |" if lo == hi else f"| {lo}-{hi} |") in shown


#: `nft list table inet bootstrap_sandbox` on a sandbox node after `up` (nft merges adjacent members into
#: prefixes; an IPv6 range as nft prints one)
LISTED = """table inet bootstrap_sandbox {
\tset members4 {
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = { 172.31.240.1, 172.31.240.11,
\t\t\t     172.31.240.12/31 }
\t}

\tset members6 {
\t\ttype ipv6_addr
\t\tflags interval
\t\telements = { 2001:db8::1-2001:db8::3 }
\t}
}"""


def test_the_fences_members_are_read_as_nft_prints_them():
    """Issue 68.2: preflight reads whether an earlier fence admits every node (no change) before it would
    bring its members in line: prefixes and ranges as nft merges them."""
    import ipaddress

    nets = GD.fence_members(LISTED)
    def admitted(ip):
        return any(ipaddress.ip_address(ip) in n for n in nets)
    assert [admitted(ip) for ip in ("172.31.240.11", "172.31.240.13", "172.31.240.14", "2001:db8::2",
                                    "2001:db8::4")] == [True, True, False, True, False]
    assert GD.fence_members("table inet bootstrap_sandbox {\n}") == []
