"""The fleet's names: its containers, labels, paths in the containers, the replicas' and routers' URLs; pure, no I/O.
"""
from __future__ import annotations

import posixpath

from bootstrap.cluster import plan as PL
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.model import (
    NATIVE_COORD_PORT,
    NATIVE_MASTER_PORT,
    Host,
    Inventory,
)

LABEL_KEEP = "bootstrap.keep"
LABEL_REPLICA = "bootstrap.replica"
#: JSON of what the replica serves (model, flags, image): what a rollout changes and compares.
LABEL_SERVE = "bootstrap.serve"
#: a digest of one member's launch (its replica's hosts, its rank, its `vllm serve` argv, the spec):
#: what `serve` of a pool compares to leave a replica that would start the same untouched.
LABEL_LAUNCH = "bootstrap.launch"
#: a pool router's secrets (their names, comma-separated): its probe's keys change with the models'
LABEL_SECRETS = "bootstrap.secrets"
#: torch.distributed's rendezvous inside a replica, and the members' own (checks/member.py).
MASTER_PORT = NATIVE_MASTER_PORT
COORD_PORT = NATIVE_COORD_PORT
#: Seconds vLLM gets to finish in-flight requests when a replica is stopped on purpose.
STOP_GRACE = 30
#: Where the member supervisor lives in a serve container (copied in before the first start), and
#: its role file there (checks/member.py's ROLE; checks/keeper.py writes it too).
MEMBER_PATH = "/opt/bootstrap/member.py"
_MEMBER_DIR = posixpath.dirname(MEMBER_PATH)
ROLE_PATH = f"{_MEMBER_DIR}/member.role"
#: ... and its count of vLLM starts (checks/member.py's STARTS): a replica's restarts in `status`
STARTS_PATH = f"{_MEMBER_DIR}/member.starts"
#: ... and its line on the last vLLM that exited by itself (EXITED): a gate ends there
EXITED_PATH = f"{_MEMBER_DIR}/member.exited"
KEEPER_PATH = "/opt/bootstrap/keeper.py"
#: what vLLM reads its API key from (the value comes from the secret cluster.router.api_key names)
API_KEY_ENV = SS.API_KEY_ENV


def serve_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-serve"


def standby_name(inv: Inventory) -> str:
    """A member's standby: its serve container's twin, vLLM imported, waiting (cluster.standby)."""
    return f"{serve_name(inv)}-standby"


def spent_name(inv: Inventory) -> str:
    """A killed serve container while the keeper makes it the next standby (checks/keeper.py's SPENT)."""
    return f"{serve_name(inv)}-spent"


def standby_old_name(inv: Inventory) -> str:
    """A replaced replica's standby, kept until its successor serves (rollback)."""
    return f"{standby_name(inv)}-old"


def old_name(inv: Inventory) -> str:
    """A replaced serve container, kept stopped until its successor serves (rollback)."""
    return f"{inv.cluster.container_name}-serve-old"


def serve_names(inv: Inventory) -> tuple[str, ...]:
    """Every serve container a member's host may hold: serving, its standby, a killed one on its
    way to be the next standby, and a rollout's kept ones."""
    return (serve_name(inv), standby_name(inv), spent_name(inv), old_name(inv), standby_old_name(inv))


def router_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-router"


def keeper_name(inv: Inventory) -> str:
    return f"{inv.cluster.container_name}-keeper"


def vip_name(inv: Inventory) -> str:
    """keepalived, on each router host of a fleet with cluster.router.vip."""
    return f"{inv.cluster.container_name}-vip"


def is_fleet(inv: Inventory) -> bool:
    return inv.cluster.replicas > 1


def is_pd(inv: Inventory) -> bool:
    """Prefill and decode disaggregated (cluster.router.prefill names the prefill replicas)."""
    return bool(inv.cluster.router.prefill) and is_fleet(inv)


def role(inv: Inventory, k: int) -> str | None:
    """'prefill' or 'decode' for replica k of a disaggregated fleet; None otherwise."""
    if not is_pd(inv):
        return None
    return "prefill" if k in inv.cluster.router.prefill else "decode"


def router_hosts(inv: Inventory) -> tuple[Host, ...]:
    """The hosts that run a router (Inventory.router_hosts)."""
    return inv.router_hosts


def router_host(inv: Inventory) -> Host:
    """The first router host (the endpoint's host without a floating address)."""
    return router_hosts(inv)[0]


def http_url(ip: str, port: int) -> str:
    return "http://" + PL.hostport(ip, port)


def replica_url(inv: Inventory, k: int) -> str:
    """Replica k's API server (its head, on the data plane): the router's worker URL."""
    return http_url(inv.replicas[k][0].ip, inv.cluster.ports.vllm)


def router_url(inv: Inventory, host: Host | None = None) -> str:
    """The fleet's endpoint (the floating address, else the router host), or one router's own URL."""
    r = inv.cluster.router
    if host is None and r.vip is not None:
        return http_url(r.vip.address, r.port)
    return http_url((host or router_host(inv)).ip, r.port)
