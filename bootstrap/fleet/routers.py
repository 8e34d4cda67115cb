"""The fleet's routers, their floating address (keepalived) and the keeper, as argv and configuration: pure, no I/O.
"""
from __future__ import annotations

import ipaddress
import json
import math
import zlib
from dataclasses import dataclass
from typing import Mapping, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.errors import FleetError
from bootstrap.fleet import kvevents as KV
from bootstrap.fleet.names import (
    API_KEY_ENV,
    KEEPER_PATH,
    LABEL_KEEP,
    LABEL_SECRETS,
    http_url,
    is_pd,
    keeper_name,
    role,
    router_host,
    router_hosts,
    router_name,
    serve_name,
    standby_name,
    vip_name,
)
from bootstrap.model import (
    ROUTER_SETTINGS,
    Host,
    Inventory,
    Router,
    ServedModel,
)
from bootstrap.remote import argv as RA

#: seconds the router's circuit breaker keeps a replica that failed requests out before it tries it
#: again (vllm-router's default is 60 s: a healed replica would sit out that long, and a rollout
#: waits for it, since taking the other replica out then leaves the router none). A replica that
#: heals in ~15 s (a standby's take-over) sat out up to 16 s more with 20 (perf/heal.py); a trial
#: request that fails is retried on another replica, so a short one costs clients nothing.
CB_TIMEOUT = 5


def api_key(inv: Inventory, model: str | None = None) -> str | None:
    """The API key's value for requests to `model` (a pool's model or adapter: the key its replicas ask
    for, models[].api_key's or the pool's), else the one cluster.router.api_key names; None: none."""
    if model is not None and inv.models:
        keys = SS.model_keys(inv)
        if model in keys:
            return keys[model]
    return SS.values(inv).get(API_KEY_ENV)


#: Where a pool's router container finds its entry (checks/router_entry.py, copied in at create).
ROUTER_ENTRY_PATH = "/opt/bootstrap/router_entry.py"
#: a pool router's workers (pool_workers as JSON), read by its entry on every start; `serve`
#: rewrites it when it converges the pool
WORKERS_PATH = "/opt/bootstrap/workers.json"


def model_policy(inv: Inventory, m: ServedModel) -> str:
    """The router policy of a pool's model: its own, else cluster.router.policy."""
    return m.policy or inv.cluster.router.policy


def pool_workers(inv: Inventory, urls: Sequence[str]) -> list[dict]:
    """A pool's workers as vllm-router's POST /workers takes them: each replica's URL under its model's
    served name and under each of its adapters' names (vllm-router keeps one entry per URL and indexes it
    under every name it was added with), with the model's policy (kept from a model's first worker)."""
    out = []
    for k, url in enumerate(urls):
        m = inv.model_of(k)
        if m is not None:
            out += worker_entries(inv, m, url, (m.name, *(a for a, _ in m.adapters)))
    return out


def worker_entries(inv: Inventory, m: ServedModel, url: str, names: Sequence[str]) -> list[dict]:
    """One replica of model m as the router's workers: its URL under each of `names`, with m's policy."""
    policy = {"policy": model_policy(inv, m)}
    return [{"url": url, "model_id": name, "labels": policy} for name in names]


def workers_file(inv: Inventory, urls: Sequence[str]) -> bytes:
    """The content of a pool router's WORKERS_PATH."""
    return json.dumps(pool_workers(inv, urls), indent=1).encode()


def rewritten_workers(current: bytes | None, inv: Inventory, urls: Sequence[str],
                      replaced: Mapping[str, list[dict]]) -> bytes:
    """A workers file with the entries of the replicas in `replaced` (url -> their entries) put in place
    of what it held for them: what `adapter add|remove` leaves, so that a router restarted later routes
    an adapter loaded at runtime too. The others' entries are kept as they were (their own runtime
    adapters); a file that cannot be read is the plan's (workers_file) with the same replacement."""
    try:
        doc = json.loads(current or b"")
        if not isinstance(doc, list) or not all(isinstance(e, dict) and "url" in e for e in doc):
            raise ValueError("not a workers list")
    except ValueError:
        doc = pool_workers(inv, urls)
    kept = [e for e in doc if e["url"] not in replaced]
    return json.dumps(kept + [e for entries in replaced.values() for e in entries], indent=1).encode()


def router_run_argv(inv: Inventory, urls: Sequence[str], image: str | None = None,
                    host: Host | None = None, kv: KV.KvEvents | None = None) -> tuple[str, ...]:
    """vllm-router, detached with a restart policy, bound to the router host's data-plane IP.

    Its health checks use the router's own timeout and failure count (5 s, 3 in a row): a replica
    busy enough to answer /health slowly is still serving, and marking it unhealthy when it is the
    only one in the rotation (one replica is out during a rollout) answers every request 503. A dead
    replica is found sooner anyway: its connections are refused, and the router retries on another.

    A pool of models (inv.models): vllm-router's multi-model mode (--enable-igw), which routes by the
    request's `model`; its workers are given by checks/router_entry.py, the container's command (that
    mode drops --worker-urls), so the argv is a `docker create` and the entry and its workers file
    (workers_file) are copied in.

    kv_aware: each replica's KV event source (kv, what the fleet serves: kvevents.py)."""
    r = inv.cluster.router
    if r.policy == "kv_aware" and kv is None:
        raise FleetError("kv_aware: what the replicas serve is not known (their containers carry no serve "
                         "label); run serve again")
    h = host or router_host(inv)
    names = SS.router_names(inv)
    pool = bool(inv.models)
    entrypoint, prefix = SS.entry_argv(names, "vllm-router", ()) if not pool else SS.entry_argv(
        names, "python3", (ROUTER_ENTRY_PATH, "@" + WORKERS_PATH, "--", "vllm-router"))
    c = inv.cluster
    return RA.docker_argv(RA.RunSpec(
        image or c.image, router_name(inv), detach=not pool, create=pool,
        options=("--network", "host", "--restart", "unless-stopped", *RA.hardened(),
                 *SS.mounts(c.name, names, SS.ROUTER),
                 *RA.labels(((PL.LABEL_CLUSTER, c.name), (LABEL_KEEP, c.name),
                             *(((LABEL_SECRETS, ",".join(names)),) if pool else ())))),
        entrypoint=entrypoint,
        command=(*prefix, "--host", h.ip, "--port", str(r.port), "--policy", r.policy,
                 *_workers_argv(inv, urls),
                 *(KV.router_flags(inv, urls, kv) if r.policy == "kv_aware" and kv else ()),
                 *settings_argv(r),
                 "--health-check-interval-secs", str(r.health_interval), "--health-check-timeout-secs", "5",
                 "--health-failure-threshold", "3", "--health-success-threshold", "1",
                 "--health-check-endpoint", "/health",
                 "--cb-timeout-duration-secs", str(CB_TIMEOUT),
                 "--worker-startup-timeout-secs", "30",
                 "--prometheus-host", h.ip, "--prometheus-port", str(r.metrics_port))))


def settings_argv(r: Router) -> tuple[str, ...]:
    """The policies' settings the inventory (or an A/B arm) gives, as vllm-router's flags."""
    out: tuple[str, ...] = ()
    for name, (flag, *_rest) in ROUTER_SETTINGS.items():
        value = getattr(r, name)
        out += (flag, str(value)) if value is not None else ()
    return out


def _workers_argv(inv: Inventory, urls: Sequence[str]) -> tuple[str, ...]:
    """The router's workers: every replica alike, or in PD mode each as a prefill or a decode worker
    (vllm-router's --vllm-pd-disaggregation; NIXL's pull-based transfer is its default connector)."""
    if inv.models:
        return ("--enable-igw",)
    if not is_pd(inv):
        return ("--worker-urls", *urls)
    out: tuple[str, ...] = ("--vllm-pd-disaggregation",)
    for k, url in enumerate(urls):
        out += ("--prefill", url) if role(inv, k) == "prefill" else ()
    for k, url in enumerate(urls):
        out += ("--decode", url) if role(inv, k) == "decode" else ()
    return out


# -- the floating address -------------------------------------------------------------------------
#: Where keepalived's container finds its entry script and its configuration (copied in at create).
VIP_ENTRY_PATH = "/opt/bootstrap/vip_entry.sh"
VIP_CONF_PATH = "/etc/keepalived/keepalived.conf"
#: keepalived's own files (pids, the password include) in a tmpfs of its container
VIP_RUN = "/run/keepalived"
#: VRRP advertisement interval: VRRPv3's sub-second one (a dead master is replaced after 3 missed
#: adverts plus a skew: under a second); VRRPv2, the one with a password, counts whole seconds.
ADVERT_V3 = 0.25
ADVERT_V2 = 1
#: keepalived asks the router itself for /readiness every CHECK_INTERVAL s (keepalived counts whole
#: seconds), twice within one check, CHECK_TRY s each: a router that stops answering loses the address
#: at the first check that fails, within CHECK_INTERVAL + 2 * CHECK_TRY s (2.4 s), and one slow answer
#: alone does not move it.
CHECK_INTERVAL = 1
CHECK_TRY = 0.7


def vrid(inv: Inventory) -> int:
    """VRRP's virtual router id: cluster.router.vip.id, else one derived from the cluster's name
    (two clusters on one network segment need different ids)."""
    vip = inv.cluster.router.vip
    if vip is not None and vip.id is not None:
        return vip.id
    return zlib.crc32(inv.cluster.name.encode()) % 255 + 1


def vip_config(inv: Inventory, host: Host, iface: str) -> str:
    """keepalived.conf for one router host: one VRRP instance, unicast to the other router hosts (and
    only adverts from them count), every host BACKUP without preemption (a host that comes back does
    not take the address from the one that holds it), the higher priority on the earlier router
    host, and a check that asks this host's router for /readiness: 200 while it answers and has a
    healthy worker. Not /health, which is 503 while any one worker is unhealthy (measured with
    vllm-router 0.1.17: one replica paused -> "Unhealthy servers: [...]" 503), so one dead replica
    would take the address from every router at once."""
    c = inv.cluster
    vip = c.router.vip
    assert vip is not None
    hosts = router_hosts(inv)
    peers = "".join(f"    {h.ip}\n" for h in hosts if h != host)
    priority = 200 - 10 * hosts.index(host)
    ask = f"curl -fsS -m {CHECK_TRY} -o /dev/null {http_url(host.ip, c.router.port)}/readiness"
    check = f"/bin/sh -c '{ask} || {ask}'"
    version = (f"    version 2\n    advert_int {ADVERT_V2}\n    include {VIP_RUN}/auth.conf\n" if vip.secret
               else f"    version 3\n    advert_int {ADVERT_V3}\n")
    return (f"# written by bootstrap for cluster {c.name} on {host.name}\n"
            "global_defs {\n"
            f"    router_id {host.name}\n"
            "    enable_script_security\n"
            "    script_user root\n"
            "    vrrp_garp_master_delay 1\n"
            "    vrrp_garp_master_repeat 3\n"
            "}\n"
            "vrrp_script router_health {\n"
            f'    script "{check}"\n'
            f"    interval {CHECK_INTERVAL}\n    timeout {math.ceil(2 * CHECK_TRY) + 1}\n    fall 1\n    rise 2\n"
            "}\n"
            f"vrrp_instance {c.name} {{\n"
            "    state BACKUP\n    nopreempt\n"
            f"    interface {iface}\n"
            f"    virtual_router_id {vrid(inv)}\n"
            f"    priority {priority}\n"
            f"{version}"
            f"    unicast_src_ip {host.ip}\n"
            "    check_unicast_src\n"
            f"    unicast_peer {{\n{peers}    }}\n"
            f"    virtual_ipaddress {{\n        {vip.address}/{vip.prefix} dev {iface}\n    }}\n"
            "    track_script {\n        router_health\n    }\n"
            "}\n")


def vip_create_argv(inv: Inventory, host: Host) -> tuple[str, ...]:
    """keepalived on one router host: the host's network, only the capabilities VRRP and the address
    need (NET_ADMIN, NET_RAW, NET_BROADCAST) and those it drops to before each check of the router
    (SETUID, SETGID: without them the check never runs and a dead router keeps the address), its own
    files on a tmpfs, the password (if any) from the
    router's secret set. Its entry forwards the floating address's router port to this host's router
    (which listens on the data-plane IP only) and runs keepalived; on SIGTERM it removes both."""
    c = inv.cluster
    vip = c.router.vip
    assert vip is not None
    names = SS.vip_names(inv)
    entrypoint, command = SS.entry_argv(names, "sh", (VIP_ENTRY_PATH, vip.address, str(c.router.port), host.ip,
                                                     vip.secret or "", VIP_CONF_PATH, VIP_RUN))
    return RA.docker_argv(RA.RunSpec(
        vip.image or c.image, vip_name(inv), create=True,
        options=("--network", "host", "--restart", "unless-stopped",
                 *RA.hardened("NET_ADMIN", "NET_RAW", "NET_BROADCAST", "SETUID", "SETGID"),
                 "--tmpfs", f"{VIP_RUN}:mode=700", "--stop-timeout", "10",
                 *SS.mounts(c.name, names, SS.VIP), *RA.labels(((PL.LABEL_CLUSTER, c.name), (LABEL_KEEP, c.name)))),
        entrypoint=entrypoint, command=tuple(command)))


@dataclass(frozen=True)
class RouterLaunch:
    host: str
    #: `docker run` of its vllm-router
    run: tuple[str, ...]
    #: keepalived's `docker create` and configuration (a floating address), else empty
    vip_create: tuple[str, ...] = ()
    vip_config: str = ""
    #: a pool router's workers file (WORKERS_PATH), copied in before it starts; else empty
    workers: bytes = b""


def keeper_create_argv(inv: Inventory) -> tuple[str, ...]:
    """The keeper: no network, no capabilities, read-only root; only the Docker socket."""
    c = inv.cluster
    interval = max(1, min(c.router.health_interval, 5))
    return RA.docker_argv(RA.RunSpec(
        c.image, keeper_name(inv), create=True,
        options=("--restart", "unless-stopped", "--network", "none", *RA.hardened(),
                 *RA.volumes("/var/run/docker.sock:/var/run/docker.sock"), *RA.labels({PL.LABEL_CLUSTER: c.name})),
        entrypoint="python3",
        command=(KEEPER_PATH, c.name, str(interval),
                 f"{serve_name(inv)}={standby_name(inv)}" if c.standby else serve_name(inv),
                 router_name(inv), *((vip_name(inv),) if c.router.vip is not None else ()))))


def vip_network_problem(inv: Inventory, host: Host, network: str) -> str | None:
    """Why no client on `network` (the router host's data-plane network, from its facts) could use the
    floating address, or None: it must be a host address of that network (the inventory checks what
    it can offline: bootstrap.inventory._check_vip)."""
    vip = inv.cluster.router.vip
    assert vip is not None
    net = ipaddress.ip_network(network)
    address = ipaddress.IPv4Address(vip.address)
    if net.version != 4 or address not in net:
        return (f"{host.name}: the floating address {vip.address} is outside {host.name}'s network {net} (the one "
                f"of its ip {host.ip}): no client there would reach it; set cluster.router.vip.address to a free "
                "address of that network")
    if net.prefixlen <= 30 and address in (net.network_address, net.broadcast_address):
        which = "network" if address == net.network_address else "broadcast"
        return (f"{host.name}: the floating address {vip.address} is the {which} address of {host.name}'s network "
                f"{net}; set cluster.router.vip.address to a free host address of that network")
    return None


def plan_routers(inv: Inventory, urls: Sequence[str], image: str | None = None,
                 ifaces: Mapping[str, str | None] | None = None,
                 nets: Mapping[str, str | None] | None = None,
                 kv: KV.KvEvents | None = None) -> tuple[RouterLaunch, ...]:
    """A router on each router host; with a floating address keepalived beside each, on the
    interface that holds the host's data-plane IP (`ifaces`, from the host's facts), the address
    on the network of that IP (`nets`, from the facts too; a host not in it is not checked)."""
    vip = inv.cluster.router.vip
    out = []
    for h in router_hosts(inv):
        run = router_run_argv(inv, urls, image, h, kv)
        workers = workers_file(inv, urls) if inv.models else b""
        if vip is None:
            out.append(RouterLaunch(h.name, run, workers=workers))
            continue
        iface = (ifaces or {}).get(h.name)
        if not iface:
            raise FleetError(f"{h.name}: no interface holds its ip {h.ip}, so keepalived has none to put the "
                             f"floating address {vip.address} on; set the host's ip to its data-plane address")
        network = (nets or {}).get(h.name)
        why = vip_network_problem(inv, h, network) if network else None
        if why:
            raise FleetError(why)
        out.append(RouterLaunch(h.name, run, vip_create_argv(inv, h), vip_config(inv, h, iface), workers))
    return tuple(out)
