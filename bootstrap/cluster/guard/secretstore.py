"""Where secrets live on a host and how a container gets them (pure: paths, argv, scripts).

A secret (cluster.secrets, and VLLM_API_KEY when cluster.router.api_key names one) is never given
to Docker as a value: `docker run -e`/`--env-file` would keep it in the container's config
(`docker inspect`, /var/lib/docker/containers/*/config.v2.json) for as long as the container exists.
Instead each value is a file on the host's /run, a tmpfs (`/run/bootstrap/<cluster>/<set>/<NAME>`,
0400, root's, in 0700 directories), written over SSH stdin. Each kind of container holds exactly the
secrets it uses (KINDS: one table, which the plan mounts the sets from and docs/security.md shows):
a set per kind, a directory on the host. A container gets its set's directory bind-mounted read-only
at /run/bootstrap/secrets, and its entrypoint is `sh -c ENTRY` that exports the names it needs into
the environment and execs the real command. ENTRY refuses to start without one: /run is emptied by
a reboot (Docker then mounts an empty directory it makes in its place), and a container restarted
then says so in its log and which command puts the secrets back. `docker exec` does not see PID 1's
environment, so the checks and `vllm serve` that bootstrap runs with `docker exec` read the files the
same way first (containers.LOAD_SECRETS).
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

from bootstrap.cluster.guard.rootsh import root_sh
from bootstrap.containers import SECRETS_ENTRY, SECRETS_IN_CONTAINER
from bootstrap.model import Host, Inventory, ServedModel

#: The host directory of a cluster's secrets (on /run: a tmpfs on every systemd host).
HOST_ROOT = "/run/bootstrap"
#: Where a container finds the secrets mounted into it.
IN_CONTAINER = SECRETS_IN_CONTAINER
#: The variable vLLM reads its API key from (cluster.router.api_key names the secret holding it).
API_KEY_ENV = "VLLM_API_KEY"
#: A pool router's map of every model's (and adapter's) name to the API key its replicas ask for, as
#: JSON: the router's probe sends each model's own (models[].api_key) through the router.
MODEL_KEYS_ENV = "BOOTSTRAP_MODEL_KEYS"
#: Exit status of a container whose secret file is gone (EX_CONFIG).
MISSING_EXIT = 78
#: Filesystems /run may be for a secret to stay in memory.
MEMORY_FS = ("tmpfs", "ramfs")


#: The sets of secrets on a host: each a directory, mounted whole into the containers that use it.
NODE, SERVE, ROUTER, VIP = "node", "serve", "router", "vip"

#: The roles a secret plays (role_of), each exposed differently: the workload's (cluster.secrets:
#: the processes of the serving containers), the API key (VLLM_API_KEY: held by every client, printed
#: in `serve`'s curl hint, sent on every request), VRRP's password (cluster.router.vip.secret: sent
#: in clear in every VRRPv2 advert).
WORKLOAD, API_KEY, VRRP = "workload", "api-key", "vrrp"

#: The one table of who holds what: kind of container -> (its set, the roles of the secrets it
#: uses). The plan mounts each kind's set from it (kind_names), `up` writes the sets from it (files),
#: a sandbox test reads every running container against it and docs/security.md shows it.
KINDS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    # the node container of a cluster of one replica: Ray, and vLLM (`serve` runs it with docker exec)
    "node+vllm": (SERVE, (WORKLOAD, API_KEY)),
    # a fleet's node container: Ray and its tasks (vLLM runs in the serve containers)
    "node": (NODE, (WORKLOAD,)),
    "serve": (SERVE, (WORKLOAD, API_KEY)),
    "standby": (SERVE, (WORKLOAD, API_KEY)),
    # vllm-router: the keys for bootstrap's probes (it passes each client's header on); a pool's
    # router holds every model's (MODEL_KEYS_ENV), the serve containers only their own model's
    "router": (ROUTER, (API_KEY,)),
    "keepalived": (VIP, (VRRP,)),
    # the image mirror, the keeper, Prometheus and the exporters
    "mirror": (None, ()),
    "keeper": (None, ()),
    "monitor": (None, ()),
}


#: KINDS and the roles in words (docs/security.md's table: markdown).
_KIND_TEXT = {"node+vllm": "node container, `cluster.replicas: 1` (Ray; `serve` runs vLLM in it)",
              "node": "node container of a fleet (Ray and its tasks)", "serve": "serve container (vLLM)",
              "standby": "standby serve container", "router": "vllm-router", "keepalived": "keepalived (`vip`)",
              "mirror": "image mirror (during `up`)", "keeper": "keeper", "monitor": "Prometheus and the exporters"}
_ROLE_TEXT = {WORKLOAD: "the workload's (`cluster.secrets`, HF_TOKEN among them, but the API key's and VRRP's)",
              API_KEY: "the API key, as `VLLM_API_KEY` (in a pool, a serve container its own model's: "
                       "`models[].api_key`, else `cluster.router.api_key`'s; the router every model's, as "
                       "`BOOTSTRAP_MODEL_KEYS`)",
              VRRP: "VRRP's password (`cluster.router.vip.secret`)"}


def markdown() -> str:
    """docs/security.md's table of what each secret reaches, from KINDS (docs/hooks.py)."""
    rows = ["| Container | Its set on the host | The secrets it holds |", "|---|---|---|"]
    for kind, (which, uses) in KINDS.items():
        where = f"`{HOST_ROOT}/<cluster>/{which}`" if which else "none"
        rows.append(f"| {_KIND_TEXT[kind]} | {where} | {'; '.join(_ROLE_TEXT[r] for r in uses) or 'none'} |")
    return "\n".join(rows)


def host_dir(cluster_name: str) -> str:
    return f"{HOST_ROOT}/{cluster_name}"


def in_fleet(inv: Inventory) -> bool:
    """A fleet's inventory, or one replica group's (fleet.plan.replica_inventory: replicas 1, and the
    fleet's endpoint to fence)."""
    return inv.cluster.replicas > 1 or inv.cluster.fence_endpoint is not None


def node_kind(inv: Inventory) -> str:
    return "node" if in_fleet(inv) else "node+vllm"


def kinds(inv: Inventory) -> tuple[str, ...]:
    """The kinds of container of this inventory that may hold secrets."""
    if not in_fleet(inv):
        return ("node+vllm",)
    return ("node", "serve", "standby", "router", *(("keepalived",) if inv.cluster.router.vip else ()))


def model_key_names(inv: Inventory) -> frozenset[str]:
    """The secrets models[].api_key names (each a model's own API key)."""
    return frozenset(m.api_key for m in inv.models if m.api_key is not None)


def role_of(inv: Inventory, name: str) -> str:
    """The role of the secret `name`: VRRP's password, an API key (VLLM_API_KEY, the secret
    cluster.router.api_key names, or one a model's api_key names) or the workload's."""
    r = inv.cluster.router
    if r.vip is not None and name == r.vip.secret:
        return VRRP
    return API_KEY if name in (API_KEY_ENV, r.api_key) or name in model_key_names(inv) else WORKLOAD


def kind_names(inv: Inventory, kind: str, host: Host | None = None) -> tuple[str, ...]:
    """The variables a container of `kind` (on `host`: a pool's serve containers get their model's
    key) gets (KINDS): the secrets of its roles, the API key under vLLM's name (VLLM_API_KEY) whichever
    secret holds it, and a pool router every model's (MODEL_KEYS_ENV)."""
    uses = KINDS[kind][1]
    out = [s.name for s in inv.cluster.secrets if role_of(inv, s.name) in uses and role_of(inv, s.name) != API_KEY]
    if API_KEY in uses and API_KEY_ENV in values(inv, host):
        out.append(API_KEY_ENV)
    if kind == "router" and model_key_names(inv):
        out.append(MODEL_KEYS_ENV)
    return tuple(out)


#: the kinds of container that serve one model of a pool: they get that model's key
_PER_MODEL = ("serve", "standby")


def files(inv: Inventory, host: Host | None = None) -> dict[str, str]:
    """What a host holds (None: any host of a cluster without models' own keys): `set/NAME` -> value,
    each kind's set (KINDS) with the secrets it uses; empty without secrets."""
    out = {}
    for k in kinds(inv):
        mine = host if k in _PER_MODEL else None  # the router's VLLM_API_KEY stays the pool's
        vals = values(inv, mine)
        out.update({f"{KINDS[k][0]}/{n}": vals[n] for n in kind_names(inv, k, mine) if n in vals})
    return out


def _secret(inv: Inventory, name: str | None) -> str | None:
    return next((x.reveal() for x in inv.cluster.secrets if x.name == name), None) if name else None


def model_key(inv: Inventory, model: ServedModel | None) -> str | None:
    """The API key a model's replicas ask for: its own (models[].api_key), else the pool's
    (cluster.router.api_key), else None."""
    own = _secret(inv, model.api_key) if model is not None else None
    return own if own is not None else _secret(inv, inv.cluster.router.api_key)


def host_model(inv: Inventory, host: Host | None) -> ServedModel | None:
    """The model a pool's host serves (None: no pool, an idle host, or no host)."""
    if host is None or not inv.models or host.replica < 0 or host.replica >= len(inv.placement):
        return None
    return inv.model_of(host.replica)


def model_keys(inv: Inventory) -> dict[str, str]:
    """Every name a pool's router routes (each model's and its adapters') -> the API key its replicas
    ask for (the models without one left out)."""
    out = {}
    for m in inv.models:
        key = model_key(inv, m)
        if key is not None:
            out.update({name: key for name in (m.name, *(a for a, _ in m.adapters))})
    return out


def values(inv: Inventory, host: Host | None = None) -> dict[str, str]:
    """Every secret a container of this cluster (on `host`) may be given, by variable name:
    cluster.secrets, VLLM_API_KEY holding the key of the model the host serves (its own, or the pool's
    cluster.router.api_key names), and a pool's MODEL_KEYS_ENV where models have keys of their own."""
    out = {x.name: x.reveal() for x in inv.cluster.secrets}
    own = host_model(inv, host)
    key = model_key(inv, own) if own is not None else _secret(inv, inv.cluster.router.api_key)
    if key is not None:
        out[API_KEY_ENV] = key
    if model_key_names(inv):
        out[MODEL_KEYS_ENV] = json.dumps(model_keys(inv), sort_keys=True)
    return out


def router_names(inv: Inventory) -> tuple[str, ...]:
    """The router gets only the API key (its probe sends it; the router passes each client's header on)."""
    return kind_names(inv, "router")


def vip_names(inv: Inventory) -> tuple[str, ...]:
    """keepalived gets only VRRP's password (cluster.router.vip.secret), if one is set."""
    return kind_names(inv, "keepalived")


def mounts(cluster_name: str, names: Sequence[str], which: str = SERVE) -> tuple[str, ...]:
    """`-v HOST/SET:/run/bootstrap/secrets:ro` for a container that gets secrets (none: nothing)."""
    return ("-v", f"{host_dir(cluster_name)}/{which}:{IN_CONTAINER}:ro") if names else ()


def entry_script(where: str = IN_CONTAINER) -> str:
    """ENTRY reading the secrets from `where` (IN_CONTAINER but in tests)."""
    return ('while [ "$#" -gt 0 ] && [ "$1" != -- ]; do f="' + where + '/$1"; '
            'if [ ! -f "$f" ]; then echo "bootstrap: the secret $1 is not on this host (' + HOST_ROOT + ' is on a '
            'tmpfs: a reboot empties it): run bootstrap up (and bootstrap serve) again to put it back" >&2; exit '
            + str(MISSING_EXIT) + '; fi; export "$1=$(cat "$f")"; shift; done; shift; exec "$@"')


#: The entrypoint script of a container with secrets: `sh -c ENTRY bootstrap-secrets NAME... -- CMD...`.
ENTRY = entry_script()


def entry_argv(names: Sequence[str], entrypoint: str, command: Sequence[str],
               script: str = ENTRY) -> tuple[str, tuple[str, ...]]:
    """(entrypoint, command) of a container that gets `names`: ENTRY exports them, then execs
    ENTRYPOINT COMMAND...; unchanged without secrets."""
    if not names:
        return entrypoint, tuple(command)
    return "sh", ("-c", script, SECRETS_ENTRY, *names, "--", entrypoint, *command)


# -- on the host (each one command; the values travel on stdin only) ----------------------------

# Both scripts run as root (the SSH layer's run_as_root: root as it is, else sudo).

# $1: the cluster's directory, $2: prune or add, $3: the root of ours it is in (its parent must be in memory)
_WRITE = (
    'm=$(dirname "$3"); fs=$(stat -f -c %T "$m" 2>/dev/null); case "$fs" in ' + "|".join(MEMORY_FS) + ') ;; '
    '*) echo "$m is not a tmpfs (it is ${fs:-unknown}): a secret there would rest on disk" >&2; exit 3;; esac; '
    'umask 077; mkdir -p "$1" && chmod 700 "$3" "$1" || exit 1; keep=" "; '
    'while IFS= read -r l; do n=${l%%=*}; case "$n" in [A-Za-z0-9_]*/[A-Za-z_]*) '
    'case "$n" in */*/*|*[!A-Za-z0-9_/]*) n=;; esac;; *) n=;; esac; '
    '[ -n "$n" ] || { echo "bootstrap: a line that is not SET/NAME=value" >&2; exit 4; }; '
    'd="$1/${n%/*}"; b=${n##*/}; '
    'mkdir -p "$d" && chmod 700 "$d" || exit 1; [ -d "$d/$b" ] && rm -rf "$d/$b"; '
    'printf %s "${l#*=}" > "$d/.$b.new" && chmod 400 "$d/.$b.new" && mv -f "$d/.$b.new" "$d/$b" || exit 1; '
    'keep="$keep$n "; done; [ "$2" = prune ] || exit 0; '
    'for f in "$1"/*; do case "${f##*/}" in ' + "|".join((NODE, SERVE, ROUTER, VIP)) + ') ;; '
    '*) rm -rf "$f";; esac; done; '
    'for f in "$1"/*/* "$1"/*/.*.new; do [ -e "$f" ] || continue; case "$keep" in *" ${f#"$1"/} "*) ;; '
    '*) rm -rf "$f";; esac; done'
)

# $1: the cluster's directory, $2: the root of ours (removed when it is left empty)
_REMOVE = '[ -e "$1" ] || exit 0; rm -rf "$1"; rmdir "$2" 2>/dev/null; true'


def write_argv(cluster_name: str, *, prune: bool, root: str = HOST_ROOT) -> tuple[str, ...]:
    """Put the `set/NAME=value` lines on stdin (write_body) in the host's secrets of this cluster: each a
    0400 file written whole then renamed; with `prune` (`up`, which owns them) the others removed
    (a fleet's `serve` adds: the node containers may mount secrets it was not given). Refuses
    (exit 3) where /run is not in memory. Run as root (run_as_root). `root`: HOST_ROOT but in tests."""
    return root_sh(_WRITE, f"{root}/{cluster_name}", "prune" if prune else "add", root)


def write_body(secrets: Mapping[str, str]) -> bytes:
    """The stdin of write_argv from files(): `set/NAME=value` lines (the values were checked: no
    newline, CR or NUL)."""
    return "".join(f"{k}={v}\n" for k, v in secrets.items()).encode()


def remove_argv(cluster_name: str, root: str = HOST_ROOT) -> tuple[str, ...]:
    """The host's secrets of this cluster gone (nothing there: nothing done)."""
    return root_sh(_REMOVE, f"{root}/{cluster_name}", root)


def refusal(root: bool, sudo: bool, run_fs: str | None, become_refused: str | None = None) -> tuple[str, str] | None:
    """(what, fix) when this host cannot keep the cluster's secrets in memory; None when it can."""
    if run_fs is not None and run_fs not in MEMORY_FS:
        return (f"/run is not a tmpfs (it is {run_fs}): the secrets (cluster.secrets) would rest on disk there",
                "mount a tmpfs on /run (every systemd host has one), or leave cluster.secrets empty")
    if not root and not sudo:
        return no_root("the secrets (cluster.secrets) are kept on /run, which is root's",
                       "leave cluster.secrets empty (unset HF_TOKEN: it is a secret by default when set)",
                       become_refused)
    return None


#: What the user can do where sudo asks for a password that was not given.
BECOME_FIX = "pass -K (bootstrap asks for the sudo password once) or set $BOOTSTRAP_BECOME_PASSWORD"


def no_root(what: str, instead: str, become_refused: str | None) -> tuple[str, str]:
    """(what, fix) where the SSH user is not root and sudo did not give root: the password given was refused
    (become_refused: sudo's line), or none was given and `sudo -n` asks for one (or sudo is not there)."""
    if become_refused is not None:
        return (f"sudo refused the become password ({become_refused}): {what}",
                "give the SSH user's own sudo password (-K asks for it; $BOOTSTRAP_BECOME_PASSWORD; a host's "
                f"ansible_become_password), or {instead}")
    return (f"the SSH user is not root and `sudo -n true` fails (sudo asks for a password, or is missing): {what}",
            f"{BECOME_FIX}, allow the SSH user passwordless sudo (docs/security.md), log in as root, or {instead}")
