"""The inventory reference, generated from the inventory's own definitions: the keys and validators
of the field tables (fields.py, portfields.py, routerfields.py, monitorfields.py, hostfields.py:
what each key takes, what is refused), the dataclasses of model.py (each field's default and its
`#:` comment). Pure; the documentation's Inventory page prints `markdown()`
(docs/hooks.py), and tests/inventory/test_reference.py checks that every key has a description.
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import MISSING
from typing import Any

from bootstrap import model as M
from bootstrap.inventory import fields as F
from bootstrap.inventory import hostfields, modelfields, monitorfields, portfields, routerfields
from bootstrap.inventory.values import accepts

#: (the key's place, its validators, the dataclasses whose fields describe its keys, in order)
SECTIONS: tuple[tuple[str, dict, tuple[type, ...]], ...] = (
    ("cluster", F._CLUSTER_FIELDS, (M.Cluster,)),
    ("cluster.ports", portfields._PORT_FIELDS, (M.Ports,)),
    ("cluster.ssh", F._SSH_FIELDS, (M.SSHSettings, M.SSHTarget)),
    ("cluster.router", routerfields._ROUTER_FIELDS, (M.Router,)),
    ("cluster.monitor", monitorfields._MONITOR_FIELDS, (M.Monitor,)),
    ("hosts[]", hostfields._HOST_FIELDS, (M.Host, M.SSHTarget)),
    ("models[]", modelfields._MODEL_FIELDS, (M.ServedModel,)),
)

#: Defaults the dataclasses cannot state (decided when the inventory is read, or required).
DEFAULTS: dict[tuple[str, str], str] = {
    ("cluster", "secrets"): "`[HF_TOKEN]` when HF_TOKEN is set in your environment, else none",
    ("cluster", "runtime"): "unset: `up` reads the image (Ray where it has it, else none)",
    ("cluster.router", "host"): "the first replica's head",
    ("cluster.monitor", "host"): "the head",
    ("cluster.ssh", "known_hosts"): "none: ~/.ssh/known_hosts only",
    ("cluster", "gpus_per_node"): "required with accelerator gpu, unless every host sets `gpus`",
    ("cluster.ssh", "user"): "~/.ssh/config's, else yours",
    ("cluster.ssh", "port"): "~/.ssh/config's, else 22",
    ("cluster.ssh", "key"): "~/.ssh/config's, else ssh's defaults and the agent",
    ("cluster.ssh", "jump"): "~/.ssh/config's ProxyJump, else none",
    ("hosts[]", "name"): "required",
    ("hosts[]", "address"): "required",
    ("hosts[]", "ip"): "the address, when it is an IP address (required otherwise)",
    ("hosts[]", "role"): "head for the first host, worker for the others",
    ("hosts[]", "gpus"): "cluster.gpus_per_node",
    ("hosts[]", "replica"): "the hosts split in order into cluster.replicas groups",
    ("hosts[]", "user"): "cluster.ssh.user",
    ("hosts[]", "port"): "cluster.ssh.port",
    ("hosts[]", "key"): "cluster.ssh.key",
    ("hosts[]", "jump"): "cluster.ssh.jump",
    ("models[]", "name"): "required",
    ("models[]", "source"): "the name",
    ("models[]", "hosts"): "none: the replicas take the next free hosts in the order of hosts:",
}
#: Descriptions of keys that have no field of their own in the dataclasses.
DESCRIPTIONS: dict[tuple[str, str], str] = {
    ("cluster", "gpus_per_node"): "The GPUs every host has; preflight refuses a host where nvidia-smi finds another "
                                  "count. A host's `gpus` overrides it.",
    ("cluster.ssh", "user"): "SSH user for every host (a host's `user` overrides it).",
    ("cluster.ssh", "port"): "SSH port for every host (a host's `port` overrides it).",
    ("cluster.ssh", "key"): "Private key file for every host (a host's `key` overrides it).",
    ("hosts[]", "address"): "Where to reach the host over SSH: a host name, an IP address or a Host alias of "
                            "~/.ssh/config.",
    ("hosts[]", "name"): "The host's name in every message, table and `--limit` list.",
    ("hosts[]", "role"): "`head` (exactly one per replica) or `worker`.",
    ("hosts[]", "user"): "SSH user for this host.",
    ("hosts[]", "port"): "SSH port for this host.",
    ("hosts[]", "key"): "Private key file for this host.",
}


def _comments(cls: type) -> dict[str, str]:
    """field -> the `#:` comment lines right above it in the class body, joined."""
    src = inspect.getsource(cls)
    lines = src.splitlines()
    out: dict[str, str] = {}
    for node in ast.parse(src).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            i, text = node.lineno - 2, []
            while i >= 0 and lines[i].strip().startswith("#:"):
                text.insert(0, lines[i].strip()[2:].strip())
                i -= 1
            if text:
                out[node.target.id] = " ".join(text).replace("``", "`")
    return out


def _default_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple):
        return "none" if not value else f"`{list(value)}`"
    return f"`{value}`"


def rows(place: str) -> list[tuple[str, str, str, str]]:
    """(key, what it takes, default, what it does) for each key of a section, in the validators' order."""
    _, validators, classes = next(s for s in SECTIONS if s[0] == place)
    described: dict[str, str] = {}
    defaults: dict[str, str] = {}
    for cls in reversed(classes):  # the first class wins
        described.update(_comments(cls))
        for f in dataclasses.fields(cls):
            if f.default is not MISSING:
                defaults[f.name] = _default_text(f.default)
            elif f.default_factory is not MISSING:  # type: ignore[misc]
                defaults[f.name] = "see below"
    out = []
    for key, validator in validators.items():
        what = DESCRIPTIONS.get((place, key)) or described.get(key, "")
        default = DEFAULTS.get((place, key)) or defaults.get(key, "required")
        out.append((key, accepts(validator), default, what))
    return out


def markdown() -> str:
    """Every section as a table: key, what it takes (anything else is refused, naming the file,
    line and key), the default, what it does."""
    parts = []
    for place, _, _ in SECTIONS:
        parts += [f"### `{place}`", "", "| key | takes | default | what it does |", "|---|---|---|---|"]
        for key, takes, default, what in rows(place):
            cell = [x.replace("|", "\\|") for x in (takes, default, what)]
            parts.append(f"| `{key}` | {cell[0]} | {cell[1]} | {cell[2]} |")
        parts.append("")
    return "\n".join(parts)
