"""Root on a host where the SSH user is not root: the remote half of SSHHost.run_as_root (pure: a shell
script and the password's place in the channel's input; ssh.py moves the bytes).

The password (-K, $BOOTSTRAP_BECOME_PASSWORD, a host's ansible_become_password) is the first line of the
command's stdin, never an argument: docs/security.md#sudo-and-its-password.
"""
from __future__ import annotations

import shlex
from typing import Iterable

from bootstrap.model import Host, SSHSettings

# `sh -c BECOME sh MODE CMD...`: CMD as root. Root runs it as it is; MODE n: `sudo -n`; MODE pw: the
# first line of stdin is the password, kept in a shell variable (never argv, never this shell's
# environ) and handed to sudo's askpass program through sudo's own environment (a setuid process: only
# root reads it); sudo runs the program only when it asks for a password, and one time at most
# (_ASKPASS), so a wrong password costs one failed attempt, not sudo's three.
# The askpass program holds no secret: ~/.bootstrap/askpass, written when it is missing or differs.
#: The askpass program, line by line: the password from sudo's environment, the first time only.
_ASKPASS = ("#!/bin/sh",
            "# bootstrap's askpass for sudo: the password comes from sudo's own environment, once per command",
            '[ -n "$BOOTSTRAP_ASKPASS_ONCE" ] && mkdir "$BOOTSTRAP_ASKPASS_ONCE" 2>/dev/null || exit 1',
            'printf "%s\\n" "$BOOTSTRAP_ASKPASS_VALUE"')
BECOME = (
    'm=$1; shift; if [ "$(id -u)" = 0 ]; then [ "$m" = pw ] && IFS= read -r _; exec "$@"; fi; '
    '[ "$m" = pw ] || exec sudo -n -- "$@"; '
    'IFS= read -r p || { echo "bootstrap: no become password on stdin" >&2; exit 1; }; '
    'command -v sudo >/dev/null 2>&1 || { echo "sudo: command not found" >&2; exit 127; }; '
    'd="${HOME:-/tmp}/.bootstrap"; a="$d/askpass"; want=$(printf "%s\\n" ' + " ".join(shlex.quote(x) for x in _ASKPASS)
    + '); if [ "$(cat "$a" 2>/dev/null)" != "$want" ]; then (umask 077; mkdir -p "$d" && '
    'printf "%s\\n" "$want" > "$a.new" && chmod 700 "$a.new" && mv -f "$a.new" "$a") || exit 1; fi; '
    'o=$(mktemp -u "${TMPDIR:-/tmp}/bootstrap-askpass.XXXXXXXX") || exit 1; '
    'BOOTSTRAP_ASKPASS_VALUE=$p BOOTSTRAP_ASKPASS_ONCE=$o SUDO_ASKPASS=$a sudo -A -p "[bootstrap] sudo password: " '
    '-- "$@"; rc=$?; rmdir "$o" 2>/dev/null; exit $rc'
)


def become_password(host: Host, settings: SSHSettings) -> str | None:
    """The password sudo gets on this host: the inventory's for the host, else the run's (-K, env)."""
    return host.ssh.become_password if host.ssh.become_password is not None else settings.become_password


def password_first(password: str, chunks: Iterable[bytes]) -> Iterable[bytes]:
    yield password.encode() + b"\n"
    yield from chunks
