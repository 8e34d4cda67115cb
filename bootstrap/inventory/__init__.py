"""Load an inventory file (native or Ansible YAML) into a validated `bootstrap.model.Inventory`.

Every problem is an `InventoryError` naming the file, the 1-based line and the field path
(``hosts[2].ip``, ``cluster.ports.vllm``), on one printable line. Pure: reads the inventory (and,
with check_files, stats the local ssh key / known_hosts and reads the key's first bytes); no
network, no SSH, no DNS.

The work is bounded whatever the file holds: only a regular file of at most `_MAX_FILE_BYTES` is
read, the YAML parser stops after `_MAX_NODES` values, merge keys and Ansible groups repeated
through aliases are counted as they are expanded, and at most `_MAX_HOSTS` hosts are accepted.

The shape of the file is checked by small tables (field -> validator); the rules that span fields
(defaults, one head, uniform GPUs, unique names/addresses/IPs, secrets) are in `_build_hosts` and
`_cluster`. Both formats are turned into the same `_HostSpec`s, so they are validated alike.

The modules, lowest first: `yamlfile` (reading the file, YAML with locations, the messages),
`values` (the validators of single values), `addresses` and `envvars` (hosts' addresses, environment
variables and credentials), `portfields`, `hostfields`, `routerfields` and `monitorfields` (their
field tables and rules), `fields` (the cluster's table and `_cluster`), `native` and `ansible` (the
two formats); this one holds `load_inventory` and the rules across hosts.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import stat
from dataclasses import replace
from typing import Any, Mapping

from bootstrap.errors import InventoryError, InventoryErrors
from bootstrap.inventory import secretrules as SR
from bootstrap.inventory import values as V
from bootstrap.inventory.addresses import _IP, _canonical_ip, _ip, _not_one_host, _parse_ip
from bootstrap.inventory.ansible import _ansible
from bootstrap.inventory.fields import _SECRET_IN_ENV, _Offline, _SSHDefaults
from bootstrap.inventory.hostfields import _HostSpec
from bootstrap.inventory.modelfields import place
from bootstrap.inventory.native import _native
from bootstrap.inventory.portfields import _check_ssh_port
from bootstrap.inventory.yamlfile import _MAX_FILE_BYTES as _MAX_FILE_BYTES  # re-exported: tests read it
from bootstrap.inventory.yamlfile import _describe, _Loc, _open_nonblocking, _quote, _read_yaml
from bootstrap.model import IDLE, Cluster, Host, Inventory, SSHTarget, Vip, idle_setting

__all__ = ["load_inventory"]


def load_inventory(
    path: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
    *,
    check_files: bool = True,
    require_secrets: bool = True,
    collect: bool = False,
) -> Inventory:
    """Read and validate an inventory.

    environ supplies the values of `cluster.secrets` (default: os.environ). check_files=False skips
    the checks of local files (ssh keys, known_hosts), e.g. for `bootstrap plan` on a laptop, and
    with it or require_secrets=False, listed secrets may be unset (nothing will receive them).
    Raises InventoryError for every problem; with collect=True (`validate`) every key of every table is
    checked and all their errors come at once as InventoryErrors, in the order of the file (the rules
    across fields run only when every field is right: judged on a field left out, they would mislead; a
    secret unset here or a key file missing here leaves no field out, so those never hide another error).
    """
    if not collect:
        return _load(path, environ, check_files, require_secrets)
    found: list[InventoryError] = []
    alone: list[InventoryError] = []
    token, token_alone = V.FOUND.set(found), V.ALONE.set(alone)
    try:
        return _load(path, environ, check_files, require_secrets)
    except Exception as exc:  # noqa: BLE001 -- after a field error, what fails next may follow from it
        if isinstance(exc, InventoryError) and found and len(alone) == len(found):
            found.append(exc)  # only secrets and key files failed before it (values.gathered): it stands
        elif not found:
            raise
    finally:
        V.FOUND.reset(token)
        V.ALONE.reset(token_alone)
        if found:
            raise InventoryErrors(sorted(found, key=lambda e: (e.line is None, e.line or 0)))
    raise AssertionError("unreachable")  # pragma: no cover


def _load(path, environ, check_files: bool, require_secrets: bool) -> Inventory:
    file = os.fsdecode(os.fspath(path))
    env = os.environ if environ is None else environ
    if not check_files or not require_secrets:
        env = _Offline(env)
    root, root_line = _read_yaml(file)
    top = _Loc(file, None, root_line)
    if root is None:
        top.at(line=None).fail(
            "the file is empty: expected a 'hosts:' list (or an Ansible 'all:' group)"
        )
    if not isinstance(root, dict):
        top.fail(
            f"expected a mapping with 'cluster:' and 'hosts:' at the top, got {_describe(root)}"
        )
    for key in root:
        if not isinstance(key, str):
            top.keyname(root, key).fail(f"keys must be strings, got {_describe(key)}")
    read = _ansible if "all" in root else _native
    (cluster, facts), ssh_defaults, specs = read(root, top, env)
    models, model_locs, models_loc = facts["models"]
    placement: list[int] = []
    if models:
        SR.check_model_keys(models, model_locs, cluster.router, cluster.secrets)
        routing = {m.policy or cluster.router.policy for m in models}
        for name, at in facts["router_setting_locs"].items():
            why = idle_setting(name, routing)
            if why is not None:
                at.fail(why)
        _identities(specs, ssh_defaults)
        groups, placement = _placed(specs, models, model_locs, models_loc)
        cluster = replace(cluster, replicas=len(groups))
        facts["groups"] = groups
    hosts = _build_hosts(specs, (cluster, facts), ssh_defaults, check_files)
    if check_files and ssh_defaults.known_hosts_loc and cluster.ssh.known_hosts is not None:
        with V.gathered():
            _check_file(cluster.ssh.known_hosts, ssh_defaults.known_hosts_loc, private=False)
    return Inventory(path=file, cluster=cluster, hosts=hosts, models=models, placement=tuple(placement))


def _placed(specs: list[_HostSpec], models, model_locs, models_loc) -> tuple[list[list[_HostSpec]], list[int]]:
    """The pool's replica groups from models: (modelfields.place); a host's own replica is refused."""
    for s in specs:
        if s.given("replica"):
            s.where("replica").fail("is set by models: (each model's replicas take their hosts); remove it, or "
                                    "pin the host in a model's hosts")
    groups, model_of = place(models, model_locs, [s.values["name"] for s in specs], [s.loc for s in specs],
                             models_loc)
    return [[specs[i] for i in g] for g in groups], model_of


# --------------------------------------------------------------------------------------------
# Hosts

_REQUIRED = {
    "name": "a unique name for this host",
    "address": "the host name, IP address or ssh config alias SSH connects to",
}
_ZERO_GPUS = "must be at least 1 with accelerator gpu (use accelerator: none for CPU-only nodes)"


def _build_hosts(
    specs: list[_HostSpec],
    cluster_and_facts: tuple[Cluster, dict[str, Any]],
    defaults: _SSHDefaults,
    check_files: bool,
) -> tuple[Host, ...]:
    cluster, facts = cluster_and_facts
    groups = facts.get("groups")
    if groups is None:
        _identities(specs, defaults)
        groups = _groups(specs, cluster.replicas, facts["replicas_loc"])
    heads = {id(_head(g, f" of replica {k}" if len(groups) > 1 else "")) for k, g in enumerate(groups)}
    group_of = {id(s): k for k, g in enumerate(groups) for s in g}
    gpus = _gpus(specs, cluster, facts)
    router_loc = facts["router_host_loc"]
    names = {s.values["name"] for s in specs}
    for name in (cluster.router.host,) if cluster.router.host else cluster.router.hosts:
        if router_loc is not None and name not in names:
            router_loc.fail(f"{_quote(name)} is not a host of this inventory")
    if cluster.router.vip is not None:
        by_name = {s.values["name"]: s for s in specs}
        routers = ([by_name[n] for n in cluster.router.hosts] if cluster.router.hosts
                   else [_head(g) for g in groups[:2]])
        _check_vip(cluster.router.vip, specs, routers, facts["vip_loc"])
    monitor_loc = facts["monitor_host_loc"]
    if monitor_loc is not None and cluster.monitor.host not in {s.values["name"] for s in specs}:
        monitor_loc.fail(f"{_quote(cluster.monitor.host)} is not a host of this inventory")
    keys_checked: set[str] = set()
    hosts = []
    for spec, n_gpus in zip(specs, gpus):
        ssh = {
            opt: spec.values[opt] if spec.given(opt) else defaults.values.get(opt)
            for opt in ("user", "port", "key", "jump", "become_password")
        }
        if ssh["port"] is not None:
            _check_ssh_port(ssh["port"], cluster, spec.where("port") if spec.given("port") else defaults.locs["port"])
        if check_files and ssh["key"] is not None and ssh["key"] not in keys_checked:
            keys_checked.add(ssh["key"])
            where = spec.where("key") if spec.given("key") else defaults.locs["key"]
            with V.gathered():  # validate: every missing key file named, and the file's other errors too
                _check_file(ssh["key"], where, private=True)
        env = dict(facts["env"])
        for env_name, (env_value, env_loc) in (spec.values.get("env") or {}).items():
            if env_name in facts["secret_names"]:
                env_loc.fail(_SECRET_IN_ENV.format(name=env_name))
            env[env_name] = env_value
        hosts.append(
            Host(
                name=spec.values["name"],
                ssh=SSHTarget(address=spec.values["address"], **ssh),
                ip=spec.values["ip"],
                role="head" if id(spec) in heads else "worker",
                gpus=n_gpus,
                env=tuple(sorted(env.items())),
                replica=group_of.get(id(spec), IDLE),
            )
        )
    return tuple(hosts)


def _check_vip(vip: Vip, specs: list[_HostSpec], routers: list[_HostSpec], loc: _Loc) -> None:
    """The floating address is no host's ip or SSH address, of the router hosts' family, and with a
    prefix length on their network (their ips inside it); without one, preflight checks it against
    the networks the hosts' facts give (bootstrap.fleet.plan.vip_network_problem)."""
    address = ipaddress.IPv4Address(vip.address)
    for s in specs:
        ssh = _parse_ip(s.values["address"])
        for what, ip in (("ip", ipaddress.ip_address(s.values["ip"])), ("SSH address", ssh)):
            if ip is not None and _canonical_ip(ip) == address:
                loc.fail(f"{vip.address} is the {what} of {s.values['name']}: the floating address must be one no "
                         "host has")
    net = ipaddress.IPv4Network(f"{vip.address}/{vip.prefix}", strict=False)
    for s in routers:
        name, ip = s.values["name"], _canonical_ip(ipaddress.ip_address(s.values["ip"]))
        if ip.version != 4:
            loc.fail(f"{vip.address} is an IPv4 address and router host {name}'s ip {ip} is IPv6: keepalived and "
                     "the forwarding to its router would not work; give the router hosts' IPv4 data-plane ips")
        if vip.prefix < 32 and ip not in net:
            loc.fail(f"{vip.address}/{vip.prefix} is not on router host {name}'s network: its ip {ip} is outside "
                     f"{net}; give a free address of the router hosts' network, with that network's prefix length")


def _jump_target(jump: str) -> tuple[str, int]:
    """A jump host `[user@]host[:port]` (host possibly `[IPv6]`) as (host lowercased, port)."""
    hostport = jump.rsplit("@", 1)[-1]
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    else:
        host, port = hostport, ""
    ip = _parse_ip(host)
    return (str(_canonical_ip(ip)) if ip else host.lower(), int(port) if port.isdigit() and len(port) <= 5 else 22)


def _identities(specs: list[_HostSpec], defaults: _SSHDefaults) -> None:
    """Names, SSH targets (address and port) and data-plane IPs are unique; sets values["ip"]."""
    names: dict[str, str] = {}  # lowercase name -> where it was first given
    names_as_given: set[str] = set()
    targets: dict[tuple[Any, int], str] = {}
    ips: dict[_IP, str] = {}  # canonical: ::ffff:10.0.0.1 is 10.0.0.1, 2001:0db8::1 is 2001:db8::1
    for spec in specs:
        for required, what in _REQUIRED.items():
            if not spec.given(required):
                spec.where(required).fail(f"required: {what}")
        name, address = spec.values["name"], spec.values["address"]
        if name.lower() in names:
            # names end up in container names, labels, file names and hosts' DNS, where case may not count
            same = "is already" if name in names_as_given else "differs only in case from"
            spec.where("name").fail(f"{_quote(name)} {same} the name of {names[name.lower()]}")
        names[name.lower()] = spec.loc.field or name
        names_as_given.add(name)
        port = spec.values.get("port") or defaults.values.get("port") or 22
        address_ip = _parse_ip(address)
        target = (_canonical_ip(address_ip) if address_ip else address.lower(), port)
        if target in targets:
            spec.where("address").fail(
                f"{address} (port {port}) is already the address of {targets[target]}"
            )
        targets[target] = name
        jump = spec.values.get("jump") or defaults.values.get("jump")
        if jump and _jump_target(jump) == (str(target[0]), port):
            spec.where("jump" if spec.given("jump") else "address").fail(
                f"{address} would jump through itself ({_quote(jump)}): give a bastion other than the host")
        if spec.given("ip"):
            ip = spec.values["ip"]
        elif address_ip is not None:
            ip = _ip(address, spec.where("ip").at(line=spec.where("address").line))
        else:
            spec.where("ip").fail(f"required because address {_quote(address)} is not an IP")
        why = _not_one_host(address_ip) if address_ip is not None else None
        if why:
            spec.where("address").fail(f"{address} is {why}; give the address SSH reaches this host on")
        key = _canonical_ip(ipaddress.ip_address(ip))
        if key in ips:
            spec.where("ip").fail(f"{ip} is already the ip of {ips[key]}")
        ips[key] = name
        spec.values["ip"] = ip


def _groups(specs: list[_HostSpec], replicas: int, loc: _Loc | None) -> list[list[_HostSpec]]:
    """The hosts split into `replicas` serving groups: a host's `replica` pins it, the others fill
    the groups in order, to equal sizes. When every host is pinned the groups may differ in size
    (say a one-node prefill replica and a two-node decode one): each is its own split."""
    n = len(specs)
    pinned = [s for s in specs if s.values.get("replica") is not None]
    if replicas == 1 and not pinned:
        return [list(specs)]
    where = loc or specs[0].loc.at(field="cluster.replicas")
    if replicas > n:
        where.fail(f"{replicas} replicas need at least {replicas} hosts; the inventory lists {n}")
    if len(pinned) == n:
        return _pinned_groups(specs, replicas, where)
    if n % replicas:
        where.fail(f"{replicas} replicas do not divide {n} hosts into equal groups"
                   f" (each replica is a full serving group: give {replicas} x k hosts, or set every host's"
                   f" `replica` for groups of different sizes)")
    size = n // replicas
    groups: list[list[_HostSpec]] = [[] for _ in range(replicas)]
    for s in pinned:
        k = _replica_of(s, replicas)
        if len(groups[k]) == size:
            s.where("replica").fail(f"replica {k} already has {size} hosts: with {n} hosts and {replicas}"
                                    f" replicas every replica has {size} (set every host's `replica` for"
                                    f" groups of different sizes)")
        groups[k].append(s)
    free = iter(s for s in specs if s.values.get("replica") is None)
    for g in groups:
        while len(g) < size:
            g.append(next(free))
    order = {id(s): i for i, s in enumerate(specs)}
    return [sorted(g, key=lambda s: order[id(s)]) for g in groups]


def _replica_of(s: _HostSpec, replicas: int) -> int:
    k = s.values["replica"]
    if k >= replicas:
        s.where("replica").fail(f"{k} is not a replica of this cluster: replicas are numbered 0 to"
                                f" {replicas - 1} (cluster.replicas: {replicas})")
    return k


def _pinned_groups(specs: list[_HostSpec], replicas: int, where: _Loc) -> list[list[_HostSpec]]:
    """Every host pinned: each group is the hosts that name it, at least one each, any size."""
    groups: list[list[_HostSpec]] = [[] for _ in range(replicas)]
    for s in specs:
        groups[_replica_of(s, replicas)].append(s)
    empty = [k for k, g in enumerate(groups) if not g]
    if empty:
        where.fail(f"replica {empty[0]} has no host: every host names its replica, and none names {empty[0]}"
                   f" (give it a host, or set cluster.replicas: {replicas - len(empty)} and renumber)")
    return groups


def _head(specs: list[_HostSpec], of: str = "") -> _HostSpec:
    """Exactly one head: the host that says so, else the first host not marked worker."""
    heads = [s for s in specs if s.values.get("role") == "head"]
    if len(heads) > 1:
        heads[1].where("role").fail(
            f"{heads[1].values['name']} is a second head ({heads[0].values['name']} is the head);"
            f" exactly one host may be the head{of}"
        )
    if heads:
        return heads[0]
    for spec in specs:
        if spec.values.get("role") is None:
            return spec
    specs[0].where("role").fail(f"every host{of} is a worker; make one host role: head")


def _gpus(specs: list[_HostSpec], cluster: Cluster, facts: dict[str, Any]) -> list[int | None]:
    """Each host's GPU count: None with accelerator none, else >= 1 and equal on every host."""
    per_node, per_node_loc = facts["gpus_per_node"]
    if cluster.accelerator == "none":
        if per_node:
            per_node_loc.fail(f"must be absent or 0 with accelerator none, got {per_node}")
        for spec in specs:
            if spec.values.get("gpus"):
                spec.where("gpus").fail(
                    f"must be absent or 0 with accelerator none, got {spec.values['gpus']}"
                )
        return [None] * len(specs)
    if per_node == 0:
        per_node_loc.fail(_ZERO_GPUS)
    reference = (per_node, per_node_loc.field) if per_node else None
    out = []
    for spec in specs:
        n = spec.values.get("gpus")
        if n is None and per_node is None:
            spec.where("gpus").fail(
                "required with accelerator gpu: set the host's gpus or cluster gpus_per_node"
            )
        n = per_node if n is None else n
        if n == 0:
            spec.where("gpus").fail(_ZERO_GPUS)
        if reference is None:
            reference = (n, spec.values["name"])
        elif n != reference[0]:
            spec.where("gpus").fail(
                f"{n} differs from {reference[0]} on {reference[1]}: the cluster must be uniform"
            )
        out.append(n)
    return out


def _check_file(path: str, loc: _Loc, *, private: bool) -> None:
    """A local file (ssh key, known_hosts) exists; a private key is one (not empty, not the public
    key) and is not open to others."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        loc.fail(f"{path}: no such file")
    except OSError as e:
        loc.fail(f"{path}: cannot be read: {e.strerror or e}")
    if not stat.S_ISREG(st.st_mode):
        loc.fail(f"{path} is not a file")
    if not os.access(path, os.R_OK):
        loc.fail(f"{path} is not readable by you")
    if private:
        _check_private_key(path, loc)
    mode = stat.S_IMODE(st.st_mode)
    if private and mode & 0o077:
        what = "readable" if mode & 0o044 else "accessible"
        loc.fail(
            f"{path} is {what} by others (mode {mode:04o}): run chmod 600 {shlex.quote(path)}"
        )


#: How public keys start: OpenSSH's one-line form (id_ed25519.pub, authorized_keys) and PEM/RFC 4716.
_PUBLIC_KEY = re.compile(
    rb"(?:(?:ssh|sk-ssh|ecdsa-sha2|sk-ecdsa-sha2)-[A-Za-z0-9@.-]+\s+AAAA"
    rb"|-----BEGIN (?:RSA |EC )?PUBLIC KEY-----|---- BEGIN SSH2 PUBLIC KEY ----)"
)


def _check_private_key(path: str, loc: _Loc) -> None:
    """The key file is not empty and not a public key (its first bytes are read, never shown)."""
    try:
        with open(path, "rb", opener=_open_nonblocking) as f:
            head = f.read(4096).lstrip()
    except OSError as e:
        loc.fail(f"{path}: cannot be read: {e.strerror or e}")
    if not head:
        loc.fail(f"{path} is empty: expected an SSH private key")
    if _PUBLIC_KEY.match(head):
        hint = f" ({path[:-4]}?)" if path.endswith(".pub") else ""
        loc.fail(f"{path} is a public key: give the private key{hint}")
