"""Apply the fence, Ray's token and the secrets over SSH (what guard/fence.py and guard/secretstore.py
plan).

`up` runs the preflight's fence and secrets checks first (bootstrap.cluster.preflight, nothing
changed yet), `plan_token` before the plan (it reads only: up asks before its first change), then
`put_fences`, `write_token` and `put_secrets` before the containers start (`serve` and `rollout` of a
fleet: `check_secret_store`, then `put_secrets`); `down`
calls `take_down` after the containers are gone. Each remote step is one command per host; the
token and the secrets travel on stdin only.
"""
from __future__ import annotations

import ipaddress
import re
import secrets as _secrets
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.errors import PreflightFailed
from bootstrap.model import Host, Inventory
from bootstrap.remote.session import Session


def check_secret_store(sess: Session, hosts: Sequence[Host]) -> None:
    """Before a fleet's `serve` or `rollout` changes anything: every host can keep the secrets in
    memory (PreflightFailed naming the hosts that cannot). Nothing is read without secrets."""
    if not SS.values(sess.inv):
        return
    got = sess.stage("secrets-check", hosts, lambda h: read_guard(sess.ssh[h.name], sess.inv.cluster.name))
    for h in hosts:
        g = got[h.name]
        why = SS.refusal(g.root, g.sudo, g.run_fs, g.become_refused)
        if why is not None:
            raise PreflightFailed(h.name, *why)


def read_guard(ssh, cluster_name: str) -> FN.GuardFacts:
    """The host's guard facts (fence.guard_facts_cmd), root's way checked: become_checked."""
    return become_checked(ssh, FN.parse_guard(ssh.run(FN.guard_facts_cmd(cluster_name), timeout=30, query=True).stdout))


def become_checked(ssh, g: FN.GuardFacts) -> FN.GuardFacts:
    """Where the SSH user is not root and `sudo -n true` fails but a become password was given: sudo asked
    once with it (`true`, one attempt: the SSH layer's askpass answers once). Taken: `sudo` True; refused:
    sudo's last line in `become_refused`. Otherwise as they were."""
    if g.root or g.sudo or ssh.become_password is None:
        return g
    r = ssh.run_as_root(("true",), timeout=30, check=False, query=True)
    if r.ok:
        return replace(g, sudo=True)
    lines = [x.strip() for x in (r.stderr or r.stdout).splitlines() if x.strip()]
    return replace(g, become_refused=lines[-1][:200] if lines else f"exit {r.exit_code}")


def put_secrets(sess: Session, hosts: Sequence[Host], *, prune: bool) -> None:
    """The cluster's secrets on every host's /run (secretstore.write_argv: each value a 0400 file).
    With `prune` (`up`): those no longer listed removed, and without secrets the ones an earlier run
    put there; without (a fleet's `serve`, `rollout`): added or replaced only."""
    inv = sess.inv
    per_host = {h.name: SS.files(inv, h) for h in hosts}  # a pool's serve sets hold their model's key
    name = inv.cluster.name
    if not any(per_host.values()) and not prune:
        return
    if not any(per_host.values()):
        sess.stage("secrets", hosts, lambda h: sess.ssh[h.name].run_as_root(SS.remove_argv(name), timeout=30,
                                                                            display=f"rm -r {SS.host_dir(name)}"))
        return
    argv = SS.write_argv(name, prune=prune)
    sess.stage("secrets", hosts, lambda h: sess.ssh[h.name].run_as_root(
        argv, [SS.write_body(per_host[h.name])], timeout=30,
        display=f"write {', '.join(per_host[h.name])} to {SS.host_dir(name)}"))


def put_fences(sess: Session, facts: Mapping[str, F.HostFacts], full: Inventory | None = None, *,
               hosts: Sequence[Host] | None = None, only_fenced: bool = False) -> None:
    """The fence on every host of the session (replaced whole where it is already), or, with
    cluster.fence off, a fence of ours left by an earlier `up` removed. `full`: the whole inventory
    when the session's leaves hosts out (--allow-partial): they stay members, so that they can
    join later. `hosts`: only these; `only_fenced`: only where a fence of ours is already (its
    members brought in line with the inventory's), nothing where there is none."""
    inv = sess.inv
    guards = {h.name: (facts[h.name].guard if h.name in facts else None) or FN.GuardFacts()
              for h in (full or inv).hosts}
    members_inv = full or inv

    def put(h: Host) -> None:
        g = guards[h.name]
        s = sess.ssh[h.name]
        if only_fenced and not _fenced(s, inv, g):
            return
        if not inv.cluster.fence:
            _remove(s, inv, g)
            return
        if FN.backend(g) == "nft":
            s.run_as_root(FN.install_argv(), [FN.ruleset(members_inv, h, guards).encode()], timeout=30)
            if g.iptables:  # a chain of ours from an `up` when the host had no nft
                s.run_as_root(FN.iptables_remove_argv(inv), timeout=30)
        else:  # iptables: our chain filled in one commit per family, then INPUT's jump to it (once)
            for family in (4, 6):
                s.run_as_root(FN.iptables_restore_argv(family),
                              [FN.iptables_restore(members_inv, h, guards, family).encode()], timeout=30)
            s.run_as_root(FN.iptables_jump_argv(inv), timeout=30)

    sess.stage("fence-members" if only_fenced else "fence", list(hosts if hosts is not None else inv.hosts), put)


def _fenced(s, inv: Inventory, g: FN.GuardFacts) -> bool:
    """Whether a fence of ours (our nftables table, or our iptables chain) is on the host now."""
    if g.nft and s.run_as_root(FN.list_argv(inv), timeout=30, check=False).exit_code == 0:
        return True
    return bool(g.iptables) and s.run_as_root(FN.iptables_list_argv(inv), timeout=30, check=False).exit_code == 0


_ELEMENTS_RX = re.compile(r"set members[46] \{[^}]*?elements = \{([^}]*)\}", re.S)


def fence_members(listing: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The addresses our nftables table admits (`nft list table`: its members4/members6 sets, whose
    elements nft prints as addresses, prefixes and ranges A-B)."""
    out: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    for body in _ELEMENTS_RX.findall(listing):
        for word in (w.strip() for w in body.replace("\n", " ").split(",")):
            if not word:
                continue
            try:
                if "-" in word:
                    lo, hi = (ipaddress.ip_address(x.strip()) for x in word.split("-", 1))
                    out.extend(ipaddress.summarize_address_range(lo, hi))  # type: ignore[arg-type]
                else:
                    out.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                continue
    return out


def _admitted(ip: str, nets: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return False
    return any(address in n for n in nets)


def fence_admits(sess: Session, host: Host, facts: Mapping[str, F.HostFacts], ips: Sequence[str]) -> bool:
    """Whether `host` needs no change for `ips` to reach it: no fence of ours is there, or our nftables
    fence's members already admit every one of them. Reads only (up asks before its first change); an
    iptables fence is not read: False."""
    g = (facts[host.name].guard if host.name in facts else None) or FN.GuardFacts()
    s = sess.ssh[host.name]
    if not (g.root or g.sudo):
        return True
    if g.nft:
        r = s.run_as_root(FN.list_argv(sess.inv), timeout=30, check=False)
        if r.exit_code != 0:
            return not (g.iptables and _fenced(s, sess.inv, replace(g, nft=False)))
        nets = fence_members(r.stdout)
        return all(_admitted(ip, nets) for ip in ips)
    return not _fenced(s, sess.inv, g)


@dataclass(frozen=True)
class TokenPlan:
    """Ray's token as `up` shares it (plan_token): its value and the hosts whose file differs."""
    token: str
    hosts: tuple[str, ...]


def plan_token(sess: Session, facts: dict[str, F.HostFacts]) -> tuple[TokenPlan | None, dict[str, F.HostFacts]]:
    """Ray's token for every host, read and decided without writing anything (up asks before it changes a
    host): the head's when it has one, else a new one. Returns what write_token writes (None: token
    authentication is off) and the facts with each host's token digest as it will be."""
    inv = sess.inv
    if not FN.ray_auth_on(inv):
        return None, facts
    name = inv.cluster.name
    no_home = ("its home directory is unknown: Ray's token file cannot be placed",
               "set HOME for the SSH user, or set cluster.ray_auth: off")
    head_g = facts[inv.head.name].guard
    if head_g is None or not head_g.home:
        raise PreflightFailed(inv.head.name, *no_home)
    missing = next((h.name for h in inv.hosts if not (facts[h.name].guard and facts[h.name].guard.home)), None)
    if missing is not None:
        raise PreflightFailed(missing, *no_home)
    token = ""
    if head_g.token:
        token = sess.ssh[inv.head.name].run(FN.read_token_cmd(head_g.home, name), timeout=30).stdout.strip()
    if not token:
        token = _secrets.token_hex(32)
    digest = FN.token_digest(token)
    todo = tuple(h.name for h in inv.hosts if (facts[h.name].guard or FN.GuardFacts()).token != digest)
    return TokenPlan(token, todo), {n: replace(f, guard=replace(f.guard, token=digest)) if f.guard is not None
                                    else f for n, f in facts.items()}


def write_token(sess: Session, facts: Mapping[str, F.HostFacts], planned: TokenPlan | None) -> None:
    """plan_token's token written on the hosts whose file differs (on stdin: never on a command line)."""
    if planned is None or not planned.hosts:
        return
    name = sess.inv.cluster.name

    def write(h: Host) -> None:
        sess.ssh[h.name].run_with_input(FN.write_token_cmd(facts[h.name].guard.home, name),
                                        [planned.token.encode()], timeout=30)
    sess.stage("ray-token", [sess.inv.host(n) for n in planned.hosts], write)


def _remove(s, inv: Inventory, g: FN.GuardFacts) -> None:
    """Our nftables table and our iptables chain off a host, where the tools are and we may."""
    if not (g.root or g.sudo):
        return
    if g.nft:
        s.run_as_root(FN.install_argv(), [FN.remove_script(inv).encode()], timeout=30)
    if g.iptables:
        s.run_as_root(FN.iptables_remove_argv(inv), timeout=30)


def take_down(sess: Session, h: Host) -> None:
    """Our fence, Ray's token file and the secrets off one host (each a no-op where it is not there)."""
    inv = sess.inv
    s = sess.ssh[h.name]
    g = read_guard(s, inv.cluster.name)
    _remove(s, inv, g)
    if g.home:
        s.run(FN.remove_token_cmd(g.home, inv.cluster.name), timeout=30)
    if g.root or g.sudo:  # a user who may not be root never put any there
        s.run_as_root(SS.remove_argv(inv.cluster.name), timeout=30, display=f"rm -r {SS.host_dir(inv.cluster.name)}")


def exposure_report(inv: Inventory, *, parallel: int, reporter=None) -> list[FN.Exposure]:
    """`status --exposure`: every listening socket of the cluster's on every host, how it is bound,
    whether it asks for credentials and who can reach it (fence.exposure). Reads only."""
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()

        def one(h: Host) -> list[FN.Exposure]:
            s = sess.ssh[h.name]
            g = read_guard(s, inv.cluster.name)
            run = s.run_as_root if g.root or g.sudo else s.run  # as root: every socket's process
            listeners = FN.parse_listeners(run(FN.LISTENERS, timeout=30, query=True).stdout)
            fenced, readable = None, True
            if FN.backend(g) is not None and not (g.root or g.sudo):
                readable = False  # a firewall tool is there, but we may not read its rules
            elif FN.backend(g) == "nft":
                r = s.run_as_root(FN.list_argv(inv), timeout=30, check=False, query=True)
                fenced = FN.parse_fenced(r.stdout) if r.ok else None
            if readable and fenced is None and g.iptables and (g.root or g.sudo):
                r = s.run_as_root(FN.iptables_list_argv(inv), timeout=30, check=False, query=True)
                fenced = FN.parse_iptables_fenced(r.stdout) if r.ok else None
            return FN.exposure(inv, h, listeners, fenced, g, fence_read=readable)

        found = sess.stage("exposure", inv.hosts, one)
        return [e for h in inv.hosts for e in found[h.name]]
