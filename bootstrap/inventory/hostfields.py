"""A host entry of either format, pure: the host fields' table and `_HostSpec`, what both formats make of one."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from bootstrap.inventory.addresses import _address, _ip, _jump
from bootstrap.inventory.envvars import _env
from bootstrap.inventory.values import Validator, _choice, _int, _optional, _path, _port, _string, _user
from bootstrap.inventory.yamlfile import _MAX_HOSTS, _Loc, _quote
from bootstrap.model import MAX_GPUS_PER_HOST

_HOST_NAME_RX = r"[A-Za-z0-9][A-Za-z0-9_.-]*"


def _host_name(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    if not re.fullmatch(_HOST_NAME_RX, value):
        why = "letters, digits, '_', '.', '-', starting with a letter or digit"
        if not value.isprintable():
            why = "it contains a control character"
        elif "[" in value:
            why = "host ranges like gpu-[01:04] are not supported; list each host"
        elif ":" in value:
            why = "give the port as a variable, not in the host name"
        loc.fail(f"{_quote(value)} is not a valid host name: {why}")
    return value


_HOST_FIELDS: dict[str, Validator] = {
    "name": _host_name,
    "address": _address,
    "ip": _optional(_ip),
    "role": _optional(_choice("head", "worker")),
    "gpus": _optional(_int(0, MAX_GPUS_PER_HOST)),
    "replica": _optional(_int(0, _MAX_HOSTS - 1)),
    "env": _env,
    "user": _optional(_user),
    "port": _optional(_port),
    "key": _optional(_path),
    "jump": _optional(_jump),
}


def become_password(value: Any, loc) -> str:
    """sudo's password for the host, read from the Ansible format only (ansible_become_password: the native
    format keeps no password; -K and $BOOTSTRAP_BECOME_PASSWORD give one): a one-line string, never shown,
    not even in a refusal."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        loc.fail("expected the SSH user's sudo password as a string")
    text = str(value)
    if not text or any(c in text for c in "\n\r\0"):
        loc.fail("the sudo password must be one line, not empty (its value is not shown)")
    return text


@dataclass
class _HostSpec:
    loc: _Loc  # the host entry (hosts[1] / all.hosts.gpu-b)
    values: dict[str, Any]  # logical field -> validated value (None or absent: not given)
    locs: dict[str, _Loc]  # logical field -> where it was given
    keys: Mapping[str, str]  # logical field -> the key in this format (for "required" errors)

    def given(self, name: str) -> bool:
        return self.values.get(name) is not None

    def where(self, name: str) -> _Loc:
        return self.locs.get(name) or self.loc.sub(self.keys[name])


_TOO_MANY_HOSTS = (
    f"more than {_MAX_HOSTS} hosts: bootstrap makes one Ray cluster, and Ray supports"
    f" {_MAX_HOSTS} nodes in one; split the machines into several clusters"
)


# What the plain validators take, in words (the inventory reference; see `accepts`).
for _fn, _text in (
    (_host_name, "a name: letters, digits, `_`, `.`, `-`, starting with a letter or digit"),
):
    _fn.accepts = _text
