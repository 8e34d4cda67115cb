"""The check registry's types, pure: a check (`Check`), what the checks read (`Seen`), one `Finding` type.

A check is one entry: its id (the name `up --skip-check` takes), what it looks at, the facts it
reads, a pure judge from what was seen to findings, and whether an expert may skip it. Each
finding names its check, the host, what is wrong and the fix. The entries are in checks.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from bootstrap.cluster.facts import HostFacts, RackFacts
from bootstrap.cluster.plan import node_env
from bootstrap.model import Host, Inventory

#: The facts a check may read, in the order `up` gathers them: each host's own (Docker, GPUs), the
#: nodes side by side (RackNode: links, addresses, IB ports, clock, driver, nofile, image), the port
#: probe between the nodes, the fence's facts (HostFacts.guard).
READS = ("host", "rack", "ports", "guard")


@dataclass(frozen=True)
class Finding:
    """One problem a check found on one host."""

    check: str
    host: str
    what: str
    fix: str


@dataclass(frozen=True)
class RackNode:
    """What the checks know of one node."""

    host: str
    #: the data-plane IP (the inventory's ip)
    ip: str
    facts: RackFacts
    #: the node container's environment (the cluster's with the host's over it)
    env: Mapping[str, str] = field(default_factory=dict)
    #: NVIDIA driver version (None: not a GPU host, or unknown)
    driver: str | None = None
    nofile_hard: int | None = None
    #: the cluster image on the node by its content (facts.image_key; None: not there yet)
    image_key: str | None = None
    #: the newest CUDA the node's driver runs (nvidia-smi --version), and the image's CUDA variables
    driver_cuda: str | None = None
    image_cuda: Mapping[str, str] = field(default_factory=dict)
    #: the platform the cluster image on the node is built for (facts.image_platform; None: not there)
    image_platform: str | None = None


def nodes_from(hosts: Sequence[Host], facts: Mapping[str, HostFacts]) -> list[RackNode]:
    """A RackNode for each host whose facts hold the rack facts, in the hosts' order: its data-plane IP,
    the node container's environment (plan.node_env), the driver of its first GPU, its nofile limit."""
    return [RackNode(h.name, h.ip, f.rack, node_env(h), f.gpus[0].driver if f.gpus else None, f.nofile_hard,
                     f.image_key if f.image_id else None, f.driver_cuda, f.image_cuda, f.image_platform)
            for h in hosts if (f := facts.get(h.name)) is not None and f.rack is not None]


@dataclass(frozen=True)
class Seen:
    """What the checks read: the hosts checked (head first) and what was gathered on them."""

    hosts: tuple[Host, ...] = ()
    facts: Mapping[str, HostFacts] = field(default_factory=dict)
    #: the nodes side by side (nodes_from)
    nodes: tuple[RackNode, ...] = ()
    #: the inventory (None: a check that needs it finds nothing)
    inv: Inventory | None = None
    #: the GPUs each host must show (None: a CPU cluster)
    want_gpus: int | None = None
    infiniband: bool = False
    ipc_host: bool = True
    #: the port probe (preflight.run.port_reachability): host -> port -> what its listener got, and
    #: host -> what each of its connections got
    bound: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    dialled: Mapping[str, Sequence[Mapping[str, object]]] = field(default_factory=dict)

    @classmethod
    def of(cls, inv: Inventory, hosts: Sequence[Host], facts: Mapping[str, HostFacts], **probe) -> "Seen":
        """What the inventory asks for and the hosts' facts, for these hosts."""
        c = inv.cluster
        return cls(tuple(hosts), facts, tuple(nodes_from(hosts, facts)), inv,
                   inv.gpus_per_node if c.accelerator == "gpu" else None, c.infiniband, c.ipc_host, **probe)


@dataclass(frozen=True)
class Check:
    """One check: the registry's entry."""

    #: the name `up --skip-check` takes, and each finding's `check`
    id: str
    #: what it looks at (`up --help`, doctor's finding titles)
    title: str
    #: the facts it reads (READS): it runs once `up` has gathered them
    reads: str
    #: the pure judge: what was seen -> a finding per problem
    judge: Callable[[Seen], list[Finding]]
    #: whether `up --skip-check ID` may leave it out
    skippable: bool = True


def judge(seen: Seen, checks: Sequence[Check], skip: frozenset[str] = frozenset()) -> list[Finding]:
    """Every finding of these checks, in their order, leaving out the skippable ones named in skip."""
    return [f for c in checks if not (c.skippable and c.id in skip) for f in c.judge(seen)]


def by_host(found: Sequence[Finding], hosts: Sequence[str]) -> list[Finding]:
    """The findings in the hosts' order (put the head first), then by check; stable otherwise."""
    order = {h: i for i, h in enumerate(hosts)}
    return sorted(found, key=lambda f: (order.get(f.host, 0), f.check))
