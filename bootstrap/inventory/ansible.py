"""The Ansible YAML inventory format: an `all:` group, the cluster settings in all.vars.bootstrap."""
from __future__ import annotations

import re
from typing import Any, Mapping

from bootstrap.inventory.addresses import _address
from bootstrap.inventory.fields import _cluster
from bootstrap.inventory.hostfields import _HOST_FIELDS, _TOO_MANY_HOSTS, _host_name, _HostSpec, become_password
from bootstrap.inventory.modelfields import _models
from bootstrap.inventory.values import _expect_mapping
from bootstrap.inventory.yamlfile import _MAX_HOSTS, _describe, _join, _Loc, _quote, _unknown_key

#: The most host entries visited in Ansible groups (a host may be listed in a few groups;
#: aliases can repeat a group many times).
_MAX_HOST_OCCURRENCES = 8 * _MAX_HOSTS

#: logical host field -> the Ansible variables that set it (first wins within one place).
_ANSIBLE_VARS: dict[str, tuple[str, ...]] = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "key": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    # sudo's password on the host (never shown): given to sudo on the SSH channel's stdin, as -K's
    "become_password": ("ansible_become_password", "ansible_become_pass", "ansible_sudo_pass", "ansible_sudo_password"),
    "ip": ("vllm_host_ip",),
    "role": ("bootstrap_role",),
    "gpus": ("bootstrap_gpus",),
    "replica": ("bootstrap_replica",),
    "env": ("bootstrap_env",),
}
#: the pool's models (the native format's models:), read from all.vars only
MODELS_VAR = "bootstrap_models"
_ANSIBLE_KEYS = {logical: names[0] for logical, names in _ANSIBLE_VARS.items()}
#: The variables of bootstrap's own: any other bootstrap_* is a typo, not a variable to ignore.
_BOOTSTRAP_VARS = [n for names in _ANSIBLE_VARS.values() for n in names if n.startswith("bootstrap_")]
_GROUP_KEYS = ["hosts", "vars", "children"]

_Layer = tuple[Mapping[str, Any], _Loc]  # variables, and where that mapping is


def _ansible(root: dict, top: _Loc, environ: Mapping[str, str]):  # type: ignore[no-untyped-def]
    for key in root:
        if key != "all":
            top.keyname(root, key).fail(
                f"unknown top-level key {_quote(key)} next to 'all': in the Ansible format,"
                " put groups under all.children"
            )
    all_loc = top.key(root, "all")
    group = _expect_mapping(root["all"], all_loc, "a group with hosts, vars or children")
    all_vars = _expect_mapping(group.get("vars"), all_loc.key(group, "vars"))
    vars_loc = all_loc.key(group, "vars")
    bootstrap = all_vars.get("bootstrap")
    bootstrap_loc = vars_loc.key(all_vars, "bootstrap")
    _reject_jinja(bootstrap, bootstrap_loc)
    models_loc = vars_loc.key(all_vars, MODELS_VAR)
    _reject_jinja(all_vars.get(MODELS_VAR), models_loc)
    models, model_locs = _models(all_vars.get(MODELS_VAR), models_loc)
    cluster, defaults, facts = _cluster(bootstrap, bootstrap_loc, environ, pool=bool(models))
    facts["models"] = (models, model_locs, models_loc)

    walked: list[Any] = [0]  # the number of groups visited, then the host occurrences
    _walk_group(group, all_loc, [], walked, set(), top=True)
    occurrences: list[tuple[str, _Loc, list[_Layer], _Layer]] = walked[1:]
    if not occurrences:
        top.keyname(root, "all").at(field="all").fail(
            "no hosts: list them under all.hosts or all.children.<group>.hosts"
        )

    # A host listed in several groups is one host: group variables (outer groups first, in
    # file order), then its host variables (in file order); the last one set wins.
    order: list[str] = []
    group_layers: dict[str, list[_Layer]] = {}
    host_layers: dict[str, list[_Layer]] = {}
    first_loc: dict[str, _Loc] = {}
    layers_seen: dict[str, set[int]] = {}
    for name, name_loc, layers, host_layer in occurrences:
        if name not in first_loc:
            if len(order) == _MAX_HOSTS:
                name_loc.fail(_TOO_MANY_HOSTS)
            order.append(name)
            first_loc[name] = name_loc
            group_layers[name] = []
            host_layers[name] = []
            layers_seen[name] = set()
        for layer in layers:
            if id(layer[0]) not in layers_seen[name]:
                layers_seen[name].add(id(layer[0]))
                group_layers[name].append(layer)
        host_layers[name].append(host_layer)

    specs = []
    for name in order:
        loc = first_loc[name]
        values: dict[str, Any] = {"name": _host_name(name, loc)}
        locs: dict[str, _Loc] = {"name": loc}
        layers = group_layers[name] + host_layers[name]
        for logical, var_names in _ANSIBLE_VARS.items():
            found = _lookup(layers, var_names)
            if found is None:
                continue
            raw, var_loc = found
            _reject_jinja(raw, var_loc)
            locs[logical] = var_loc
            values[logical] = (become_password if logical == "become_password" else _HOST_FIELDS[logical])(raw, var_loc)
        if "address" not in values:
            values["address"] = _address(name, loc)
            locs["address"] = loc
        specs.append(_HostSpec(loc, values, locs, _ANSIBLE_KEYS))
    return (cluster, facts), defaults, specs


_MAX_GROUP_VISITS = 10_000


def _walk_group(
    group: dict,
    loc: _Loc,
    layers: list[_Layer],
    out: list,
    active: set[int],
    top: bool = False,
) -> None:
    """Collect (name, where, group variable layers, host variables) for every host listed.

    `active` holds the groups being walked (a group inside itself is an error); out[0] counts the
    groups visited and len(out) - 1 the hosts listed, so YAML aliases cannot make the walk explode.
    """
    out[0] += 1
    if len(active) > 100 or out[0] > _MAX_GROUP_VISITS:
        loc.fail("the groups are nested too deeply or repeated too often (YAML aliases?)")
    for key in group:
        if not isinstance(key, str) or key not in _GROUP_KEYS:
            shown = key if isinstance(key, str) else str(key)
            loc.keyname(group, key).fail(_unknown_key(shown, _GROUP_KEYS, "group key"))
    vars_loc = loc.key(group, "vars")
    group_vars = _expect_mapping(group.get("vars"), vars_loc, "a mapping of variables")
    _check_bootstrap_vars(group_vars, vars_loc, top)
    layers = layers + [(group_vars, vars_loc)]

    hosts_loc = loc.key(group, "hosts")
    hosts = _expect_mapping(group.get("hosts"), hosts_loc, "a mapping of host names")
    if len(out) - 1 + len(hosts) > _MAX_HOST_OCCURRENCES:
        hosts_loc.fail(
            f"the groups list hosts more than {_MAX_HOST_OCCURRENCES} times (YAML aliases"
            " repeating a group?); list each host in a few groups"
        )
    for name, host_vars in hosts.items():
        name_loc = hosts_loc.keyname(hosts, name).at(field=_join(hosts_loc.field, name))
        if not isinstance(name, str):
            name_loc.fail(f"a host name must be a string, got {_describe(name)}")
        var_loc = hosts_loc.key(hosts, name)
        host_vars = _expect_mapping(host_vars, var_loc, "a mapping of host variables")
        _check_bootstrap_vars(host_vars, var_loc, False)
        out.append((name, name_loc, layers, (host_vars, var_loc)))

    children_loc = loc.key(group, "children")
    children = _expect_mapping(group.get("children"), children_loc, "a mapping of groups")
    for child_name, child in children.items():
        child_loc = children_loc.key(children, child_name)
        if not isinstance(child_name, str):
            children_loc.keyname(children, child_name).fail(
                f"a group name must be a string, got {_describe(child_name)}"
            )
        if child is not None and id(child) in active | {id(group)}:
            child_loc.fail("this group contains itself")
        child = _expect_mapping(child, child_loc, "a group with hosts, vars or children")
        _walk_group(child, child_loc, layers, out, active | {id(group)})


_SSH_ARGS = ("bootstrap does not pass SSH arguments from the inventory (a ProxyJump or option here would be "
             "ignored): set all.vars.bootstrap.ssh (jump, port, key), or put it in ~/.ssh/config, which bootstrap "
             "reads")
#: Ansible connection variables bootstrap does not honour: set, they would silently do nothing.
_NOT_HONOURED = {
    "ansible_ssh_common_args": _SSH_ARGS, "ansible_ssh_extra_args": _SSH_ARGS, "ansible_ssh_args": _SSH_ARGS,
    "ansible_password": "bootstrap logs in with keys only: remove it and give a key (ansible_ssh_private_key_file)",
    "ansible_ssh_pass": "bootstrap logs in with keys only: remove it and give a key (ansible_ssh_private_key_file)",
    "ansible_ssh_password": "bootstrap logs in with keys only: remove it and give a key (ansible_ssh_private_key_file)",
    "ansible_su_pass": "bootstrap takes root with sudo, never su, so a su password here would be ignored: remove it "
                       "(give sudo's password as ansible_become_password, -K or $BOOTSTRAP_BECOME_PASSWORD)",
}
#: Ansible's become settings bootstrap takes only as it does it: root, by sudo (ansible_sudo* is
#: Ansible's older spelling of become with sudo).
_BECOME_AS = {"ansible_become_method": "sudo", "ansible_become_user": "root", "ansible_sudo_user": "root",
              "ansible_become": True, "ansible_sudo": True}
#: Every other variable of Ansible's privilege escalation (become, and the older sudo and su
#: spellings: another program, its flags, su) would be ignored: bootstrap runs sudo as it is.
_BECOME_FAMILY = re.compile(r"ansible_(become|sudo|su)(_[a-z_]+)?")
_TRUE_WORDS = {"true", "yes", "on", "y", "1"}


def _becomes_as(name: str, value: Any) -> bool:
    """The value of a _BECOME_AS variable is what bootstrap does (a boolean also as Ansible's words)."""
    want = _BECOME_AS[name]
    if want is True:
        return value is True or (isinstance(value, str) and value.strip().lower() in _TRUE_WORDS)
    return value == want


def _check_bootstrap_vars(variables: Mapping[Any, Any], loc: _Loc, top: bool) -> None:
    """Ansible ignores variables it does not know; bootstrap_* ones are ours, so a misspelt one
    would silently do nothing. Ansible's own connection variables that bootstrap does not honour are
    refused for the same reason, and `ansible_connection` other than ssh."""
    for name in variables:
        if isinstance(name, str) and name in _NOT_HONOURED:
            loc.keyname(variables, name).at(field=_join(loc.field, name)).fail(_NOT_HONOURED[name])
        if isinstance(name, str) and name in _BECOME_AS and not _becomes_as(name, variables[name]):
            if _BECOME_AS[name] is True:
                why, want = "; it needs root on every host, so turning become off would be ignored", "true"
            else:
                why, want = ", never as another user or by another method", _BECOME_AS[name]
            loc.keyname(variables, name).at(field=_join(loc.field, name)).fail(
                f"bootstrap takes root with sudo where the SSH user is not root{why}: remove {name} or set "
                f"it to {want}")
        elif (isinstance(name, str) and name not in _BECOME_AS and name not in _NOT_HONOURED
              and name not in _ANSIBLE_VARS["become_password"] and _BECOME_FAMILY.fullmatch(name)):
            loc.keyname(variables, name).at(field=_join(loc.field, name)).fail(
                f"bootstrap takes root with sudo as it is (no other program, flags or su) where the SSH user "
                f"is not root, so {name} would be ignored: remove it")
        if name == "ansible_connection" and variables[name] not in ("ssh", "paramiko", None):
            loc.keyname(variables, name).fail("bootstrap reaches every host over SSH: remove ansible_connection "
                                              "or set it to ssh")
        if isinstance(name, str) and name.startswith("ansible_") and not _known_ansible(name):
            loc.keyname(variables, name).fail(_unknown_ansible(name))
        if not isinstance(name, str) or not name.startswith("bootstrap"):
            continue
        if name == "bootstrap" and not top:
            loc.keyname(variables, name).fail("cluster settings are read only from all.vars.bootstrap")
        if name == MODELS_VAR:
            if not top:
                loc.keyname(variables, name).fail(f"the models are read only from all.vars.{MODELS_VAR}")
            continue
        if name.startswith("bootstrap_") and name not in _BOOTSTRAP_VARS:
            loc.keyname(variables, name).fail(_unknown_bootstrap_var(name))


#: names a user gives the cluster's settings, which are all.vars.bootstrap
_CLUSTER_VAR_GUESSES = ("bootstrap_cluster", "bootstrap_config", "bootstrap_settings", "bootstrap_vars")


def _unknown_bootstrap_var(name: str) -> str:
    """A bootstrap_* variable of none of ours: the closest among the hosts' variables, bootstrap_models
    (the pool) and bootstrap (the cluster's settings), each where it is read."""
    if name in _CLUSTER_VAR_GUESSES:
        return f"unknown variable {_quote(name)} (did you mean 'bootstrap'? the cluster's settings, in all.vars)"
    said = _unknown_key(name, [*_BOOTSTRAP_VARS, MODELS_VAR], "variable")
    if f"did you mean {_quote(MODELS_VAR)}?" in said:
        return said[:-1] + " the pool's models, in all.vars)"
    return said


#: The Ansible variables bootstrap reads (a misspelling of one is most likely what a typo meant).
_READ_ANSIBLE = [n for names in _ANSIBLE_VARS.values() for n in names if n.startswith("ansible_")]
#: Ansible's own variables that bootstrap leaves alone (they configure Ansible's own runs of this
#: file: accepted and ignored). Any other ansible_* is a typo: Ansible would ignore it silently.
_IGNORED_ANSIBLE = {
    "ansible_connection", "ansible_shell_type", "ansible_shell_executable", "ansible_ssh_executable",
    "ansible_ssh_pipelining", "ansible_pipelining", "ansible_ssh_transfer_method", "ansible_scp_extra_args",
    "ansible_sftp_extra_args", "ansible_sftp_batch_mode", "ansible_scp_if_ssh", "ansible_host_key_checking",
    "ansible_ssh_host_key_checking", "ansible_timeout", "ansible_ssh_timeout", "ansible_ssh_retries",
    "ansible_remote_tmp", "ansible_network_os", "ansible_control_path", "ansible_control_path_dir",
    "ansible_ssh_use_tty", "ansible_ssh_pkcs11_provider", "ansible_async_dir", "ansible_module_compression",
    "ansible_user_dir", "ansible_port_retries",
}
_IGNORED_ANSIBLE_FAMILY = re.compile(r"ansible_(\w+_interpreter|(winrm|psrp|paramiko|persistent|netconf|httpapi|"
                                     r"docker|podman|kubectl|network|libssh|aws_ssm)_\w+)")


def _known_ansible(name: str) -> bool:
    return (name in _READ_ANSIBLE or name in _IGNORED_ANSIBLE or name in _NOT_HONOURED or name in _BECOME_AS
            or bool(_BECOME_FAMILY.fullmatch(name) or _IGNORED_ANSIBLE_FAMILY.fullmatch(name)))


def _unknown_ansible(name: str) -> str:
    """A misspelt ansible_* variable: what it is most likely, first among those bootstrap reads."""
    for valid in (_READ_ANSIBLE, sorted(_IGNORED_ANSIBLE)):
        if _unknown_key(name, valid).find("did you mean") >= 0:
            return f"{_unknown_key(name, valid, 'Ansible variable')}: Ansible would ignore it, and so would bootstrap"
    return (f"unknown Ansible variable {_quote(name)}: Ansible would ignore it, and so would bootstrap; bootstrap"
            f" reads {', '.join(_READ_ANSIBLE)}")


def _lookup(layers: list[_Layer], names: tuple[str, ...]) -> tuple[Any, _Loc] | None:
    for variables, loc in reversed(layers):
        for name in names:
            if name in variables:
                return variables[name], loc.key(variables, name)
    return None


def _reject_jinja(value: Any, loc: _Loc, seen: set[int] | None = None) -> None:
    """Ansible would render "{{ ... }}"; we cannot, and must not pass it on literally."""
    if isinstance(value, str):
        if "{{" in value or "{%" in value:
            loc.fail("Jinja templates are not supported in what bootstrap reads; write the value")
        return
    seen = set() if seen is None else seen
    if id(value) in seen:  # a YAML alias seen before (or a recursive one)
        return
    seen.add(id(value))
    if isinstance(value, dict):
        for k, v in value.items():
            _reject_jinja(v, loc.key(value, k), seen)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _reject_jinja(v, loc.item(value, i), seen)
