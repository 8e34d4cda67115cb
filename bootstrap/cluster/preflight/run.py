"""Run the preflight registry over SSH for `up`: gather what the checks read, judge, refuse hosts.

`preflight` runs the checks in the order of what they read (registry.READS): each host's own facts
(a stage per host), the nodes side by side, the port probe between the nodes (checks/port_probe.py,
`port_probe`) and the fence's facts. A host with findings is refused (PreflightFailed); with
--allow-partial a refused worker is set aside (`usable`) and the next checks run without it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from bootstrap.cluster import facts as F
from bootstrap.cluster.guard import run as GD
from bootstrap.cluster.preflight import checks as CK
from bootstrap.cluster.preflight import ports as PT
from bootstrap.cluster.preflight.registry import Check, Finding, Seen, judge
from bootstrap.errors import GroupError, PreflightFailed
from bootstrap.model import Host, Inventory
from bootstrap.remote import node as N
from bootstrap.remote.fanout import GroupResult
from bootstrap.remote.session import Session


def usable(sess: Session, stage: str, results: GroupResult, allow_partial: bool,
           skipped: dict[str, BaseException]) -> None:
    """--allow-partial: set failed workers aside (named in the result); the head is never optional."""
    failed = results.failed
    if not failed:
        return
    if not allow_partial or sess.inv.head.name in failed:
        raise GroupError(stage, dict(results))
    skipped.update(failed)


def refusals(found: Sequence[Finding], hosts: Sequence[Host]) -> GroupResult:
    """host -> PreflightFailed naming every finding on it (what, then the fixes), or True: for the
    skippable checks, each named so that it can be skipped."""
    out = GroupResult({h.name: True for h in hosts})
    for h in hosts:
        mine = [x for x in found if x.host == h.name]
        if mine:
            out[h.name] = PreflightFailed(
                h.name, "; ".join(f"{x.what} [{x.check}]" for x in mine),
                "; ".join(dict.fromkeys(x.fix for x in mine)) + " (or skip a check: up --skip-check NAME)")
    return out


def first_refusals(found: Sequence[Finding], hosts: Sequence[Host]) -> GroupResult:
    """host -> PreflightFailed with its first finding's what and fix, or True: for the checks that
    cannot be skipped."""
    out = GroupResult({h.name: True for h in hosts})
    for x in reversed(found):
        if x.host in out:
            out[x.host] = PreflightFailed(x.host, x.what, x.fix)
    return out


def rack_refusals(inv: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host],
                  skip: frozenset[str] = frozenset()) -> GroupResult:
    """The node checks (those reading "rack") over the hosts' facts: host -> PreflightFailed with every
    finding on it (what, then the fixes), or True when it has none."""
    seen = Seen.of(inv, hosts, facts)
    return refusals(CK.check_rack(seen.nodes, infiniband=seen.infiniband, ipc_host=seen.ipc_host, skip=skip,
                                  want_gpus=seen.want_gpus), hosts)


def _one_check(inv: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host], check: Check) -> GroupResult:
    return first_refusals(check.judge(Seen.of(inv, hosts, facts)), hosts)


def fence_refusals(inv: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host]) -> GroupResult:
    """host -> PreflightFailed where cluster.fence is on and the fence cannot be put there, else True."""
    return _one_check(inv, facts, hosts, _BY_ID["fence"])


def secret_refusals(inv: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host]) -> GroupResult:
    """host -> PreflightFailed where the cluster has secrets and the host cannot keep them in memory
    (secretstore.refusal), else True."""
    return _one_check(inv, facts, hosts, _BY_ID["secrets"])


_BY_ID = {c.id: c for c in CK.REGISTRY}


def port_probe(sess: Session, hosts: Sequence[Host], facts: Mapping[str, F.HostFacts] | None = None, *,
               tcp: bool = True) -> tuple[dict, dict, list[str]]:
    """What the ports checks read: every node listens on its planned ports and a UDP port
    (checks/port_probe.py on the host, with its python3), then every node dials every other's and sends
    its payload datagrams (preflight.ports, at the data-plane MTUs the facts tell), at once. Returns what
    each listener bound, what each node's connections got, and the hosts where the probe could not run
    (no python3, a failed SSH command): not checked there. `tcp` False: the payload only (a running
    cluster holds the ports)."""
    inv = sess.inv
    plan = PT.planned_ports(inv) if tcp else {h.name: [] for h in hosts}
    pids: dict[str, int] = {}
    udp: dict[str, int] = {}

    def listen(h: Host) -> dict | None:
        doc = N.of(sess, h).ask_host("port_probe.py", "listen", h.ip, f"{PT.LISTEN_SECONDS:g}",
                                     *(str(p) for p, _ in plan[h.name]), timeout=30).doc
        if not doc or not isinstance(doc.get("ports"), dict):
            return None
        if isinstance(doc.get("pid"), int):
            pids[h.name] = doc["pid"]
        if isinstance(doc.get("udp"), int):
            udp[h.name] = doc["udp"]
        return doc["ports"]

    bound = {n: v for n, v in sess.stage("ports-listen", hosts, listen, strict=False).items()
             if isinstance(v, dict)}
    listening = [h for h in hosts if h.name in bound]
    dial = PT.targets(listening, bound)
    payload = PT.payload_targets(listening, udp, PT.data_mtus(listening, facts or {}))

    def connect(h: Host) -> list | None:
        doc = N.of(sess, h).ask_host("port_probe.py", "connect", f"{PT.CONNECT_TIMEOUT:g}", *dial[h.name],
                                     *payload[h.name], timeout=30 + PT.CONNECT_TIMEOUT).doc
        return doc["results"] if doc and isinstance(doc.get("results"), list) else None

    try:
        dialled = {n: v for n, v in sess.stage("ports-connect", listening, connect, strict=False).items()
                   if isinstance(v, list)}
    finally:
        # free the ports for the cluster now (a listener left alone exits by itself within LISTEN_SECONDS)
        sess.stage("ports-stop", [h for h in hosts if h.name in pids], lambda h: N.of(sess, h).run(
            ("kill", str(pids[h.name])), timeout=30, check=False), strict=False)
    unchecked = [h.name for h in hosts if h.name not in bound or h.name not in dialled]
    return bound, dialled, unchecked


def port_reachability(sess: Session, hosts: Sequence[Host], facts: Mapping[str, F.HostFacts] | None = None
                      ) -> tuple[list[Finding], list[str]]:
    """The port probe judged by the checks that read it (with the hosts' facts: firewalld's fix, the
    data-plane MTUs): the findings, and the hosts not checked."""
    bound, dialled, unchecked = port_probe(sess, hosts, facts)
    seen = Seen.of(sess.inv, hosts, dict(facts or {}), bound=bound, dialled=dialled)
    return judge(seen, CK.reading("ports")), unchecked


def path_mtu(sess: Session, hosts: Sequence[Host], facts: Mapping[str, F.HostFacts]) -> list[Finding]:
    """The payload check alone, on a cluster that runs (doctor): what `up`'s mtu-path check finds."""
    if len(hosts) <= 1:
        return []
    _, dialled, _ = port_probe(sess, hosts, facts, tcp=False)
    return PT.payload_findings(hosts, dialled)


class _Rounds:
    """One `up` preflight: the hosts still in it (`live`) and those set aside (`skipped`)."""

    def __init__(self, sess: Session, full: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host],
                 skip: frozenset[str], allow_partial: bool, skipped: dict[str, BaseException]):
        self.sess, self.full, self.facts, self.skip = sess, full, facts, skip
        self.allow_partial, self.skipped = allow_partial, skipped
        self.live = list(hosts)

    def refuse(self, results: GroupResult) -> None:
        usable(self.sess, "preflight", results, self.allow_partial, self.skipped)

    def narrow(self) -> None:
        self.live = [h for h in self.live if h.name not in self.skipped]

    def hosts(self) -> None:
        """Each host on its own facts, in a stage: the first finding refuses it."""
        c = self.full.cluster
        gpus = self.full.gpus_per_node if c.accelerator == "gpu" else None
        found = self.sess.stage("preflight", self.live, lambda h: CK.check_preflight(
            h.name, self.facts[h.name], want_gpus=gpus), strict=False)
        self.refuse(found)
        self.narrow()

    def rack(self) -> None:
        """Across the nodes: what breaks a multi-node vLLM later (links, MTU, IB ports, clocks, ...)."""
        self.refuse(rack_refusals(self.full, self.facts, self.live, self.skip))
        self.narrow()

    def ports(self) -> None:
        """Between the nodes, on the ports the cluster will use: before anything starts."""
        if len(self.live) <= 1 or all(c.id in self.skip for c in CK.reading("ports") if c.skippable):
            return
        # A fence of ours from an earlier `up` admits that run's members only: a node added to the
        # inventory since would be refused by it below. Where a fence of ours does not admit every
        # live node yet, its members are brought in line with this inventory first (what `up` does to
        # it later anyway); a fence that admits them all, and hosts without one, are not touched (up
        # asks before its first change: only a node added since the last `up` changes a fence sooner).
        if self.full.cluster.fence:
            ips = [h.ip for h in self.live]
            todo = [h for h in self.live if not GD.fence_admits(self.sess, h, self.facts, ips)]
            if todo:
                GD.put_fences(self.sess, self.facts, self.full, hosts=todo, only_fenced=True)
        found, unchecked = port_reachability(self.sess, self.live, self.facts)
        for n in unchecked:
            self.sess.reporter.event(n, "ports", "warning", "could not run checks/port_probe.py with the host's "
                                     "python3: node-to-node ports not checked there")
        # the fence's checks below run over the same hosts as this one (as `up` always did)
        self.refuse(refusals(found, self.live))

    def guard(self) -> None:
        """The fence's facts, each check refusing on its own over the same hosts."""
        for check in CK.reading("guard"):
            self.refuse(_one_check(self.full, self.facts, self.live, check))
        self.narrow()


def preflight(sess: Session, full: Inventory, facts: Mapping[str, F.HostFacts], hosts: Sequence[Host], *,
              skip: frozenset[str], allow_partial: bool, skipped: dict[str, BaseException]) -> list[Host]:
    """Every check of the registry over the hosts, before `up` changes anything; returns the hosts
    still in (refused workers are added to skipped with --allow-partial, else GroupError)."""
    rounds = _Rounds(sess, full, facts, hosts, skip, allow_partial, skipped)
    rounds.hosts()
    t0 = sess.clock()
    rounds.rack()
    rounds.ports()
    rounds.guard()
    sess.timings.add("rack", sess.clock() - t0)
    return rounds.live
