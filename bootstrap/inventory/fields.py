"""The cluster settings of an inventory, pure: the `cluster:` table and `_cluster`, which builds the `Cluster`.

Each field of the file is checked by a small table (field -> validator): `_CLUSTER_FIELDS` and
`_SSH_FIELDS` here, the others beside their concern (values.py: the validators of single values;
addresses.py, envvars.py; portfields.py, routerfields.py, monitorfields.py; hostfields.py: the
host entries and `_HostSpec`, what both formats make of one). `_cluster` builds the `Cluster` and
checks the rules within it (mounts, ray_args, secrets, router, monitor).
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from bootstrap.inventory import secretrules as SR
from bootstrap.inventory.addresses import _dashboard_host, _fence_allow, _jump
from bootstrap.inventory.envvars import _env, _env_name
from bootstrap.inventory.monitorfields import _monitor
from bootstrap.inventory.portfields import _ports
from bootstrap.inventory.routerfields import _router
from bootstrap.inventory.values import (
    Validator,
    _bool,
    _check_mapping,
    _choice,
    _described,
    _image,
    _image_or_off,
    _int,
    _list,
    _mount,
    _nofile,
    _optional,
    _path,
    _pattern,
    _port,
    _positive_number,
    _remote_abs_path,
    _shm_size,
    _string,
    _user,
    gathered,
)
from bootstrap.inventory.yamlfile import _MAX_HOSTS, _Loc
from bootstrap.model import (
    HF_CACHE_IN_CONTAINER,
    MAX_GPUS_PER_HOST,
    SETTING_POLICY,
    Cluster,
    Router,
    Secret,
    SSHSettings,
)


class _Offline(dict):
    """The caller's environment when nothing will be applied (plan): listed secrets may be unset."""


_NAME_RX = r"[a-z0-9][a-z0-9-]*"
_CONTAINER_RX = r"[a-zA-Z0-9][a-zA-Z0-9_.-]*"


#: `ray start` options the plan sets or the fence and the ports table take as Ray's defaults -> where
#: the setting is made instead. Ray's CLI (click) takes no abbreviation, but the last of two values.
_RAY_OWNED = {
    "--head": "the host with role: head",
    "--address": "from the head's ip and {c}.ports.ray_gcs",
    "--node-ip-address": "each host's ip",
    "--port": "set {c}.ports.ray_gcs",
    "--gcs-server-port": "set {c}.ports.ray_gcs",
    "--dashboard-port": "set {c}.ports.dashboard",
    "--dashboard-host": "set {c}.dashboard_host",
    "--metrics-export-port": "set {c}.ports.ray_metrics",
    "--num-gpus": "from each host's gpus, checked with nvidia-smi",
    "--block": "the container's process",
    "--ray-client-server-port": "Ray's default 10001, which the fence covers",
    "--min-worker-port": "Ray's default range 10002-19999, which the fence covers",
    "--max-worker-port": "Ray's default range 10002-19999, which the fence covers",
    "--worker-port-list": "Ray's default range 10002-19999, which the fence covers",
    "--node-manager-port": "a port Ray picks in the ranges the fence covers",
    "--object-manager-port": "a port Ray picks in the ranges the fence covers",
    "--runtime-env-agent-port": "a port Ray picks in the ranges the fence covers",
    "--dashboard-agent-listen-port": "Ray's default, which the fence covers",
    "--dashboard-agent-grpc-port": "a port Ray picks in the ranges the fence covers",
    "--redis-password": "Ray's token authentication, {c}.ray_auth",
}


# --------------------------------------------------------------------------------------------
# Cluster


@dataclass
class _SSHDefaults:
    """cluster.ssh user/port/key/jump: defaults for every host, with where they were set."""

    values: dict[str, Any] = field(default_factory=dict)
    locs: dict[str, _Loc] = field(default_factory=dict)
    known_hosts_loc: _Loc | None = None


_SSH_FIELDS: dict[str, Validator] = {
    "user": _optional(_user),
    "port": _optional(_port),
    "key": _optional(_path),
    "jump": _optional(_jump),
    "known_hosts": _optional(_path),
    "accept_new_host_keys": _bool,
    "connect_timeout": _positive_number,
    "command_timeout": _positive_number,
    "connect_retries": _int(0, 100),
}

_CLUSTER_FIELDS: dict[str, Validator] = {
    "name": _pattern(_NAME_RX, "lowercase letters, digits and '-', e.g. llama-405b"),
    "image": _image,
    "container_name": _pattern(
        _CONTAINER_RX, "letters, digits, '_', '.', '-', starting with a letter or digit"
    ),
    "accelerator": _choice("gpu", "none"),
    "runtime": _optional(_choice("ray", "none")),
    "gpus_per_node": _optional(_int(0, MAX_GPUS_PER_HOST)),
    "hf_cache": _optional(_remote_abs_path),
    "mounts": _list(_mount),
    "ipc_host": _bool,
    "shm_size": _shm_size,
    "ports": _described("a mapping: cluster.ports below", lambda v, loc: v),  # checked in _ports
    "env": _env,
    "secrets": _list(_env_name),
    "infiniband": _bool,
    "privileged": _bool,
    "nofile": _optional(_nofile),
    "load_image": _bool,
    "peer_copy": _bool,
    "image_mirror": _image_or_off,
    "ray_args": _list(_string),
    "dashboard_host": _dashboard_host,
    "ssh": _described("a mapping: cluster.ssh below", lambda v, loc: v),  # checked in _ssh
    "replicas": _int(1, _MAX_HOSTS),
    "standby": _bool,
    # checked in _router (needs the ports and the secrets) and _monitor (needs the ports)
    "router": _described("a mapping: cluster.router below", lambda v, loc: v),
    "monitor": _described("a mapping: cluster.monitor below", lambda v, loc: v),
    "fence": _bool,
    "fence_allow": _described("a list, each an IP address or a network (CIDR); together at most a /8 of IPv4 "
                              "and a /32 of IPv6", _fence_allow),
    "ray_auth": _choice("token", "off"),
}


def _ssh(value: Any, loc: _Loc) -> tuple[SSHSettings, _SSHDefaults]:
    values, locs = _check_mapping(value, loc, _SSH_FIELDS)
    defaults = _SSHDefaults(
        values={k: values[k] for k in ("user", "port", "key", "jump") if values.get(k) is not None},
        locs=locs,
        known_hosts_loc=locs.get("known_hosts"),
    )
    settings = SSHSettings(
        **{k: v for k, v in values.items() if k not in ("user", "port", "key", "jump")}
    )
    return settings, defaults


def _cluster(
    value: Any, loc: _Loc, environ: Mapping[str, str], pool: bool = False
) -> tuple[Cluster, _SSHDefaults, dict[str, Any]]:
    """The Cluster, the ssh defaults for hosts, and facts the hosts need (gpus, env, secrets).
    pool: the inventory has models: (a fleet whatever cluster.replicas says: the models' replicas)."""
    values, locs = _check_mapping(value, loc, _CLUSTER_FIELDS)
    if pool:
        _check_pool(values, locs)
        values["replicas"] = 2  # a fleet: its router and standby settings apply (the groups come from models:)
    kwargs = {
        k: v
        for k, v in values.items()
        if k not in ("ports", "ssh", "env", "secrets", "gpus_per_node", "hf_cache", "router", "monitor")
    }
    kwargs["ports"] = _ports(values.get("ports"), locs.get("ports", loc.sub("ports")))
    settings, defaults = _ssh(values.get("ssh"), locs.get("ssh", loc.sub("ssh")))
    kwargs["ssh"] = settings
    kwargs["hf_cache"] = values.get("hf_cache")

    _check_mounts(value, values, locs, loc, kwargs["hf_cache"])
    _check_ray_args(value, values, locs, loc)

    # Settings that would do nothing are refused, not ignored.
    if values.get("fence") is False and values.get("fence_allow"):
        locs["fence_allow"].fail(f"does nothing with {loc.field}.fence: false (no fence to admit anyone through)")
    if values.get("runtime") == "none" and values.get("ray_auth") == "token":
        locs["ray_auth"].fail(f"does nothing with {loc.field}.runtime: none (no Ray runs)")
    _check_mirror_and_standby(values, locs, loc)

    env = values.get("env", {})
    secrets, secret_locs = _secrets(value, values, locs, loc, environ, env)
    secret_names = {s.name for s in secrets}
    for name, (_, vloc) in env.items():
        if name in secret_names:
            vloc.fail(_SECRET_IN_ENV.format(name=name))
    kwargs["secrets"] = tuple(secrets)
    kwargs["env"] = tuple(sorted((k, v) for k, (v, _) in env.items()))
    rloc = locs.get("router", loc.sub("router"))
    kwargs["router"], router_host_loc, vip_loc = _router(values.get("router"), rloc, kwargs["ports"],
                                                         values.get("replicas", 1), secret_names, pool)
    _secret_roles(value, locs.get("router", loc.sub("router")), kwargs["router"], secrets, secret_locs)
    r = kwargs["router"]
    if values.get("fence") is False and (r.policy == "kv_aware" or r.kv_events):
        locs["fence"].fail("kv_aware needs the fence: each engine publishes its KV events (the prompts' token ids) "
                           "on cluster.ports.kv_events on every interface (vLLM binds no single address), and "
                           "only the fence keeps that port to the cluster's members; remove fence: false")
    kwargs["monitor"], monitor_host_loc = _monitor(
        values.get("monitor"), locs.get("monitor", loc.sub("monitor")), kwargs["ports"],
        kwargs["router"] if values.get("replicas", 1) > 1 else None)

    if kwargs["monitor"].dcgm and values.get("accelerator", "gpu") == "none":
        locs["monitor"].key(_raw(value, "monitor"), "dcgm").fail(
            "does nothing with accelerator: none (DCGM exports GPU metrics); remove it")

    cluster = Cluster(**kwargs)
    facts = {
        "gpus_per_node": (values.get("gpus_per_node"), locs.get("gpus_per_node")),
        "env": {k: v for k, (v, _) in env.items()},
        "secret_names": secret_names,
        "replicas_loc": locs.get("replicas"),
        "router_host_loc": router_host_loc,
        #: where each router setting is written (a pool's are judged against its models' policies)
        "router_setting_locs": {k: rloc.key(values["router"], k) for k in SETTING_POLICY
                                if isinstance(values.get("router"), dict) and k in values["router"]},
        "vip_loc": vip_loc,
        "monitor_host_loc": monitor_host_loc,
    }
    return cluster, defaults, facts


def _check_pool(values: dict[str, Any], locs: dict[str, _Loc]) -> None:
    """With models: the models say how many replicas there are, and a disaggregated pool is not planned."""
    if "replicas" in values:
        locs["replicas"].fail("is set by models: (each model's replicas); remove it")
    router = values.get("router")
    if isinstance(router, dict) and "prefill" in router:
        locs["router"].key(router, "prefill").fail(
            "prefill/decode (router.prefill) is not planned for a pool of models: serve one model per inventory "
            "for it, or remove prefill")
    for key, bad in (("policy", "kv_aware"), ("kv_events", True)):
        if isinstance(router, dict) and router.get(key) == bad:
            locs["router"].key(router, key).fail(
                f"{key}: {'true' if bad is True else bad} is not planned for a pool of models (vllm-router's KV "
                "event sources name one model): serve one model per inventory for kv_aware, or remove it")


def _check_mounts(value: Any, values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc, hf_cache: Any) -> None:
    """Mounts: one destination once; the HF cache has its own."""
    taken = {HF_CACHE_IN_CONTAINER: f"{loc.field}.hf_cache"} if hf_cache else {}
    mounts = values.get("mounts", ())
    for i, mount in enumerate(mounts):
        dst = posixpath.normpath(mount.split(":")[1])
        if dst in taken:
            locs["mounts"].item(_raw(value, "mounts"), i).fail(
                f"{dst} is already mounted by {taken[dst]}"
            )
        taken[dst] = f"{loc.field}.mounts[{i}]"


def _check_ray_args(value: Any, values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc) -> None:
    """What the plan gives `ray start` is set in one place: the inventory's field, not ray_args."""
    for i, arg in enumerate(values.get("ray_args", ())):
        flag = arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else ""
        if flag in _RAY_OWNED:
            locs["ray_args"].item(_raw(value, "ray_args"), i).fail(
                f"{flag} is what bootstrap gives `ray start` ({_RAY_OWNED[flag].format(c=loc.field)}): "
                "it is not passed through ray_args"
            )


def _secrets(value: Any, values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc, environ: Mapping[str, str],
             env: dict[str, tuple[str, _Loc]]) -> tuple[list[Secret], dict[str, _Loc]]:
    """Secrets: listed names must be set; by default HF_TOKEN when it is set. The secrets, and where
    each listed one was named."""
    secrets: list[Secret] = []
    secret_locs: dict[str, _Loc] = {}
    if "secrets" in values:
        seq = _raw(value, "secrets")
        for i, name in enumerate(values["secrets"]):
            item_loc = secret_locs[name] = locs["secrets"].item(seq, i).at(field=locs["secrets"].field)
            with gathered():  # validate: every unset secret named, and the file's other errors too
                secrets.append(_listed_secret(name, values["secrets"][:i], item_loc, environ))
    elif environ.get("HF_TOKEN", "").strip() and "HF_TOKEN" not in env:  # blank: unset, like empty
        if _BREAKS_ENV_FILE.search(environ["HF_TOKEN"]):
            loc.sub("secrets").fail(_BROKEN_SECRET.format(name="HF_TOKEN"))
        secrets.append(Secret("HF_TOKEN", environ["HF_TOKEN"]))
    return secrets, secret_locs


def _listed_secret(name: str, before: list[str], item_loc: _Loc, environ: Mapping[str, str]) -> Secret:
    """A name listed under cluster.secrets (after the names `before` it), with its value from environ."""
    why = SR.name_problem(name)
    if why:
        item_loc.fail(why)
    if name in before:
        item_loc.fail(f"{name} is listed twice")
    if name not in environ and isinstance(environ, _Offline):
        return Secret(name, "")  # offline plan: shown by name only
    if name not in environ:
        item_loc.fail(f"{name} is not set in your environment")
    if not environ[name]:
        item_loc.fail(f"{name} is set but empty in your environment")
    if not environ[name].strip():
        item_loc.fail(f"{name} is set but blank in your environment (only whitespace)")
    if _BREAKS_ENV_FILE.search(environ[name]):
        item_loc.fail(_BROKEN_SECRET.format(name=name))
    return Secret(name, environ[name])


def _check_mirror_and_standby(values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc) -> None:
    """The mirror serves a cold `up` whose nodes pull (bootstrap.cluster.image.distribute): an image
    named for it does nothing when this machine streams the image or the image is pinned by digest.
    With peer_copy: false it is kept for a run that turns peer_copy on (the sandbox's inventory)."""
    if values.get("image_mirror"):
        if values.get("load_image"):
            locs["image_mirror"].fail(f"does nothing with {loc.field}.load_image: true (this machine streams the "
                                      "image, no node pulls); remove it or set it to false")
        if "@" in values.get("image", ""):
            locs["image_mirror"].fail(f"does nothing with an image pinned by digest ({loc.field}.image: the mirror "
                                      "cannot tag it back under that name, so the head pulls it and copies it to the "
                                      "others); remove it or set it to false")
    if "standby" in values and values.get("replicas", 1) == 1:
        locs["standby"].fail(f"does nothing with {loc.field}.replicas: 1 (standby serve containers stand beside "
                             "a fleet's replicas); remove it or set replicas")


def _secret_roles(cluster: Any, rloc: _Loc, router: Router, secrets: list[Secret],
                  secret_locs: dict[str, _Loc]) -> None:
    """secretrules.check_roles, told where cluster.router.api_key, .vip.secret and VLLM_API_KEY are."""
    raw = _raw(cluster, "router")
    vip = _raw(raw, "vip")
    vloc = rloc.key(raw, "vip") if vip is not None else rloc.sub("vip")
    where = {"api_key": rloc.key(raw, "api_key"), "vip.secret": vloc.key(vip, "secret")}
    if SR.API_KEY_ENV in secret_locs:
        where[SR.API_KEY_ENV] = secret_locs[SR.API_KEY_ENV]
    SR.check_roles(router, secrets, where)


#: A secret's value goes into a container's env file, one NAME=value per line: a newline or CR would
#: end it and start another variable, a NUL would cut it.
_BREAKS_ENV_FILE = re.compile(r"[\n\r\x00]")
_BROKEN_SECRET = ("{name} in your environment contains a newline, carriage return or NUL: it would not reach the "
                  "containers whole (and a newline would add a variable); fix the value (its value is never shown)")

_SECRET_IN_ENV = (
    "{name} is a secret (cluster.secrets): its value comes from your environment,"
    " not from the inventory"
)


def _raw(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None
