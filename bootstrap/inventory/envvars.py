"""The environment variables an inventory sets, pure: their names, their values, and what is a credential."""
from __future__ import annotations

import re
from typing import Any

from bootstrap.inventory import secretrules as SR
from bootstrap.inventory.values import _expect_mapping
from bootstrap.inventory.yamlfile import _describe, _Loc, _quote
from bootstrap.model import PLAN_ENV

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


#: Variable names that hold credentials: their values belong in the caller's environment, named
#: under cluster.secrets, never in the inventory file (kept at rest, copied, committed).
_CREDENTIAL_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?|(API|ACCESS|SECRET|PRIVATE)_?KEY)$", re.IGNORECASE)
#: Values that are credentials whatever their name: Hugging Face, OpenAI-style, GitHub, GitLab, Slack
#: tokens, AWS access key IDs, JWTs, and a URL with a password in it (a proxy's
#: `http://user:password@host`).
_CREDENTIAL_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]+"
    r"|[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:[^/\s@]+@)")


def looks_like_credential(text: str) -> bool:
    """A value that is a credential by its form (_CREDENTIAL_VALUE), anywhere in the text."""
    return bool(_CREDENTIAL_VALUE.search(text))


def _env_name(value: Any, loc: _Loc) -> str:
    if isinstance(value, str) and looks_like_credential(value):
        loc.fail("this is a credential, not the name of a variable: list the variable that holds it (e.g. "
                 "HF_TOKEN) and set that in your environment")
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        shown = _quote(value) if isinstance(value, str) else _describe(value)
        loc.fail(
            f"{shown} is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    return value


#: The variables the plan sets in a container itself (model.PLAN_ENV, the names cluster/plan.py and
#: fleet/plan.py set): neither env nor secrets may set them (secrets: SR.name_problem refuses more).
_PLAN_ENV = {k: SR.plan_env_problem(k) for k in PLAN_ENV}


def _env(value: Any, loc: _Loc) -> dict[str, tuple[str, _Loc]]:
    """NAME -> (value, loc). Values are strings or integers; never echoed in errors."""
    mapping = _expect_mapping(value, loc, "a mapping of NAME: value")
    out: dict[str, tuple[str, _Loc]] = {}
    for name, raw in mapping.items():
        _env_name(name, loc.keyname(mapping, name))
        vloc = loc.key(mapping, name)
        if name in _PLAN_ENV:
            loc.keyname(mapping, name).fail(_PLAN_ENV[name])
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            hint = " (quote it)" if isinstance(raw, (bool, float)) or raw is None else ""
            vloc.fail(f"expected a string or an integer, got {_describe(raw, show=False)}{hint}")
        text = str(raw)
        if "\x00" in text:
            vloc.fail("must not contain a NUL character")
        if _CREDENTIAL_NAME.search(name) or looks_like_credential(text):
            vloc.fail(f"{name} holds a credential: the inventory file would keep it at rest; list {name} under "
                      "cluster.secrets and set it in your environment instead (its value is never shown)")
        out[name] = (text, vloc)
    return out


# What the plain validators take, in words (the inventory reference; see `accepts`).
for _fn, _text in (
    (_env_name, "an environment variable name (letters, digits, `_`)"),
    (_env, "a mapping of environment variable names to values"),
):
    _fn.accepts = _text
