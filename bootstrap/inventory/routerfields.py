"""The router's settings of a fleet, pure: cluster.router, its floating address (vip) and prefill/decode."""
from __future__ import annotations

import ipaddress
from typing import Any

from bootstrap.inventory.addresses import _not_one_host
from bootstrap.inventory.envvars import _ENV_NAME
from bootstrap.inventory.hostfields import _host_name
from bootstrap.inventory.portfields import _PORT_FIELDS, _check_fixed, _check_unprivileged
from bootstrap.inventory.values import (
    Validator,
    _bool,
    _check_mapping,
    _choice,
    _described,
    _image,
    _int,
    _port,
    _string,
)
from bootstrap.inventory.yamlfile import _describe, _Loc, _quote
from bootstrap.model import ROUTER_POLICIES, ROUTER_SETTINGS, SETTING_POLICY, Ports, Router, Vip, idle_setting


def _vip_address(value: Any, loc: _Loc) -> tuple[str, int]:
    """An IPv4 address, optionally with its prefix length (10.0.0.100 or 10.0.0.100/24)."""
    value = _string(value, loc)
    text, _, plen = value.partition("/")
    try:
        ip = ipaddress.IPv4Address(text)
        prefix = int(plen) if plen else 32
        if not plen.isdigit() and plen or not 8 <= prefix <= 32:
            raise ValueError
    except ValueError:
        loc.fail(f"{_quote(value)} is not an IPv4 address with an optional prefix length (8-32), "
                 "e.g. 10.0.0.100 or 10.0.0.100/24")
    why = _not_one_host(ip) or ("a loopback address" if ip.is_loopback else None)
    why = why or ("a link-local address (the kernel's own, never routed)" if ip.is_link_local else None)
    net = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if prefix <= 30 and ip in (net.network_address, net.broadcast_address):
        why = f"the {'network' if ip == net.network_address else 'broadcast'} address of {net}"
    if why:
        loc.fail(f"{ip} is {why}: the floating address must be one the clients reach on the router hosts' network")
    return str(ip), prefix


_VIP_FIELDS: dict[str, Validator] = {
    "address": _vip_address,
    "id": _int(1, 255),
    "secret": _described("the name of a secret in cluster.secrets (VRRP's password)",
                         lambda v, loc: _secret_ref(v, loc)),
    "image": _image,
}


def _vip(value: Any, loc: _Loc) -> tuple[Vip, dict[str, _Loc]]:
    values, locs = _check_mapping(value, loc, _VIP_FIELDS,
                                  "a mapping with address (and optionally id, secret, image)")
    if "address" not in values:
        loc.fail("address is missing: the floating address clients use, e.g. {address: 10.0.0.100}")
    address, prefix = values.pop("address")
    return Vip(address=address, prefix=prefix, **values), locs


def _host_names(value: Any, loc: _Loc) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        loc.fail("a non-empty list of host names, e.g. [gpu-01, gpu-05]")
    out: list[str] = []
    for v in value:
        name = _host_name(v, loc)
        if name in out:
            loc.fail(f"{_quote(name)} is listed twice")
        out.append(name)
    return tuple(out)


def _num(v: float) -> str:
    """A bound or a value as written: 1000000, 0.3."""
    return str(int(v)) if float(v).is_integer() else str(v)


_ROUTER_FIELDS: dict[str, Validator] = {
    "host": _described("the name of a host of the inventory", lambda v, loc: _host_name(v, loc)),
    "hosts": _described("a list of host names: each runs a router (with vip)", lambda v, loc: _host_names(v, loc)),
    "vip": _described("a mapping: the floating address", lambda v, loc: v),
    "port": _port,
    "policy": _choice(*ROUTER_POLICIES),
    "metrics_port": _port,
    "health_interval": _int(1, 60),
    "api_key": _described("the name of a secret in cluster.secrets (the key stays in your environment)",
                          lambda v, loc: _secret_ref(v, loc)),
    "prefill": _described("a list of replica numbers (0-based) that prefill; the others decode",
                          lambda v, loc: _replica_list(v, loc)),
    "kv_lease": _int(1, 3600),
    "kv_events": _bool,
    **{name: _described(f"{'an integer' if kind is int else 'a number'} from {_num(lo)} to {_num(hi)}: {what}",
                        lambda v, loc, kind=kind, lo=lo, hi=hi: _setting(v, loc, kind, lo, hi))
       for name, (_, kind, lo, hi, what) in ROUTER_SETTINGS.items()},
}


def _replica_list(value: Any, loc: _Loc) -> tuple[int, ...]:
    """A list of distinct replica numbers (checked against cluster.replicas in _router)."""
    if not isinstance(value, list) or not value:
        loc.fail("a non-empty list of replica numbers (0-based), e.g. [0]: the replicas that prefill")
    out: list[int] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            loc.fail(f"{v!r} is not a replica number (0, 1, ...)")
        if v in out:
            loc.fail(f"replica {v} is listed twice")
        out.append(v)
    return tuple(out)

_API_KEY_HINT = ("name the secret in cluster.secrets that holds the key; the key itself belongs in your "
                 "environment, never in the inventory")


def _setting(value: Any, loc: _Loc, kind: type, lo: float, hi: float) -> float:
    """A policy's setting (ROUTER_SETTINGS): a number in its range, an integer where vllm-router takes one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        loc.fail(f"expected {'an integer' if kind is int else 'a number'}, got {_describe(value)}")
    if not lo <= value <= hi:
        loc.fail(f"must be from {_num(lo)} to {_num(hi)}, got {_num(value)}")
    return kind(value)


def _secret_ref(value: Any, loc: _Loc) -> str:
    """The name of a secret; the value is never echoed (it may be the key itself, pasted)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        loc.fail(f"not a secret's name: {_API_KEY_HINT}")
    return value


def _router(value: Any, loc: _Loc, ports: Ports, replicas: int = 1,
            secret_names: frozenset[str] | set[str] = frozenset(),
            pool: bool = False) -> tuple[Router, _Loc | None, _Loc | None]:
    """The router's settings, where its host(s) and its floating address were named (both checked
    against the hosts later).
    With replicas and no `router` mapping the defaults run, so their ports are checked too."""
    if value is None and replicas == 1:
        return Router(), None, None
    values, locs = _check_mapping(value, loc, _ROUTER_FIELDS) if value is not None else ({}, {})
    if replicas == 1 and values:
        key = next(iter(values))
        why = ("does nothing: with cluster.replicas: 1 no router runs and the endpoint would stay open; list "
               "VLLM_API_KEY under cluster.secrets instead (vLLM asks for it)" if "api_key" in values
               else f"does nothing with cluster.replicas: 1 (no router runs); remove {loc.field} or set replicas")
        locs["api_key" if "api_key" in values else key].fail(why)
    vip_locs: dict[str, _Loc] = {}
    if "vip" in values:
        values["vip"], vip_locs = _vip(values["vip"], locs["vip"])
    _check_router_hosts(values, locs, loc)
    router = Router(**values)
    if router.vip is not None and router.vip.secret is not None and router.vip.secret not in secret_names:
        vip_locs["secret"].fail(f"that name is not listed in cluster.secrets: {_API_KEY_HINT}")
    _check_router_ports(router, values, locs, loc, ports)
    if router.api_key is not None and router.api_key not in secret_names:
        locs["api_key"].fail(f"that name is not listed in cluster.secrets: {_API_KEY_HINT}")
    _check_prefill(router, locs, ports, replicas)
    # a setting of a policy that does not route does nothing (a pool's models may route with their own:
    # settings: the inventory's last rules, idle_settings)
    for name in (n for n in SETTING_POLICY if n in values and not pool):
        why = idle_setting(name, {router.policy})
        if why is not None:
            locs[name].fail(why)
    return router, locs.get("hosts") or locs.get("host"), vip_locs.get("address") or locs.get("vip")


def _check_router_hosts(values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc) -> None:
    """One router on `host`, or routers on `hosts`, behind a floating address when there are several."""
    if "host" in values and "hosts" in values:
        locs["hosts"].fail("set host (one router) or hosts (routers behind cluster.router.vip), not both")
    if "hosts" in values and "vip" not in values and len(values["hosts"]) > 1:
        locs["hosts"].fail("routers on several hosts need a floating address in front of them: set "
                           f"{loc.field}.vip (e.g. {{address: 10.0.0.100}}), or name one host")
    if "vip" in values and len(values.get("hosts") or ()) == 1:
        locs["hosts"].fail("a floating address needs routers on two hosts or more (the default: the heads of the "
                           "first two replicas)")
    if "vip" in values and "host" in values:
        locs["host"].fail("with a floating address the routers run on cluster.router.hosts (default: the heads "
                          "of the first two replicas); use hosts")


def _check_router_ports(router: Router, values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc,
                        ports: Ports) -> None:
    """The router's ports: none of the fixed ones, none below 1024, none of cluster.ports."""
    for name in ("port", "metrics_port"):
        if name in values:
            _check_fixed(values[name], locs[name])
            _check_unprivileged(values[name], locs[name], "the router's container")
    taken = {getattr(ports, name): f"cluster.ports.{name}" for name in _PORT_FIELDS}
    for name in ("port", "metrics_port"):
        port = getattr(router, name)
        if port in taken:
            blame = locs.get(name, loc)
            blame.fail(f"{port} is also {taken[port]}; the router's ports must differ"
                       + ("" if name in values else f" (set {loc.field}.{name})"))
        taken[port] = f"{loc.field}.{name}"


def _check_prefill(router: Router, locs: dict[str, _Loc], ports: Ports, replicas: int) -> None:
    """Prefill/decode: the prefill replicas are replicas of this cluster and some decode; a KV lease needs them."""
    if router.prefill:
        where = locs["prefill"]
        outside = [k for k in router.prefill if k >= replicas]
        if outside:
            where.fail(f"replica {outside[0]} is not a replica of this cluster: replicas are numbered 0 to "
                       f"{replicas - 1} (cluster.replicas: {replicas})")
        if len(router.prefill) >= replicas:
            where.fail(f"every replica would prefill and none decode: list fewer than cluster.replicas ({replicas}); "
                       "the replicas not listed decode")
        if router.port == ports.kv_transfer or router.metrics_port == ports.kv_transfer:
            where.fail(f"the router's ports and cluster.ports.kv_transfer ({ports.kv_transfer}) must differ")
        if router.policy == "kv_aware" or router.kv_events:
            locs["policy" if router.policy == "kv_aware" else "kv_events"].fail(
                "kv_aware routes whole requests by the engines' KV events; with prefill/decode (prefill) the "
                "router picks a prefill and a decode replica: use another policy, or remove prefill")
    elif router.kv_lease is not None:
        locs["kv_lease"].fail("a KV lease needs prefill/decode disaggregation: set cluster.router.prefill too, "
                              "or remove kv_lease")
