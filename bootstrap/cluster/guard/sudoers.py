"""The least privilege a cluster's SSH user needs: every command bootstrap runs as root on a host, whole,
as a sudoers snippet (pure).

bootstrap runs as root only what `SSHHost.run_as_root` runs: the fence (nftables, or iptables where nft
is missing), the secrets on /run (write, remove), `ss -ltnpH` for `status --exposure`, and `true` (the
check that sudo gives root). Each is a fixed argv for a cluster: its only variable parts are the
cluster's name (the fence's table and chain, the secrets' directory). So the snippet allows exactly
those command lines, no wildcard, for one cluster; sudo compares a command's arguments as one string
(the words joined by single spaces), with `\\` escaping sudoers' special characters and wildcards.
What each command does with its standard input (the ruleset, the secrets' values) is not in its
arguments: `nft -f -` and `iptables-restore` change the host's firewall as root, which is what the
fence is (docs/security.md#least-privilege-sudo).
"""
from __future__ import annotations

import re

from bootstrap.model import Inventory

from . import fence as FN
from . import secretstore as SS

#: Where the programs are on Debian 12+, Ubuntu 20.04+, RHEL/Rocky 9 (merged /usr): sudo matches a
#: sudoers path by the file it names, so /usr/bin/sh also allows /bin/sh where that is a link to it.
PATHS = {
    "true": "/usr/bin/true",
    "sh": "/usr/bin/sh",
    "nft": "/usr/sbin/nft",
    "iptables": "/usr/sbin/iptables",
    "iptables-restore": "/usr/sbin/iptables-restore",
    "ip6tables-restore": "/usr/sbin/ip6tables-restore",
    "ss": "/usr/bin/ss",
}
#: The become check (guard.run.become_checked, guard facts' `sudo -n true`).
CHECK = ("true",)


def root_commands(inv: Inventory) -> list[tuple[str, ...]]:
    """Every argv bootstrap runs as root on this cluster's hosts, each once."""
    name = inv.cluster.name
    argvs = [
        CHECK,
        FN.install_argv(), FN.list_argv(inv),
        FN.iptables_restore_argv(4), FN.iptables_restore_argv(6),
        FN.iptables_jump_argv(inv), FN.iptables_remove_argv(inv), FN.iptables_list_argv(inv),
        SS.write_argv(name, prune=True), SS.write_argv(name, prune=False), SS.remove_argv(name),
        FN.LISTENERS,
    ]
    return list(dict.fromkeys(argvs))


# sudoers(5): in a command's arguments a backslash escapes ',', ':', '=', '\\' and the wildcards, and '#'
# would start a comment; '"' is escaped too (a lone "" means "no arguments").
_SPECIAL = re.compile(r'([\\,:=*?\[\]!#])')


def escape(arg: str) -> str:
    return _SPECIAL.sub(r"\\\1", arg)


def command_spec(argv: tuple[str, ...]) -> str:
    """One sudoers command: the program's full path and its arguments as sudo compares them."""
    prog, *args = argv
    path = PATHS[prog]
    return " ".join([path, *(escape(a) for a in args)]) if args else f'{path} ""'


def alias(inv: Inventory) -> str:
    """The Cmnd_Alias name for this cluster (sudoers: upper case letters, digits, underscores)."""
    return "BOOTSTRAP_" + re.sub(r"[^A-Z0-9_]", "_", inv.cluster.name.upper())


def snippet(inv: Inventory, users: list[str], *, nopasswd: bool = False) -> str:
    """The sudoers snippet (for /etc/sudoers.d/, checked by `visudo -cf`): each of `users` may run exactly the
    commands of this cluster as root, with its own password (-K) unless `nopasswd`."""
    name = alias(inv)
    specs = [command_spec(a) for a in root_commands(inv)]
    lines = [f"# bootstrap: what cluster {inv.cluster.name!r} runs as root on its hosts, and nothing else",
             "# (docs/security.md#least-privilege-sudo). Install: visudo -f /etc/sudoers.d/bootstrap",
             f"Cmnd_Alias {name} = \\", *[f"    {s}, \\" for s in specs[:-1]], f"    {specs[-1]}"]
    lines += [f"{escape(u)} ALL=(root) {'NOPASSWD: ' if nopasswd else ''}{name}" for u in users]
    return "\n".join(lines) + "\n"
