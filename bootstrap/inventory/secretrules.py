"""The rules for secrets: their names, their values and their roles (pure). fields._cluster and
fields._router call them where each secret is named, and say where (file:line, field).

A secret plays a role (role): VRRP's password (cluster.router.vip.secret: sent in clear in every
VRRPv2 advert), the API key (cluster.router.api_key, or VLLM_API_KEY itself: held by every client,
printed in `serve`'s curl hint) or the workload's (the rest of cluster.secrets, HF_TOKEN among them:
the serving containers' processes). cluster/guard/secretstore.py gives each kind of container the roles it
uses; one secret in two roles would reach where the wider one goes, so it is refused, by name and,
where the values are known, by value (never shown).
"""
from __future__ import annotations

import re
from typing import Collection, Mapping, Sequence

from bootstrap.inventory.yamlfile import _Loc
from bootstrap.model import PLAN_DEFAULT_ENV, PLAN_ENV, Router, Secret, ServedModel

#: The variable vLLM reads its API key from (cluster/guard/secretstore.py's API_KEY_ENV).
API_KEY_ENV = "VLLM_API_KEY"
WORKLOAD, API_KEY, VRRP = "workload", "api-key", "vrrp"

#: Variables every process of a container reads (the shell, the dynamic linker, Python): a secret's
#: value there would change how each one runs, the entrypoint's own `exec` first.
_PROCESS_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "IFS", "ENV", "BASH_ENV",
                          "CDPATH", "PS4", "TMPDIR", "HOSTNAME", "TERM", "LANG", "LANGUAGE", "TZ", "TZDIR",
                          "GLIBC_TUNABLES", "GCONV_PATH", "LOCPATH", "NLSPATH", "HOSTALIASES", "LOCALDOMAIN",
                          "RES_OPTIONS"})
#: ... and the families: the dynamic linker's LD_*, the locale's LC_*, glibc's malloc (MALLOC_*), and
#: Python's: PYTHONPATH and the newer PYTHON_GIL, PYTHON_CPU_COUNT, PYTHON_HISTORY (with `_`).
_PROCESS_PREFIX = re.compile(r"(LD_|LC_|MALLOC_)[A-Za-z0-9_]*|PYTHON[A-Z0-9_]*")
#: A secret is a file named after it on the host (`.NAME.new` while it is written): NAME_MAX bytes.
NAME_MAX = 255
MAX_NAME = NAME_MAX - len("..new")
#: VRRPv2's password (keepalived's auth_pass): at most 8 bytes go on the wire, the rest is cut unseen;
#: keepalived reads it as one word of its configuration (no space; `#`, `!` start a comment; quotes,
#: `$`, `\` and braces are its syntax).
VRRP_MAX = 8
_VRRP_WORD = re.compile(r"[!-~]+")
_VRRP_SYNTAX = set("\"'$\\{}")


def plan_env_problem(name: str) -> str | None:
    """Why `env` or a secret may not set `name` (the plan sets it: model.PLAN_ENV), or None."""
    if name not in PLAN_ENV:
        return None
    source, fix = PLAN_ENV[name]
    return f"{name} is set by bootstrap from {source}; " + (f"set {fix} instead" if fix else "remove it")


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a secret's name, or None."""
    why = plan_env_problem(name)
    if why:
        return why
    if name in PLAN_DEFAULT_ENV:
        return (f"{name} is set by bootstrap per node (from its facts) unless the node's env sets it: as a secret "
                "it would override that unseen; set it in env")
    if name in _PROCESS_ENV or _PROCESS_PREFIX.fullmatch(name):
        return (f"{name} is read by every process of the containers (the shell, the dynamic linker, the C "
                "library or Python): as a secret it would change how each one runs; keep the secret in a variable "
                "of its own")
    if len(name.encode()) > MAX_NAME:
        return (f"this name is {len(name.encode())} characters: each secret is a file of its name on the hosts, "
                f"at most {MAX_NAME}; use a shorter name")
    return None


def role(name: str, api_key: str | None, vrrp: str | None, model_keys: Collection[str] = ()) -> str:
    """The role of the secret `name` (cluster.router.api_key, .vip.secret and models[].api_key as given)."""
    if vrrp is not None and name == vrrp:
        return VRRP
    return API_KEY if name in (API_KEY_ENV, api_key) or name in model_keys else WORKLOAD


def _what(name: str, api_key: str | None, vrrp: str | None) -> str:
    """A secret's role in words, with where that role exposes it."""
    if name == vrrp:
        return "VRRP's password (cluster.router.vip.secret, sent in clear in every advert)"
    if name in (API_KEY_ENV, api_key):
        return f"the API key ({'cluster.router.api_key' if name == api_key else name}, held by every client)"
    if name == "HF_TOKEN":
        return "the Hugging Face token (HF_TOKEN, in the serving containers)"
    return f"{name}, a secret of the serving containers"


def vrrp_problem(value: str) -> str | None:
    """Why keepalived could not take `value` whole as VRRPv2's password (never shown), or None."""
    size = len(value.encode())
    if size > VRRP_MAX:
        return (f"is {size} bytes: keepalived sends only the first {VRRP_MAX} of VRRPv2's password (auth_pass) "
                f"and would cut it unseen; use {VRRP_MAX} characters at most")
    if not _VRRP_WORD.fullmatch(value) or _VRRP_SYNTAX & set(value) or value[0] in "#!":
        return ("is not one word keepalived reads whole (auth_pass: printable ASCII, no space, quote, '$', '\\' or "
                "brace, not starting with '#' or '!'); pick another password")
    return None


def check_roles(router: Router, secrets: Sequence[Secret], where: Mapping[str, _Loc]) -> None:
    """One secret in two roles is refused (by name; by value where both are known), VLLM_API_KEY with
    two values, and a VRRP password keepalived cannot take whole. `where`: the locations of
    `vip.secret` and `api_key` (where they are set) and of VLLM_API_KEY in cluster.secrets."""
    vrrp = router.vip.secret if router.vip is not None else None
    key = router.api_key
    listed = {s.name for s in secrets}
    if key is not None and key != API_KEY_ENV and API_KEY_ENV in listed:
        where["api_key"].fail(f"{API_KEY_ENV} is listed in cluster.secrets too: vLLM would get two values under one "
                              f"name; set api_key: {API_KEY_ENV}, or remove {API_KEY_ENV} from cluster.secrets")
    named = [(n, f) for n, f in ((vrrp, "vip.secret"), (key, "api_key")) if n is not None]
    if key is None and API_KEY_ENV in listed:  # the key listed under vLLM's own name
        named.append((API_KEY_ENV, API_KEY_ENV))
    for name, field in named:  # by name: the role's secret is also the API key's or the Hugging Face token
        if field == "vip.secret" and name in (key, API_KEY_ENV):
            other = _what(name, key, None)
        elif name == "HF_TOKEN":
            other = _what(name, None, None)
        else:
            continue
        where[field].fail(f"{name} would be {_what(name, key, vrrp)} and {other}: one secret in two roles, "
                          "exposed differently; give each role a secret of its own")
    values = {s.name: s.reveal() for s in secrets if s.reveal()}
    for name, field in named:
        mine = role(name, key, vrrp)
        value = values.get(name)
        twin = next((n for n, v in values.items() if v == value and n != name and role(n, key, vrrp) != mine),
                    None) if value else None
        if twin is not None:
            where[field].fail(f"{name} has the same value as {twin}: one secret in two roles, exposed differently "
                              f"({_what(name, key, vrrp)}; {_what(twin, key, vrrp)}); give each role a value of its "
                              "own (values are never shown)")
    if vrrp is not None and values.get(vrrp) is not None:
        why = vrrp_problem(values[vrrp])
        if why:
            where["vip.secret"].fail(f"{vrrp} in your environment {why} (its value is never shown)")


def check_model_keys(models: Sequence[ServedModel], where: Sequence[_Loc], router: Router,
                     secrets: Sequence[Secret]) -> None:
    """A model's own API key (models[].api_key): a secret listed in cluster.secrets, in no other role
    (VRRP's password, the Hugging Face token), by name and, where the values are known, by value."""
    listed = {s.name: s.reveal() for s in secrets}
    vrrp = router.vip.secret if router.vip is not None else None
    keys = {m.api_key for m in models if m.api_key is not None}
    for m, loc in zip(models, where):
        name = m.api_key
        if name is None:
            continue
        at = loc.sub("api_key")
        if name not in listed:
            at.fail("that name is not listed in cluster.secrets (the value is not shown: it may be the key itself): "
                    "name a secret listed there and set its value in your environment (the key stays out of the "
                    "inventory)")
        if name in (vrrp, "HF_TOKEN"):
            at.fail(f"{name} would be {m.name}'s API key (held by its clients) and {_what(name, None, vrrp)}: one "
                    "secret in two roles, exposed differently; give each role a secret of its own")
        value = listed[name]
        twin = next((n for n, v in listed.items() if value and v == value and n != name
                     and role(n, router.api_key, vrrp, keys) != API_KEY), None)
        if twin is not None:
            at.fail(f"{name} has the same value as {twin}: one secret in two roles, exposed differently ({m.name}'s "
                    f"API key; {_what(twin, router.api_key, vrrp)}); give each role a value of its own (values are "
                    "never shown)")
