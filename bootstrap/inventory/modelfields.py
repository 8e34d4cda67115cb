"""The models a pool serves, pure: the models: section's table, and where each model's replicas go.

With `models:` the hosts are one pool: each model has replicas of `nodes` hosts (or pinned host
groups), and `place` gives every replica group its hosts, in the order of the file: pinned groups
first, then each model's replicas on the next free hosts in the order of `hosts:`. The groups are
what `cluster.replicas` makes without models (each its own head, its own `up`), so everything a
fleet does per replica (up, the fence, the keeper, status, down) works per model's replica too.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from bootstrap.inventory.envvars import looks_like_credential
from bootstrap.inventory.hostfields import _host_name
from bootstrap.inventory.values import Validator, _check_mapping, _choice, _described, _int, _string
from bootstrap.inventory.yamlfile import _MAX_HOSTS, _describe, _Loc, _quote
from bootstrap.model import MAX_GPUS_PER_HOST, ROUTER_POLICIES, ServedModel, model_ref_problem

#: a served name: what clients put in the `model` field and vllm-router matches exactly
_NAME_RX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
#: at most this many models in one pool
MAX_MODELS = 64


def served_name_problem(value: str) -> str | None:
    """Why `value` cannot be a served name (a model's or an adapter's: what clients send as `model`), or
    None; the inventory and `bootstrap adapter` judge names by it."""
    if looks_like_credential(value):
        return "looks like a credential (not shown): a served name is sent by every client and logged"
    if not _NAME_RX.fullmatch(value):
        return (f"{_quote(value)} is not a served model name: letters, digits and '.', '_', ':', '/', '-', "
                "starting with a letter or digit, at most 128 characters (clients send it as `model`)")
    return None


def adapter_source_problem(value: str) -> str | None:
    """Why `value` cannot be an adapter's source, or None: a model reference every replica loads the same way
    (model_ref_problem), nothing vLLM's --lora-modules would read as another entry (`=`, `,`, a space), and
    nothing credential-shaped (it would reach every replica's command line). The inventory's adapters: and
    `bootstrap adapter add` judge sources by it."""
    if looks_like_credential(value):
        return ("looks like a credential (not shown): an adapter's source reaches every replica's command line; "
                "give its Hugging Face id or path, and the token as HF_TOKEN in cluster.secrets")
    bad = next((c for c in "=, " if c in value), None)
    if bad is not None:
        return (f"{_quote(value)} holds {_quote(bad)}, a separator to vLLM's --lora-modules (NAME=PATH entries): "
                "every replica would fail to start; rename the path")
    return model_ref_problem(value)


def _judged_by(problem: Callable[[str], str | None]) -> Validator:
    """A string field refused with `problem`'s reason (the rule `bootstrap adapter` applies too)."""
    def check(value: Any, loc: _Loc) -> str:
        value = _string(value, loc)
        why = problem(value)
        if why is not None:
            loc.fail(why)
        return value
    return check


_served_name = _judged_by(served_name_problem)
_adapter_source = _judged_by(adapter_source_problem)
_source = _judged_by(model_ref_problem)


def _groups(value: Any, loc: _Loc) -> tuple[tuple[str, ...], ...]:
    """Pinned host groups: a list of lists of host names (a single list: one group)."""
    if not isinstance(value, list) or not value:
        loc.fail("a non-empty list of host groups, one per replica, e.g. [[gpu-01, gpu-02], [gpu-03, gpu-04]]")
    if all(isinstance(v, str) for v in value):
        value = [value]
        locs = [loc]
    else:
        locs = [loc.item(value, i) for i in range(len(value))]
    out: list[tuple[str, ...]] = []
    for group, gloc in zip(value, locs):
        if not isinstance(group, list) or not group:
            gloc.fail(f"expected a non-empty list of host names (one replica's hosts), got {_describe(group)}")
        out.append(tuple(_host_name(v, gloc.item(group, j)) for j, v in enumerate(group)))
    return tuple(out)


def _args(value: Any, loc: _Loc) -> tuple[str, ...]:
    if not isinstance(value, list):
        loc.fail(f"expected a list of vLLM's flags and values, e.g. [--max-model-len, '4096'], got {_describe(value)}")
    out = []
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            loc.item(value, i).fail(f"expected a flag or a value, got {_describe(v)}")
        text = str(v)
        if not text or not text.isprintable():
            loc.item(value, i).fail("must be a non-empty printable word")
        out.append(text)
    return tuple(out)


#: the ranks vLLM's --max-lora-rank takes (vLLM 0.32, config/lora.py MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _lora_rank(value: Any, loc: _Loc) -> int:
    if isinstance(value, bool) or value not in LORA_RANKS:
        loc.fail(f"expected one of {', '.join(map(str, LORA_RANKS))} (vLLM's --max-lora-rank), got {_describe(value)}")
    return value


_ADAPTER_FIELDS: dict[str, Validator] = {
    "name": _described("the name clients send as `model` for this adapter", _served_name),
    "source": _described("a Hugging Face id or an absolute path in the containers (default: name)",
                         _adapter_source),
}


def _adapters(value: Any, loc: _Loc) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        loc.fail(f"expected a list of adapters, each {{name, source}}, got {_describe(value)}")
    out: list[tuple[str, str]] = []
    for i, entry in enumerate(value):
        aloc = loc.item(value, i)
        values, _ = _check_mapping(entry, aloc, _ADAPTER_FIELDS, "a mapping with name and source")
        if "name" not in values and not (isinstance(entry, dict) and "name" in entry):  # not one it refused
            aloc.fail("name is missing: the name clients send as `model`, e.g. {name: chat-sql, source: org/lora}")
        out.append((values["name"], values.get("source", values["name"])))
    return tuple(out)


#: the policies a pool's model may have: kv_aware needs KV event sources, which vllm-router ties to one model
POOL_POLICIES = tuple(p for p in ROUTER_POLICIES if p != "kv_aware")


def _pool_policy(value: Any, loc: _Loc) -> str:
    if value == "kv_aware":
        loc.fail("kv_aware is not planned for a pool of models (vllm-router's KV event sources name one model): "
                 "serve one model per inventory for it, or choose another policy")
    return _choice(*POOL_POLICIES)(value, loc)


_MODEL_FIELDS: dict[str, Validator] = {
    "name": _described("the served name clients send as `model` (letters, digits, `._:/-`)", _served_name),
    "source": _described("a Hugging Face id (org/name) or an absolute path in the containers (default: name)",
                         _source),
    "replicas": _int(1, _MAX_HOSTS),
    "nodes": _int(1, _MAX_HOSTS),
    "hosts": _described("a list of host groups, one per replica: [[a, b], [c]]", _groups),
    "tp": _int(1, MAX_GPUS_PER_HOST * _MAX_HOSTS),
    "pp": _int(1, _MAX_HOSTS),
    "args": _described("a list of vLLM flags and values (what serve takes after --)", _args),
    "policy": _described(f"one of {', '.join(POOL_POLICIES)}", lambda v, loc: _pool_policy(v, loc)),
    "adapters": _described("a list of LoRA adapters, each {name, source}; [] turns LoRA on for runtime adapters",
                           _adapters),
    "lora_rank": _described(f"one of {', '.join(map(str, LORA_RANKS))}", _lora_rank),
    "api_key": _described("the name of a secret in cluster.secrets: this model's own API key (default: "
                          "cluster.router.api_key's)", _string),
}


def _model(value: Any, loc: _Loc) -> ServedModel:
    values, locs = _check_mapping(value, loc, _MODEL_FIELDS, "a mapping with name (and source, replicas, ...)")
    if "name" not in values and not (isinstance(value, dict) and "name" in value):  # not one it refused
        loc.fail("name is missing: the name clients send as `model`, e.g. {name: chat, source: org/model}")
    if "lora_rank" in values and "adapters" not in values:
        locs["lora_rank"].fail("does nothing without adapters (LoRA is off); add adapters: (or adapters: [])")
    if "hosts" in values:
        for key in ("replicas", "nodes"):
            if key in values:
                locs[key].fail(f"does nothing with hosts (each group listed is a replica of its own size); "
                               f"remove {key} or hosts")
    groups = values.get("hosts", ())
    line = loc.line if loc.line is not None else "?"
    return ServedModel(
        name=values["name"], source=values.get("source", values["name"]),
        replicas=len(groups) or values.get("replicas", 1),
        nodes=len(groups[0]) if groups else values.get("nodes", 1), hosts=groups,
        tp=values.get("tp"), pp=values.get("pp"), args=values.get("args", ()), policy=values.get("policy"),
        adapters=values.get("adapters", ()), lora="adapters" in values, lora_rank=values.get("lora_rank"),
        api_key=values.get("api_key"), where=f"{loc.file}:{line}: {loc.field}",
        lines=tuple((k, x.line) for k, x in locs.items() if x.line is not None))


def _models(value: Any, loc: _Loc) -> tuple[tuple[ServedModel, ...], list[_Loc]]:
    """The models: list, each entry checked; names are unique. Returns them and where each is."""
    if value is None:
        return (), []
    if value == []:
        loc.fail("an empty list: list at least one model ({name, source, replicas...}), or remove models: to serve "
                 "one model with `bootstrap serve MODEL`")
    if not isinstance(value, list):
        loc.fail(f"expected a list of models, each a mapping with name (and source, replicas...), "
                 f"got {_describe(value)}")
    if len(value) > MAX_MODELS:
        loc.item(value, MAX_MODELS).fail(f"at most {MAX_MODELS} models in one pool")
    models, locs = [], []
    seen: dict[str, str] = {}
    for i, entry in enumerate(value):
        mloc = loc.item(value, i)
        if entry is None:
            mloc.fail("expected a mapping with name (and source, replicas, ...), got null")
        m = _model(entry, mloc)
        for j, name in enumerate((m.name, *(a for a, _ in m.adapters))):
            field = f"{mloc.field}.name" if j == 0 else f"{mloc.field}.adapters[{j - 1}].name"
            if name in seen:
                at = mloc.at(field=field)
                if j:  # the adapter's own line
                    seq = entry.get("adapters")
                    at = mloc.key(entry, "adapters").item(seq, j - 1).at(field=field)
                at.fail(f"{_quote(name)} is already the name of {seen[name]}: clients tell models "
                                          "and adapters apart by name")
            seen[name] = field.removesuffix(".name")
        models.append(m)
        locs.append(mloc)
    return tuple(models), locs


def _need(models: tuple[ServedModel, ...]) -> str:
    return ", ".join(f"{m.name}: {m.replicas} x {m.nodes}" for m in models if not m.hosts)


def place(models: tuple[ServedModel, ...], locs: list[_Loc], host_names: list[str],
          host_locs: list[_Loc], loc: _Loc) -> tuple[list[list[int]], list[int]]:
    """Every model's replica groups: (groups of host indexes, each head first; the model index of
    each group). Pinned groups take their hosts; the others take the next free hosts in the order
    of hosts:; the hosts left over are idle. Refused, naming the numbers: a pinned host that is no
    host or is pinned twice (one host's GPUs for two replicas), more hosts needed than free."""
    index = {n: i for i, n in enumerate(host_names)}
    owner: dict[int, str] = {}
    pinned: dict[tuple[int, int], list[int]] = {}
    for mi, (m, mloc) in enumerate(zip(models, locs)):
        for g, group in enumerate(m.hosts):
            where = mloc.at(field=f"{mloc.field}.hosts[{g}]")
            for name in group:
                if name not in index:
                    where.fail(f"{_quote(name)} is not a host of this inventory")
                i = index[name]
                if i in owner:
                    where.fail(f"{name} is already in {owner[i]}: a host serves one replica of one model "
                               "(its GPUs cannot hold two); pin another host")
                owner[i] = f"{m.name}'s replica {g} ({mloc.field}.hosts[{g}])"
            pinned[(mi, g)] = [index[n] for n in group]
    free = [i for i in range(len(host_names)) if i not in owner]
    need = sum(m.replicas * m.nodes for m in models if not m.hosts)
    if need > len(free):
        taken = f", {len(owner)} pinned" if owner else ""
        loc.fail(f"the models need {need} hosts ({_need(models)}: replicas x nodes) and the pool has "
                 f"{len(free)} free ({len(host_names)} hosts{taken}): add hosts, or fewer replicas or nodes")
    groups: list[list[int]] = []
    model_of: list[int] = []
    it = iter(free)
    for mi, m in enumerate(models):
        for g in range(m.replicas):
            groups.append(pinned[(mi, g)] if m.hosts else [next(it) for _ in range(m.nodes)])
            model_of.append(mi)
    if len(groups) == 1:
        loc.fail(f"one replica of one model is one cluster: serve {models[0].name} with `bootstrap serve MODEL` "
                 "and no models:, or give the pool two replicas or more")
    # the hosts left over are idle: in the pool (its fence, `down`), serving no model; `serve` stops
    # what serves there (a model removed from models: keeps its hosts for the next one)
    return groups, model_of
