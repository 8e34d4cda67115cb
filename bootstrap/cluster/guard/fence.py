"""The fence and Ray's token: what keeps strangers off the cluster's ports (pure; no I/O).

Most of what a cluster listens on cannot be bound to the data-plane IP (measured on Ray 2.60:
the GCS, the raylet's two ports, the dashboard agent's gRPC and metrics ports and the head's
autoscaler and dashboard metrics listen on 0.0.0.0 whatever --node-ip-address says; torch's
rendezvous in vLLM's native multi-node mode listens on every interface; docs/security.md has the
table). With `--network host` those are the host's ports, on every interface it has.

So `up` puts a fence on every host: an nftables table of ours (``inet bootstrap_<cluster>``, one
base chain on the input hook) that rejects new TCP connections to the cluster's ports unless they
come from a member (any host of the inventory, by data-plane IP and SSH address), from the
controller (the address the host sees our SSH session come from), from loopback, or from a network
the user allows (`cluster.fence_allow`). The cluster's ports are the fixed ones bootstrap sets,
Ray's client and worker ranges, the rendezvous ports `serve` picks from, and the host's ephemeral
range, where the kernel puts every port Ray, vLLM, torch and NIXL open without a fixed number.
Never fenced: the port sshd took our session on, as the host reports it (ssh_ports: not the
inventory's, which behind a NAT is the NAT's), and the served endpoint (the head's vLLM port, or in a
fleet the router's). Whom `cluster.fence_allow` may admit is bounded (bootstrap.cluster.guard.allow).
The table only rejects: it never accepts what another table of the host drops, and it
touches no other rule. `down` deletes it.

Ray's token: with `cluster.ray_auth: token` (the default where Ray runs) every node container runs
with RAY_AUTH_MODE=token and reads the cluster's token from a file mounted read-only from the host
(RAY_AUTH_TOKEN_PATH), kept 0600 in the SSH user's home; the value is never on a command line, in a
log or in `docker inspect`.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from bootstrap.cluster.guard.allow import reaching
from bootstrap.cluster.guard.rootsh import root_sh
from bootstrap.cluster.guard.secretstore import API_KEY_ENV, no_root
from bootstrap.model import NATIVE_COORD_PORT, NATIVE_MASTER_PORT

if TYPE_CHECKING:
    from bootstrap.model import Cluster, Host, Inventory

#: `ray start`'s Ray client server port and its worker port range (Ray's defaults: 10001, 10002-19999).
RAY_PORT_RANGE = (10001, 19999)
#: The ports `serve` picks torch's rendezvous from in vLLM's native multi-node mode (serve.run).
MASTER_PORT_RANGE = (29500, 29899)
#: Where the token lives in the node container (a read-only bind mount of the host's file).
TOKEN_IN_CONTAINER = "/run/bootstrap/ray-auth-token"
#: The host's copy, under the SSH user's home.
TOKEN_DIR = ".bootstrap"
#: The kernel's default ephemeral range, when the host does not say.
DEFAULT_EPHEMERAL = (32768, 60999)

_SCRIPT = r"""
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"  # a user's PATH (sshd's default) has no sbin: nft is there
printf 'home=%s\n' "$HOME"
set -- $SSH_CLIENT
printf 'client=%s\nsshd_port=%s\n' "$1" "$3"
printf 'uid=%s\n' "$(id -u)"
if command -v nft >/dev/null 2>&1; then echo nft=yes; else echo nft=no; fi
if command -v iptables-restore >/dev/null 2>&1 && command -v ip6tables-restore >/dev/null 2>&1; then
  echo iptables=yes; else echo iptables=no; fi
if [ "$(id -u)" != 0 ] && sudo -n true >/dev/null 2>&1; then echo sudo=yes; else echo sudo=no; fi
printf 'runfs=%s\n' "$(stat -f -c %T /run 2>/dev/null)"
if pgrep -x firewalld >/dev/null 2>&1; then echo firewalld=yes; else echo firewalld=no; fi
printf 'ephemeral=%s\n' "$(cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null)"
f="$HOME/@DIR@/@NAME@/ray-auth-token"
if [ -s "$f" ]; then printf 'token=%s\n' "$(sha256sum < "$f" | cut -c1-16)"; else echo token=; fi
"""


def guard_facts_cmd(cluster_name: str) -> tuple[str, ...]:
    """One command: the facts the fence and the token need (read by parse_guard)."""
    return ("sh", "-c", _SCRIPT.replace("@DIR@", TOKEN_DIR).replace("@NAME@", cluster_name))


@dataclass(frozen=True)
class GuardFacts:
    #: the SSH user's home (where the token file lives)
    home: str | None = None
    #: the controller's address as this host sees our SSH session (SSH_CLIENT; a jump host's when
    #: we come through one)
    client: str | None = None
    #: the port sshd took our session on (never fenced)
    sshd_port: int | None = None
    root: bool = False
    #: `sudo -n` works (when not root)
    sudo: bool = False
    nft: bool = False
    #: iptables-restore and ip6tables-restore (the fence's way where there is no nft)
    iptables: bool = False
    #: net.ipv4.ip_local_port_range
    ephemeral: tuple[int, int] = DEFAULT_EPHEMERAL
    #: the first 16 hex digits of the token file's sha256 ("" when the host has none)
    token: str = ""
    #: the filesystem type of /run (where the secrets are kept: secretstore), None when unknown
    run_fs: str | None = None
    #: sudo's answer when it refused the become password given (-K, $BOOTSTRAP_BECOME_PASSWORD, the
    #: host's ansible_become_password); None when none was given or sudo took it (then `sudo` is True)
    become_refused: str | None = None
    #: firewalld runs on the host (its reject is what a port probe meets there: ports.findings' fix)
    firewalld: bool = False


#: A port number as a host prints it (ASCII digits: str.isdigit() also takes '²', which int() refuses).
_PORT_RX = re.compile(r"[0-9]{1,5}")


def parse_guard(out: str) -> GuardFacts:
    kv = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    eph = DEFAULT_EPHEMERAL
    nums = [int(x) for x in kv.get("ephemeral", "").split() if _PORT_RX.fullmatch(x)]
    if len(nums) == 2 and 0 < nums[0] <= nums[1] <= 65535:
        eph = (nums[0], nums[1])
    port = kv.get("sshd_port", "")
    client = kv.get("client", "").strip()
    return GuardFacts(home=kv.get("home") or None, client=_ip_or_none(client),
                      sshd_port=int(port) if _PORT_RX.fullmatch(port) and 0 < int(port) < 65536 else None,
                      root=kv.get("uid") == "0", sudo=kv.get("sudo") == "yes", nft=kv.get("nft") == "yes",
                      iptables=kv.get("iptables") == "yes",
                      ephemeral=eph, token=kv.get("token", "").strip(), run_fs=kv.get("runfs", "").strip() or None,
                      firewalld=kv.get("firewalld") == "yes")


def _ip_or_none(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None


# -- Ray's token ------------------------------------------------------------------------------

def token_dir(home: str, cluster_name: str) -> str:
    return f"{home.rstrip('/')}/{TOKEN_DIR}/{cluster_name}"


def token_path(home: str, cluster_name: str) -> str:
    return f"{token_dir(home, cluster_name)}/ray-auth-token"


def token_digest(token: str) -> str:
    import hashlib
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def write_token_cmd(home: str, cluster_name: str) -> tuple[str, ...]:
    """Write stdin to the token file, 0600 in a 0700 directory, replaced whole (the value is never in argv)."""
    d = token_dir(home, cluster_name)
    return ("sh", "-c", 'umask 077 && mkdir -p "$1" && chmod 700 "$1" && cat > "$1/.ray-auth-token.new" '
            '&& mv -f "$1/.ray-auth-token.new" "$1/ray-auth-token"', "sh", d)


def read_token_cmd(home: str, cluster_name: str) -> tuple[str, ...]:
    return ("cat", token_path(home, cluster_name))


def remove_token_cmd(home: str, cluster_name: str) -> tuple[str, ...]:
    d = token_dir(home, cluster_name)
    return ("sh", "-c", 'rm -f "$1/ray-auth-token" "$1/.ray-auth-token.new" && rmdir "$1" 2>/dev/null; true',
            "sh", d)


def ray_auth_on(inv: Inventory) -> bool:
    return inv.cluster.ray_auth == "token" and inv.cluster.runtime == "ray"


# -- the fence --------------------------------------------------------------------------------

def table_name(inv: Inventory) -> str:
    """Our nftables table: ``bootstrap_`` and the cluster's name ('-' is not allowed in nft names;
    cluster names have no '_', so two clusters never share a table)."""
    return "bootstrap_" + inv.cluster.name.replace("-", "_")


def endpoint_ports(inv: Inventory, host: Host) -> tuple[int, ...]:
    """The ports of `host` open to everyone: the served endpoint where it runs (a fleet's router, set
    by fleet.plan.replica_inventory; else the head's vLLM API)."""
    c = inv.cluster
    if c.fence_endpoint is not None:
        names, port = c.fence_endpoint
        return (port,) if host.name in names else ()
    if c.replicas > 1:  # the whole fleet's inventory: the router hosts
        return (c.router.port,) if host in inv.router_hosts else ()
    return (c.ports.vllm,) if host.is_head else ()


def cluster_ports(inv: Inventory) -> set[int]:
    """Every fixed port bootstrap makes a container listen on."""
    c = inv.cluster
    p = c.ports
    return {p.ray_gcs, p.dashboard, p.vllm, p.ray_metrics, p.image_copy, p.kv_transfer, p.kv_events,
            c.router.port, c.router.metrics_port, c.monitor.port, c.monitor.node_exporter_port, c.monitor.dcgm_port,
            NATIVE_MASTER_PORT, NATIVE_COORD_PORT}


def port_table(c: Cluster) -> list[tuple[int, int, str]]:
    """(first, last, what) for each port the cluster uses, and the fence closes, on every host: the
    fixed ones (cluster_ports), Ray's client and worker ranges, the rendezvous range. (Not the host's
    ephemeral range: each host has its own.) The inventory refuses an SSH port among them."""
    fixed = [(getattr(c.ports, n), f"cluster.ports.{n}")
             for n in ("ray_gcs", "dashboard", "vllm", "ray_metrics", "image_copy", "kv_transfer", "kv_events")]
    fixed += [(c.router.port, "cluster.router.port"), (c.router.metrics_port, "cluster.router.metrics_port"),
              (c.monitor.port, "cluster.monitor.port"),
              (c.monitor.node_exporter_port, "cluster.monitor.node_exporter_port"),
              (c.monitor.dcgm_port, "cluster.monitor.dcgm_port"),
              (NATIVE_MASTER_PORT, "a fleet replica's torch rendezvous port"),
              (NATIVE_COORD_PORT, "a fleet replica's coordination port")]
    lo, hi = RAY_PORT_RANGE
    return [(p, p, what) for p, what in fixed] + [
        (lo, lo, "Ray's client server"), (lo + 1, hi, f"in Ray's worker ports ({lo + 1}-{hi})"),
        (*MASTER_PORT_RANGE, "in the range `serve` picks torch's rendezvous port from "
                             f"({MASTER_PORT_RANGE[0]}-{MASTER_PORT_RANGE[1]})")]


def port_clash(c: Cluster, port: int) -> str | None:
    """What of the cluster's uses `port` on every host (port_table), or None."""
    return next((what for lo, hi, what in port_table(c) if lo <= port <= hi), None)


def ssh_ports(host: Host, facts: GuardFacts) -> set[int]:
    """The SSH port the fence leaves open on `host`: the one sshd took our session on, as the host
    reports it (SSH_CLIENT). Behind a NAT port forward the inventory's port is the NAT's, and on the
    host that number may be one of the cluster's (a Ray worker's): it stays fenced. Only where the
    host did not say, the inventory's port (else 22)."""
    return {facts.sshd_port} if facts.sshd_port else {host.ssh.port or 22}


Range = tuple[int, int]


def _merge(ranges: Iterable[Range]) -> list[Range]:
    out: list[Range] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _minus(ranges: Sequence[Range], holes: Iterable[int]) -> list[Range]:
    out = list(ranges)
    for port in sorted(set(holes)):
        nxt: list[Range] = []
        for lo, hi in out:
            if lo <= port <= hi:
                if lo < port:
                    nxt.append((lo, port - 1))
                if port < hi:
                    nxt.append((port + 1, hi))
            else:
                nxt.append((lo, hi))
        out = nxt
    return out


def fenced_ranges(inv: Inventory, host: Host, facts: GuardFacts) -> list[Range]:
    """The TCP ports of `host` that only members may open: the cluster's fixed ports, Ray's client
    and worker ranges, the rendezvous range and the host's ephemeral range, less sshd's port
    (ssh_ports) and its endpoint."""
    ranges = [(p, p) for p in cluster_ports(inv)] + [RAY_PORT_RANGE, MASTER_PORT_RANGE, facts.ephemeral]
    return _minus(_merge(ranges), ssh_ports(host, facts) | set(endpoint_ports(inv, host)))


def members(inv: Inventory, facts: Mapping[str, GuardFacts]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) sources admitted: every host's data-plane IP and SSH address (where it is an
    address), the fleet's other hosts, the controller as each host sees it, cluster.fence_allow."""
    found: list[str] = []
    for h in inv.hosts:
        found += [h.ip, h.ssh.address]
    found += list(inv.cluster.fence_members) + list(inv.cluster.fence_allow)
    found += [f.client for f in facts.values() if f.client]
    v4: set[ipaddress.IPv4Network] = set()
    v6: set[ipaddress.IPv6Network] = set()
    for text in found:
        try:
            net = ipaddress.ip_network(text.split("%", 1)[0], strict=False)
        except ValueError:
            continue  # a DNS name (an SSH address): its data-plane IP is in the set
        if isinstance(net, ipaddress.IPv6Network) and net.prefixlen == 128 and net[0].ipv4_mapped:
            net = ipaddress.ip_network(net[0].ipv4_mapped)
        (v4 if isinstance(net, ipaddress.IPv4Network) else v6).add(net)  # type: ignore[arg-type]
    return ([str(n) for n in ipaddress.collapse_addresses(v4)] if v4 else [],
            [str(n) for n in ipaddress.collapse_addresses(v6)] if v6 else [])


def _elements(items: Sequence[str]) -> str:
    return f"elements = {{ {', '.join(items)} }}; " if items else ""


def ruleset(inv: Inventory, host: Host, facts: Mapping[str, GuardFacts]) -> str:
    """The nft script that puts (or replaces, atomically) the fence on `host`."""
    t = table_name(inv)
    v4, v6 = members(inv, facts)
    ports = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in fenced_ranges(inv, host, facts[host.name]))
    return "\n".join([
        f"table inet {t}",
        f"delete table inet {t}",
        f"table inet {t} {{",
        f"  comment \"bootstrap: cluster {inv.cluster.name}'s fence; removed by bootstrap down\"",
        f"  set members4 {{ type ipv4_addr; flags interval; {_elements(v4)}}}",
        f"  set members6 {{ type ipv6_addr; flags interval; {_elements(v6)}}}",
        "  chain input {",
        "    type filter hook input priority filter; policy accept;",
        "    iif \"lo\" accept",
        "    ip saddr @members4 accept",
        "    ip6 saddr @members6 accept",
        f"    tcp dport {{ {ports} }} ct state new counter reject with tcp reset",
        "  }",
        "}",
        "",
    ])


# Every argv below runs as root: the SSH layer's run_as_root (root as it is, else sudo, with the become
# password on stdin where one is given).

def install_argv() -> tuple[str, ...]:
    """`nft -f -`: the script (ruleset) on stdin, applied as one transaction."""
    return ("nft", "-f", "-")


def remove_script(inv: Inventory) -> str:
    """Delete our table whether or not it is there (an empty `table` first makes the delete valid)."""
    t = table_name(inv)
    return f"table inet {t}\ndelete table inet {t}\n"


def list_argv(inv: Inventory) -> tuple[str, ...]:
    return ("nft", "list", "table", "inet", table_name(inv))


def backend(facts: GuardFacts) -> str | None:
    """How the fence is put on this host: nftables where `nft` is, else iptables (iptables-restore
    and ip6tables-restore), else None."""
    return "nft" if facts.nft else "iptables" if facts.iptables else None


def fence_refusal(facts: GuardFacts) -> tuple[str, str] | None:
    """(what, fix) when the fence cannot be put on this host; None when it can."""
    if backend(facts) is None:
        return ("neither `nft` nor iptables-restore/ip6tables-restore on the host: the fence (cluster.fence) "
                "needs one of them",
                "install nftables (apt-get install nftables), or set cluster.fence: false and fence the "
                "cluster's ports yourself (docs/security.md lists them)")
    if not facts.root and not facts.sudo:
        return no_root("the fence (cluster.fence) needs root", "set cluster.fence: false", facts.become_refused)
    return None



# -- the fence with iptables (hosts without nft) ------------------------------------------------

def chain_name(inv: Inventory) -> str:
    """Our iptables chain (28 characters at most, iptables' limit)."""
    name = "bootstrap-" + inv.cluster.name
    if len(name) <= 28:
        return name
    import hashlib
    return name[:19] + "-" + hashlib.sha256(inv.cluster.name.encode()).hexdigest()[:8]


def _multiport(ranges: Sequence[Range]) -> list[str]:
    """--dports lists of at most 15 ports (a range counts 2), as iptables' multiport takes them."""
    out: list[str] = []
    cur: list[str] = []
    used = 0
    for lo, hi in ranges:
        cost = 1 if lo == hi else 2
        if used + cost > 15:
            out.append(",".join(cur))
            cur, used = [], 0
        cur.append(str(lo) if lo == hi else f"{lo}:{hi}")
        used += cost
    if cur:
        out.append(",".join(cur))
    return out


def iptables_restore(inv: Inventory, host: Host, facts: Mapping[str, GuardFacts], family: int) -> str:
    """The `iptables-restore --noflush` (family 4) or `ip6tables-restore --noflush` (6) input that
    (re)fills our chain on `host`: members return, new TCP connections to the cluster's ports are
    rejected. The chain is flushed and refilled in one commit; nothing else is touched."""
    chain = chain_name(inv)
    v4, v6 = members(inv, facts)
    lines = ["*filter", f":{chain} - [0:0]", f"-A {chain} -i lo -j RETURN"]
    lines += [f"-A {chain} -s {m} -j RETURN" for m in (v4 if family == 4 else v6)]
    for ports in _multiport(fenced_ranges(inv, host, facts[host.name])):
        lines.append(f"-A {chain} -p tcp -m conntrack --ctstate NEW -m multiport --dports {ports} "
                     f"-m comment --comment bootstrap-fence -j REJECT --reject-with tcp-reset")
    return "\n".join([*lines, "COMMIT", ""])


def iptables_restore_argv(family: int) -> tuple[str, ...]:
    return ("iptables-restore" if family == 4 else "ip6tables-restore", "--noflush")


def iptables_jump_argv(inv: Inventory) -> tuple[str, ...]:
    """INPUT's jump to our chain, first, once (for both families)."""
    c = chain_name(inv)
    return root_sh('for t in iptables ip6tables; do $t -C INPUT -j "$1" 2>/dev/null || '
                   '$t -I INPUT 1 -j "$1" || exit 1; done', c)


def iptables_remove_argv(inv: Inventory) -> tuple[str, ...]:
    """Our chain and INPUT's jumps to it gone, in both families (a no-op where they are not)."""
    c = chain_name(inv)
    return root_sh('for t in iptables ip6tables; do command -v $t >/dev/null || continue; '
                   'while $t -D INPUT -j "$1" 2>/dev/null; do :; done; $t -F "$1" 2>/dev/null; $t -X "$1" 2>/dev/null; '
                   'done; true', c)


def iptables_list_argv(inv: Inventory) -> tuple[str, ...]:
    return ("iptables", "-S", chain_name(inv))


_DPORTS_RX = re.compile(r"--dports (\S+)[^\n]*REJECT")


def parse_iptables_fenced(listing: str) -> list[Range] | None:
    """The port ranges our chain rejects, from `iptables -S CHAIN` (None: no such rule)."""
    found = _DPORTS_RX.findall(listing)
    if not found:
        return None
    out: list[Range] = []
    for item in ",".join(found).split(","):
        lo, _, hi = item.partition(":")
        if _PORT_RX.fullmatch(lo) and (not hi or _PORT_RX.fullmatch(hi)):
            out.append((int(lo), int(hi or lo)))
    return _merge(out)


# -- the exposure report (`status --exposure`) ---------------------------------------------------

#: `ss`: every listening TCP socket, numeric, with its process where we may see it (root).
LISTENERS = ("ss", "-ltnpH")


@dataclass(frozen=True)
class Listener:
    address: str
    port: int
    #: the process name `ss -p` shows ("" where we may not see it)
    process: str = ""


_PROC_RX = re.compile(r'users:\(\("([^"]*)"')


def parse_listeners(out: str) -> list[Listener]:
    """`ss -ltnpH` -> its sockets (lines it cannot read are skipped)."""
    found: list[Listener] = []
    for line in out.splitlines():
        cols = line.split()
        if len(cols) < 4 or ":" not in cols[3]:
            continue
        addr, _, port = cols[3].rpartition(":")
        if not _PORT_RX.fullmatch(port):
            continue
        addr = addr.strip("[]").split("%", 1)[0]
        m = _PROC_RX.search(line)
        found.append(Listener(addr, int(port), m.group(1) if m else ""))
    return found


_DPORT_RX = re.compile(r"tcp dport \{([^}]*)\}[^\n]*reject")


def parse_fenced(listing: str) -> list[Range] | None:
    """The port ranges the fence on a host rejects, from `nft list table` (None: no fence there)."""
    m = _DPORT_RX.search(listing)
    if m is None:
        return None
    out: list[Range] = []
    for item in m.group(1).replace("\n", " ").split(","):
        lo, _, hi = item.strip().partition("-")
        if _PORT_RX.fullmatch(lo) and (not hi or _PORT_RX.fullmatch(hi)):
            out.append((int(lo), int(hi or lo)))
    return out


def _names(inv: Inventory) -> dict[int, str]:
    c = inv.cluster
    p = c.ports
    return {p.ray_gcs: "Ray GCS", p.dashboard: "Ray dashboard", p.vllm: "vLLM API", p.ray_metrics: "Ray metrics export",
            p.image_copy: "image copy", p.kv_transfer: "KV transfer side channel", p.kv_events: "KV events (kv_aware)",
            c.router.port: "router",
            c.router.metrics_port: "router metrics", c.monitor.port: "Prometheus",
            c.monitor.node_exporter_port: "node exporter", c.monitor.dcgm_port: "DCGM exporter",
            RAY_PORT_RANGE[0]: "Ray client server", RAY_AUTOSCALER_METRICS: "Ray autoscaler metrics",
            RAY_DASHBOARD_METRICS: "Ray dashboard metrics", NATIVE_MASTER_PORT: "torch rendezvous (fleet)",
            NATIVE_COORD_PORT: "member coordination (fleet)"}


#: Ray's defaults for the head's autoscaler and dashboard metrics servers (AUTOSCALER_METRIC_PORT,
#: DASHBOARD_METRIC_PORT): in the ephemeral range, so fenced there.
RAY_AUTOSCALER_METRICS = 44217
RAY_DASHBOARD_METRICS = 44227

#: Ray's gRPC servers: with token authentication they refuse a call without the token.
RAY_TOKEN_PROCESSES = ("gcs_server", "raylet")


@dataclass(frozen=True)
class Exposure:
    host: str
    address: str
    port: int
    what: str
    #: loopback, data-plane, all interfaces, or the address itself
    bind: str
    #: what a caller must hold: SSH key, Ray token, API key, or none
    auth: str
    #: who can open it: this host (loopback), members (fenced), anyone (who routes to the address),
    #: unknown (the fence could not be read)
    reach: str
    #: SSH or the served endpoint: open to everyone by design
    expected: bool
    #: where the fence closes it (reach "members"): the networks of cluster.fence_allow it admits too
    allowed: tuple[str, ...] = ()
    #: those of them that hold public address space (bootstrap.exposure.is_public)
    public: tuple[str, ...] = ()

    @property
    def open_beyond(self) -> bool:
        """Reachable by a non-member though the user did not ask for it: by anyone, or by public
        address space that cluster.fence_allow admits."""
        return (self.reach in ("anyone", "unknown") or bool(self.public)) and not self.expected


def _bind(address: str, host: Host) -> str:
    if address in ("0.0.0.0", "*", "::", ""):
        return "all interfaces"
    ip = _ip_or_none(address)
    if ip is not None and ipaddress.ip_address(ip).is_loopback:
        return "loopback"
    return "data-plane" if ip == host.ip else address


def api_key_on(inv: Inventory, host: Host | None = None) -> bool:
    """vLLM asks for an API key: VLLM_API_KEY reaches it (listed under cluster.secrets, or the secret
    cluster.router.api_key names, which a fleet's replicas get as VLLM_API_KEY; in a pool, the one
    models[].api_key names: `host`'s model's, or with no host every model's, as the router's port)."""
    c = inv.cluster
    names = {s.name for s in c.secrets}
    if API_KEY_ENV in names or (c.router.api_key is not None and c.router.api_key in names):
        return True
    mine = [inv.model_of(host.replica)] if inv.models and host is not None and host.replica >= 0 else inv.models
    return bool(mine) and all(m is not None and m.api_key in names for m in mine)


def exposure(inv: Inventory, host: Host, listeners: Sequence[Listener], fenced: list[Range] | None,
             facts: GuardFacts, *, fence_read: bool = True) -> list[Exposure]:
    """Each listening socket of the cluster's on `host` (its ports: those the fence covers, the
    endpoint, SSH): how it is bound, whether it asks for credentials, who can reach it. `fenced`:
    what the host's fence rejects (parse_fenced; None: no fence); fence_read False: it could not be read."""
    c = inv.cluster
    ssh = ssh_ports(host, facts)
    endpoint = set(endpoint_ports(inv, host))
    domain = ports_in_ranges(_merge([(p, p) for p in cluster_ports(inv)]
                                    + [RAY_PORT_RANGE, MASTER_PORT_RANGE, facts.ephemeral]))
    names = _names(inv)
    out: list[Exposure] = []
    seen: set[tuple[str, int]] = set()
    for ls in listeners:
        if (ls.address, ls.port) in seen or not (ls.port in ssh or ls.port in endpoint or ls.port in domain):
            continue
        seen.add((ls.address, ls.port))
        bind = _bind(ls.address, host)
        is_ssh = ls.port in ssh and ls.process in ("sshd", "")
        what = "SSH" if is_ssh else names.get(ls.port) or (
            "torch rendezvous" if MASTER_PORT_RANGE[0] <= ls.port <= MASTER_PORT_RANGE[1] else "") \
            or (ls.process or ("Docker's embedded DNS" if ls.address == "127.0.0.11" else "unnamed port"))
        if is_ssh:
            auth = "SSH key"
        elif c.ray_auth == "token" and c.runtime != "none" and (
                ls.process in RAY_TOKEN_PROCESSES or (not ls.process and ls.port == c.ports.ray_gcs)):
            auth = "Ray token"
        elif (ls.port in endpoint and api_key_on(inv)) or (ls.port == c.ports.vllm and api_key_on(inv, host)):
            auth = "API key"  # vLLM's API, or the router in front of it (it passes the client's header on)
        else:
            auth = "none"
        if bind == "loopback":
            reach = "this host"
        elif not fence_read:
            reach = "unknown"
        elif fenced is not None and any(lo <= ls.port <= hi for lo, hi in fenced):
            reach = "members"
        else:
            reach = "anyone"
        allowed, public = reaching(c.fence_allow, ls.address) if reach == "members" else ((), ())
        out.append(Exposure(host.name, ls.address, ls.port, what, bind, auth, reach,
                            expected=is_ssh or ls.port in endpoint, allowed=allowed, public=public))
    return sorted(out, key=lambda e: (e.port, e.address))


def ports_in_ranges(ranges: Sequence[Range]) -> frozenset[int]:
    return frozenset(p for lo, hi in ranges for p in range(lo, hi + 1))
