"""`plan` as a reader takes it in (pure): a row per host, the secrets' wrapper script once, the head's
`docker run` whole and every other host's as what differs from the head's.

A plan of 64 hosts printed as 64 `docker run` lines of ~1,400 characters, each repeating the same
400-character wrapper, is unreadable; the hosts of a cluster differ in a few options (VLLM_HOST_IP,
the derived NCCL interface, the labels) and in the command (the head's `ray start --head`, the
workers' `--address`). `--json` keeps every argv whole (face/docs.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bootstrap.cluster.guard.secretstore import ENTRY

#: What stands in every shown argv for the secrets' wrapper script (printed once, as WRAPPER_NOTE says).
WRAPPER = "<secrets wrapper>"
#: docker run's options that take no value (the rest of ours take one: `--flag value`).
_FLAGS = frozenset({"-d", "--detach", "--rm", "--init", "--privileged", "-i", "-t", "--interactive", "--tty"})


@dataclass(frozen=True)
class HostView:
    host: str
    role: str
    ip: str
    #: what the container runs (its entrypoint and command, after the secrets' wrapper)
    runs: tuple[str, ...]
    #: the whole `docker run` (the wrapper as WRAPPER), or None when `differs` says it
    argv: tuple[str, ...] | None
    #: (the host it is shown against, its options that differ or are its own, the head's options it lacks,
    #: its command if it differs); an option is its words, ("-e", "X=1")
    differs: tuple[str, tuple[tuple[str, ...], ...], tuple[tuple[str, ...], ...], tuple[str, ...] | None] | None = None
    action: str = ""
    reason: str = ""


def _pairs(options: Sequence[str]) -> list[tuple[str, ...]]:
    """docker run's options as items: ("--flag", "value") or ("--flag",)."""
    items, i = [], 0
    while i < len(options):
        o = options[i]
        if o.startswith("-") and o not in _FLAGS and "=" not in o and i + 1 < len(options):
            items.append((o, options[i + 1]))
            i += 2
        else:
            items.append((o,))
            i += 1
    return items


def _key(item: tuple[str, ...]) -> tuple[str, ...]:
    """What an item sets: an environment variable or a label by its name (a new value replaces it),
    anything else by itself."""
    if item[0] in ("-e", "--env", "--label") and len(item) == 2:
        return (item[0], item[1].split("=", 1)[0])
    return item


def _ip(options: Sequence[str]) -> str:
    return next((o.split("=", 1)[1] for o in options if o.startswith("VLLM_HOST_IP=")), "")


def shown(argv: Sequence[str]) -> tuple[str, ...]:
    """The argv with the secrets' wrapper script as WRAPPER."""
    return tuple(WRAPPER if a == ENTRY else a for a in argv)


def has_wrapper(actions) -> bool:
    return any(ENTRY in a.spec.run_argv() for a in actions)


def wrapper_script() -> str:
    return ENTRY


def views(actions) -> list[HostView]:
    """A HostView per action: the first (the head) whole, the others against it."""
    base: tuple[str, list, tuple[str, ...]] | None = None
    out = []
    for a in actions:
        spec = a.spec
        items = _pairs(spec.options) + [("--label", f"{k}={v}") for k, v in spec.labels if k != "bootstrap.spec"]
        runs = (spec.entrypoint, *spec.command)
        if base is None:
            base = (a.host, items, runs)
            out.append(HostView(a.host, spec.role, _ip(spec.options), runs, shown(spec.run_argv()),
                                action=a.action, reason=a.reason))
            continue
        bhost, bitems, bruns = base
        keys = {_key(it) for it in items}
        own = tuple(it for it in items if it not in bitems)
        gone = tuple(it for it in bitems if _key(it) not in keys)
        out.append(HostView(a.host, spec.role, _ip(spec.options), runs, None,
                            (bhost, own, gone, runs if runs != bruns else None), a.action, a.reason))
    return out
