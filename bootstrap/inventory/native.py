"""The native inventory format: a `cluster:` mapping and a `hosts:` list."""
from __future__ import annotations

from typing import Mapping

from bootstrap.inventory.fields import _cluster
from bootstrap.inventory.hostfields import _HOST_FIELDS, _TOO_MANY_HOSTS, _HostSpec
from bootstrap.inventory.modelfields import _models
from bootstrap.inventory.values import _check_mapping
from bootstrap.inventory.yamlfile import _MAX_HOSTS, _describe, _Loc, _unknown_key

_NATIVE_KEYS = {name: name for name in _HOST_FIELDS}


def _native(root: dict, top: _Loc, environ: Mapping[str, str]):  # type: ignore[no-untyped-def]
    for key in root:
        if key not in ("cluster", "hosts", "models"):
            top.keyname(root, key).fail(_unknown_key(key, ["cluster", "hosts", "models"], "top-level key"))
    models_loc = top.key(root, "models")
    models, model_locs = _models(root.get("models"), models_loc)
    cluster, defaults, facts = _cluster(root.get("cluster"), top.key(root, "cluster"), environ, pool=bool(models))
    facts["models"] = (models, model_locs, models_loc)
    if "hosts" not in root:
        top.at(field="hosts").fail("required: list the machines under 'hosts:'")
    hosts_loc = top.key(root, "hosts")
    hosts = root["hosts"]
    if not isinstance(hosts, list):
        hosts_loc.fail(f"expected a list of hosts, got {_describe(hosts)}")
    if not hosts:
        hosts_loc.fail("must list at least one host")
    if len(hosts) > _MAX_HOSTS:
        hosts_loc.item(hosts, _MAX_HOSTS).fail(_TOO_MANY_HOSTS)
    specs = []
    for i, entry in enumerate(hosts):
        loc = hosts_loc.item(hosts, i)
        if entry is None:
            loc.fail("expected a mapping with name and address, got null")
        values, locs = _check_mapping(entry, loc, _HOST_FIELDS, "a mapping with name and address")
        specs.append(_HostSpec(loc, values, locs, _NATIVE_KEYS))
    return (cluster, facts), defaults, specs
