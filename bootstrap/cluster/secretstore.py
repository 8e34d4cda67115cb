"""Where secrets live on a host and how a container gets them (pure: paths, argv, scripts).

A secret (cluster.secrets, and VLLM_API_KEY when cluster.router.api_key names one) is never given
to Docker as a value: `docker run -e`/`--env-file` would keep it in the container's config
(`docker inspect`, /var/lib/docker/containers/*/config.v2.json) for as long as the container exists.
Instead each value is a file on the host's /run, a tmpfs (`/run/bootstrap/<cluster>/<set>/<NAME>`,
0400, root's, in 0700 directories), written over SSH stdin. Two sets: `serve` (every secret, and the
API key under vLLM's name) for the node and serve containers, `router` (the API key only) for the
router. A container gets its set's directory bind-mounted read-only at /run/bootstrap/secrets, and
its entrypoint is `sh -c ENTRY` that exports the names it needs into the environment and execs the
real command. ENTRY refuses to start without one: /run is emptied by a reboot (Docker then mounts an
empty directory it makes in its place), and a container restarted then says so in its log and which
command puts the secrets back. `docker exec` does not see PID 1's environment, so the checks and `vllm serve` that
bootstrap runs with `docker exec` read the files the same way first (containers.LOAD_SECRETS).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from bootstrap.containers import SECRETS_ENTRY, SECRETS_IN_CONTAINER
from bootstrap.model import Inventory

#: The host directory of a cluster's secrets (on /run: a tmpfs on every systemd host).
HOST_ROOT = "/run/bootstrap"
#: Where a container finds the secrets mounted into it.
IN_CONTAINER = SECRETS_IN_CONTAINER
#: The variable vLLM reads its API key from (cluster.router.api_key names the secret holding it).
API_KEY_ENV = "VLLM_API_KEY"
#: Exit status of a container whose secret file is gone (EX_CONFIG).
MISSING_EXIT = 78
#: Filesystems /run may be for a secret to stay in memory.
MEMORY_FS = ("tmpfs", "ramfs")


#: The two sets of secrets on a host (each a directory, mounted whole into its containers).
SERVE, ROUTER, VIP = "serve", "router", "vip"


def host_dir(cluster_name: str) -> str:
    return f"{HOST_ROOT}/{cluster_name}"


def files(inv: Inventory) -> dict[str, str]:
    """What the hosts hold: `set/NAME` -> value (the serve set every secret and the API key, the
    router set the API key); empty without secrets."""
    vals = values(inv)
    out = {f"{SERVE}/{k}": v for k, v in vals.items()}
    if inv.cluster.router.api_key and API_KEY_ENV in vals:
        out[f"{ROUTER}/{API_KEY_ENV}"] = vals[API_KEY_ENV]
    for name in vip_names(inv):
        if name in vals:
            out[f"{VIP}/{name}"] = vals[name]
    return out


def values(inv: Inventory) -> dict[str, str]:
    """Every secret a container of this cluster may be given, by variable name: cluster.secrets,
    and VLLM_API_KEY holding the key cluster.router.api_key names."""
    out = {x.name: x.reveal() for x in inv.cluster.secrets}
    name = inv.cluster.router.api_key
    if name:
        key = next((x.reveal() for x in inv.cluster.secrets if x.name == name), None)
        if key is not None:
            out[API_KEY_ENV] = key
    return out


def serve_names(inv: Inventory, names: Sequence[str] = ()) -> tuple[str, ...]:
    """The variables a serve container gets: the secrets, and VLLM_API_KEY when cluster.router.api_key
    names one (vLLM then refuses /v1 requests without it)."""
    extra = (API_KEY_ENV,) if inv.cluster.router.api_key and API_KEY_ENV not in names else ()
    return (*names, *extra)


def router_names(inv: Inventory) -> tuple[str, ...]:
    """The router gets only the API key (its probe sends it; the router passes each client's header on)."""
    return (API_KEY_ENV,) if inv.cluster.router.api_key else ()


def vip_names(inv: Inventory) -> tuple[str, ...]:
    """keepalived gets only VRRP's password (cluster.router.vip.secret), if one is set."""
    vip = inv.cluster.router.vip
    return (vip.secret,) if vip is not None and vip.secret else ()


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

#: `sh -c _AS_ROOT sh SCRIPT ARGS...`: SCRIPT as root, by sudo -n where the SSH user is not root.
_AS_ROOT = ('s=$1; shift; if [ "$(id -u)" = 0 ]; then exec sh -c "$s" sh "$@"; '
            'elif sudo -n true >/dev/null 2>&1; then exec sudo -n sh -c "$s" sh "$@"; '
            'else echo "the SSH user is not root and sudo -n asks for a password: the secrets cannot be put on '
            '/run (root\'s)" >&2; exit 4; fi')

# $1: the cluster's directory, $2: prune or add, $3: the root of ours it is in (its parent must be in memory)
_WRITE = (
    'm=$(dirname "$3"); fs=$(stat -f -c %T "$m" 2>/dev/null); case "$fs" in ' + "|".join(MEMORY_FS) + ') ;; '
    '*) echo "$m is not a tmpfs (it is ${fs:-unknown}): a secret there would rest on disk" >&2; exit 3;; esac; '
    'umask 077; mkdir -p "$1" && chmod 700 "$3" "$1" || exit 1; keep=" "; '
    'while IFS= read -r l; do n=${l%%=*}; d="$1/${n%/*}"; b=${n##*/}; '
    'mkdir -p "$d" && chmod 700 "$d" || exit 1; [ -d "$d/$b" ] && rm -rf "$d/$b"; '
    'printf %s "${l#*=}" > "$d/.$b.new" && chmod 400 "$d/.$b.new" && mv -f "$d/.$b.new" "$d/$b" || exit 1; '
    'keep="$keep$n "; done; [ "$2" = prune ] || exit 0; '
    'for f in "$1"/*; do case "${f##*/}" in ' + SERVE + '|' + ROUTER + '|' + VIP + ') ;; *) rm -rf "$f";; esac; done; '
    'for f in "$1"/*/* "$1"/*/.*.new; do [ -e "$f" ] || continue; case "$keep" in *" ${f#"$1"/} "*) ;; '
    '*) rm -rf "$f";; esac; done'
)

# $1: the cluster's directory, $2: the root of ours (removed when it is left empty)
_REMOVE = '[ -e "$1" ] || exit 0; rm -rf "$1"; rmdir "$2" 2>/dev/null; true'
#: As root where we may; a user who may not never put anything there.
_REMOVE_AS = ('s=$1; shift; if [ "$(id -u)" = 0 ]; then exec sh -c "$s" sh "$@"; '
              'elif sudo -n true >/dev/null 2>&1; then exec sudo -n sh -c "$s" sh "$@"; fi; exit 0')


def write_argv(cluster_name: str, *, prune: bool, root: str = HOST_ROOT) -> tuple[str, ...]:
    """Put the `set/NAME=value` lines on stdin (write_body) in the host's secrets of this cluster: each a
    0400 file written whole then renamed; with `prune` (`up`, which owns them) the others removed
    (a fleet's `serve` adds: the node containers may mount secrets it was not given). Refuses
    (exit 3) where /run is not in memory, and (exit 4) without root or passwordless sudo. `root`:
    HOST_ROOT but in tests."""
    return ("sh", "-c", _AS_ROOT, "sh", _WRITE, f"{root}/{cluster_name}", "prune" if prune else "add", root)


def write_body(secrets: Mapping[str, str]) -> bytes:
    """The stdin of write_argv from files(): `set/NAME=value` lines (the values were checked: no
    newline, CR or NUL)."""
    return "".join(f"{k}={v}\n" for k, v in secrets.items()).encode()


def remove_argv(cluster_name: str, root: str = HOST_ROOT) -> tuple[str, ...]:
    """The host's secrets of this cluster gone (nothing there: nothing done)."""
    return ("sh", "-c", _REMOVE_AS, "sh", _REMOVE, f"{root}/{cluster_name}", root)


def refusal(root: bool, sudo: bool, run_fs: str | None) -> tuple[str, str] | None:
    """(what, fix) when this host cannot keep the cluster's secrets in memory; None when it can."""
    if run_fs is not None and run_fs not in MEMORY_FS:
        return (f"/run is not a tmpfs (it is {run_fs}): the secrets (cluster.secrets) would rest on disk there",
                "mount a tmpfs on /run (every systemd host has one), or leave cluster.secrets empty")
    if not root and not sudo:
        return ("the SSH user is not root and `sudo -n` asks for a password: the secrets (cluster.secrets) are "
                "kept on /run, which is root's",
                "allow the SSH user passwordless sudo, log in as root, or leave cluster.secrets empty "
                "(unset HF_TOKEN: it is a secret by default when set)")
    return None
