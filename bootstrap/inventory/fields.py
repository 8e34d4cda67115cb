"""The validators of single values and of the cluster settings: (value, loc) -> converted value.

Each field of the file is checked by a small table (field -> validator, e.g. `_CLUSTER_FIELDS`,
`_HOST_FIELDS`); `_cluster` builds the `Cluster` and checks the rules within it (ports, mounts,
secrets, router, monitor). `_HostSpec` is what both formats make of a host entry.
"""
from __future__ import annotations

import ipaddress
import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from bootstrap.inventory import secretrules as SR
from bootstrap.inventory.yamlfile import (
    _MAX_HOSTS,
    _describe,
    _int_text,
    _Loc,
    _Map,
    _quote,
    _unknown_key,
)
from bootstrap.model import (
    HF_CACHE_IN_CONTAINER,
    MAX_GPUS_PER_HOST,
    NOFILE_MAX,
    PLAN_ENV,
    ROUTER_POLICIES,
    Cluster,
    Monitor,
    Ports,
    Router,
    Secret,
    SSHSettings,
    Vip,
)

# --------------------------------------------------------------------------------------------
# Validators: (value, loc) -> converted value; they raise through loc.fail.

Validator = Callable[[Any, _Loc], Any]


def _expect_mapping(value: Any, loc: _Loc, what: str = "a mapping") -> dict:
    if value is None:
        return _Map()
    if not isinstance(value, dict):
        loc.fail(f"expected {what}, got {_describe(value)}")
    return value


def _expect_str(value: Any, loc: _Loc) -> str:
    if not isinstance(value, str):
        loc.fail(f"expected a string, got {_describe(value)}")
    if "\x00" in value:
        loc.fail("must not contain a NUL character")
    return value


def accepts(validator: Validator) -> str:
    """What a field's validator takes, in words (the inventory reference prints it; every validator
    of a field says it, which tests/inventory/test_reference.py checks)."""
    text = getattr(validator, "accepts", "")
    return text() if callable(text) else text


def _described(text: str, validator: Validator) -> Validator:
    """A validator (a function or a lambda) with its `accepts` set."""
    validator.accepts = text
    return validator


def _string(value: Any, loc: _Loc) -> str:
    value = _expect_str(value, loc)
    if not value:
        loc.fail("must not be empty")
    return value


def _pattern(rx: str, hint: str) -> Validator:
    compiled = re.compile(rx)

    def check(value: Any, loc: _Loc) -> str:
        value = _string(value, loc)
        if not compiled.fullmatch(value):
            loc.fail(f"{_quote(value)} is not valid: {hint}")
        return value

    check.accepts = hint
    return check


def _int(lo: int | None = None, hi: int | None = None) -> Validator:
    def check(value: Any, loc: _Loc) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            loc.fail(f"expected an integer, got {_describe(value)}")
        if lo is not None and hi is not None and not lo <= value <= hi:
            loc.fail(f"must be between {lo} and {hi}, got {_int_text(value)}")
        if lo is not None and value < lo:
            loc.fail(f"must be at least {lo}, got {_int_text(value)}")
        if hi is not None and value > hi:
            loc.fail(f"must be at most {hi}, got {_int_text(value)}")
        return value

    check.accepts = ("an integer" + (f" from {lo}" if lo is not None else "")
                     + (f" to {hi}" if hi is not None else ""))
    return check


_port = _int(1, 65535)


def _nofile(value: Any, loc: _Loc) -> int:
    value = _int(1024)(value, loc)
    if value > NOFILE_MAX:
        loc.fail(
            f"must be at most {NOFILE_MAX} (the kernel's default fs.nr_open: docker cannot set a"
            f" higher limit), got {_int_text(value)}"
        )
    return value


#: The longest timeout: a week. More is a typo (and would overflow the clocks it is given to).
_MAX_SECONDS = 7 * 24 * 3600


def _positive_number(value: Any, loc: _Loc) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        loc.fail(f"expected a number of seconds, got {_describe(value)}")
    shown = _int_text(value) if isinstance(value, int) else value
    if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
        loc.fail(f"must be a positive number of seconds, got {shown}")
    if value > _MAX_SECONDS:
        loc.fail(f"must be at most {_MAX_SECONDS} seconds (a week), got {shown}")
    return float(value)


def _bool(value: Any, loc: _Loc) -> bool:
    if not isinstance(value, bool):
        loc.fail(f"expected true or false, got {_describe(value)}")
    return value


def _choice(*options: str) -> Validator:
    def check(value: Any, loc: _Loc) -> str:
        if value not in options or not isinstance(value, str):
            loc.fail(f"expected {' or '.join(options)}, got {_describe(value)}")
        return value

    check.accepts = " or ".join(f"`{o}`" for o in options)
    return check


def _optional(inner: Validator) -> Validator:
    def check(value: Any, loc: _Loc) -> Any:
        return None if value is None else inner(value, loc)

    check.accepts = lambda: accepts(inner)  # read when asked: inner's may be set later in this module
    return check


def _list(inner: Validator) -> Validator:
    def check(value: Any, loc: _Loc) -> tuple:
        if value is None:
            return ()
        if not isinstance(value, list):
            loc.fail(f"expected a list, got {_describe(value)}")
        return tuple(inner(item, loc.item(value, i)) for i, item in enumerate(value))

    check.accepts = lambda: f"a list, each {accepts(inner)}"
    return check


def _path(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    if value.startswith("-"):
        loc.fail(f"{_quote(value)} must not start with '-'")
    return os.path.expanduser(value)


class _Offline(dict):
    """The caller's environment when nothing will be applied (plan): listed secrets may be unset."""


def _remote_abs_path(value: Any, loc: _Loc) -> str:
    """A path on the hosts: absolute, and never expanded with this machine's home directory. It
    becomes the source of a docker mount, so it holds none of the separators of one."""
    value = _string(value, loc)
    if not value.startswith("/"):
        loc.fail(f"{_quote(value)} must be an absolute path on the hosts (~ would be this machine's home)")
    for sep in ":,":
        if sep in value:
            loc.fail(f"{_quote(value)} must not contain {sep!r}: it separates the parts of a docker mount")
    return value


def _abs_path(value: Any, loc: _Loc) -> str:
    path = _path(value, loc)
    if not path.startswith("/"):
        loc.fail(f"{_quote(value)} must be an absolute path")
    if ":" in path:
        loc.fail(f"{_quote(value)} must not contain ':' (it separates the parts of a docker mount)")
    return path


_NAME_RX = r"[a-z0-9][a-z0-9-]*"
_CONTAINER_RX = r"[a-zA-Z0-9][a-zA-Z0-9_.-]*"
_HOST_NAME_RX = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER_RX = r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?"
_HOSTNAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_VOLUME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# Docker image references (github.com/distribution/reference): [registry[:port]/]path[:tag][@digest]
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::[0-9]+)?)"
_PATH_PART = r"(?:[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)"
_IMAGE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_SHELL_CHARS = set(";|&$`()<>'\"\\*?!{}[]#~")


def image_problem(value: str, off: str = "") -> str | None:
    """Why `value` is not an image reference Docker takes (None: it is one). The inventory's
    cluster.image and the command line's --image are checked alike; a word for a switch
    (_SWITCH_WORDS) is no image's name (`off`: how to turn the setting off, where it can be)."""
    if not value:
        return "must not be empty"
    word = _SWITCH_WORDS.get(value.lower())
    if word is not None:
        fix = off if word == "off" and off else "give an image reference, e.g. vllm/vllm-openai:v0.32.0"
        return f"{_quote(value)} is a word for {word}, not an image name: {fix}"
    for ch in value:
        if ch.isspace():
            return f"{_quote(value)} is not a valid image reference: it contains whitespace"
        if ch in _SHELL_CHARS:
            return f"{_quote(value)} is not a valid image reference: it contains {ch!r}"
    name = value.split("@", 1)[0]
    if not _IMAGE.fullmatch(value) or len(name) > 255:
        hint = " (repository names are lowercase)" if any(c.isupper() for c in name) else ""
        return (f"{_quote(value)} is not a valid image reference{hint}: expected "
                "[registry[:port]/]name[:tag][@digest], e.g. vllm/vllm-openai:v0.32.0")
    return None


#: Words that read as a switch, never as an image's name (YAML 1.2 takes `no`, `off` unquoted as text;
#: YAML 1.1, Ansible's, also `y` and `n`).
_SWITCH_WORDS = {**dict.fromkeys(("no", "n", "false", "off", "none", "null", "disabled", "disable"), "off"),
                 **dict.fromkeys(("yes", "y", "true", "on", "enabled", "enable"), "on")}


def _image(value: Any, loc: _Loc, off: str = "") -> str:
    value = _string(value, loc)
    why = image_problem(value, off)
    if why is not None:
        loc.fail(why)
    return value


def _image_or_off(value: Any, loc: _Loc) -> str:
    if value is False:
        return ""
    if isinstance(value, bool):
        loc.fail("expected an image reference or false")
    return _image(value, loc, off="write false (unquoted) to turn the mirror off")


_image_or_off.accepts = "an image reference, or false"  # type: ignore[attr-defined]

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _shm_size(value: Any, loc: _Loc) -> str:
    """A size docker takes: bytes, or a number with a unit; positive and below 2**63 bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0 or value >= 1 << 63:
            loc.fail(f"must be a positive size below 2**63 bytes, got {_int_text(value)}")
        return str(value)
    if not isinstance(value, str):
        loc.fail(f"expected a size like '10.24g', '512m' or 1073741824, got {_describe(value)}")
    m = re.fullmatch(r"([0-9]+|[0-9]+\.[0-9]+(?=[bkmgBKMG])|[0-9]+)([bkmgBKMG]?)", value)
    size = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()] if m else 0
    if not m or not 0 < size < 1 << 63:
        loc.fail(f"{_quote(value)} is not a size: expected e.g. '10.24g', '512m' or 1073741824")
    return value


def _mount(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    parts = value.split(":")
    usage = "expected SRC:DST[:ro|rw] with an absolute DST, e.g. /data/models:/models:ro"
    if len(parts) not in (2, 3) or not all(parts):
        loc.fail(f"{_quote(value)} is not a mount: {usage}")
    src, dst = parts[0], parts[1]
    if not (src.startswith("/") or _VOLUME.fullmatch(src)):
        loc.fail(f"{_quote(value)}: the source must be an absolute path or a volume name")
    if not dst.startswith("/"):
        loc.fail(f"{_quote(value)}: the destination {_quote(dst)} must be an absolute path")
    system = _system_path(dst)
    if system:
        loc.fail(f"{_quote(value)}: the destination {_quote(dst)} is {system}; mount under another"
                 " directory, e.g. /data")
    if len(parts) == 3 and parts[2] not in ("ro", "rw"):
        loc.fail(f"{_quote(value)}: the mode must be ro or rw, got {_quote(parts[2])}")
    return value


#: Where docker puts the kernel's file systems (a mount there hides them) and the directories of
#: the image's own system (a mount on one replaces it).
_KERNEL_MOUNTS = ("/proc", "/sys", "/dev")
_SYSTEM_DIRS = ("/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr")


def _system_path(path: str) -> str | None:
    """What a mount destination would hide, when it is / or a system path, else None."""
    norm = posixpath.normpath("/" + path.lstrip("/"))  # "//", "/a/../proc" ...
    if norm == "/":
        return "the container's root directory"
    for top in _KERNEL_MOUNTS:
        if norm == top or norm.startswith(top + "/"):
            return f"under {top}, which docker sets up for the container"
    if norm in _SYSTEM_DIRS:
        return "a system directory of the image"
    return None


_user = _pattern(_USER_RX, "a user name is letters, digits, '_', '.', '-'")


def _address(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    if _parse_ip(value, loc) is not None:
        return value  # unspecified, broadcast and multicast: in _identities, after the ip
    if "@" in value:
        loc.fail(f"{_quote(value)} is not a host: give the user in 'user', not in the address")
    if ":" in value:
        loc.fail(f"{_quote(value)} is not a host: give the port in 'port', not in the address")
    if not _HOSTNAME.fullmatch(value):
        loc.fail(f"{_quote(value)} is not a host name, an IP address or an ssh config alias")
    return value


def _jump(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    m = re.fullmatch(r"(?:([^@\s]+)@)?(\[[0-9A-Za-z:.%_]+\]|[^:@\s\[\]]+)(?::([0-9]+))?", value)
    ok = bool(m)
    if m:
        user, host, port = m.groups()
        ok = (user is None or re.fullmatch(_USER_RX, user) is not None) and (
            (host.startswith("[") and _parse_ip(host[1:-1], loc) is not None)
            or _HOSTNAME.fullmatch(host) is not None
            or _parse_ip(host, loc) is not None
        )
        ok = ok and (port is None or (len(port) <= 5 and 1 <= int(port) <= 65535))
    if not ok:
        loc.fail(f"{_quote(value)} is not a jump host: expected [user@]host[:port]")
    return value


_IP = ipaddress.IPv4Address | ipaddress.IPv6Address
#: An IPv6 zone (the part after '%' in fe80::1%eth0) is an interface name (IFNAMSIZ - 1 long).
_ZONE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def _parse_ip(text: str, loc: _Loc | None = None) -> _IP | None:
    """The IP address `text` is, else None. Python takes anything after '%' as an IPv6 zone, and
    it would reach ssh and docker command lines as it is: it must be an interface name (with loc,
    another zone is an error there; without, the text is not an address)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    zone = getattr(ip, "scope_id", None)
    if zone is not None and not _ZONE.fullmatch(zone):
        if loc is not None:
            loc.fail(
                f"{_quote(text)} has the zone {_quote(zone)}: after '%' comes an interface name"
                " (letters, digits, '_', '.', ':', '-'; at most 15)"
            )
        return None
    return ip


def _canonical_ip(ip: _IP) -> _IP:
    """The address to compare: an IPv4-mapped IPv6 address (::ffff:10.0.0.1) is the IPv4 one."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _not_one_host(ip: _IP) -> str | None:
    """Why `ip` cannot be the address of one host (it is every host's or a group's), or None."""
    plain = _canonical_ip(ip)
    if plain.is_unspecified:
        return "the unspecified address"
    if plain == _BROADCAST:
        return "the broadcast address"
    if plain.is_multicast:
        return "a multicast address"
    return None


def _ip(value: Any, loc: _Loc) -> str:
    """A host's data-plane IP, canonical: compressed IPv6, IPv4 for an IPv4-mapped address."""
    value = _string(value, loc)
    ip = _parse_ip(value, loc)
    if ip is None:
        loc.fail(f"{_quote(value)} is not an IPv4 or IPv6 address")
    plain = _canonical_ip(ip)
    if plain.is_loopback:
        loc.fail(
            f"{value} is a loopback address: Ray and NCCL would advertise it to the other nodes;"
            " give the address the other nodes reach this host on"
        )
    why = _not_one_host(ip)
    if why:
        loc.fail(f"{value} is {why}; give the address of this host")
    return str(plain)


def _network(value: Any, loc: _Loc) -> str:
    """An address or a network (CIDR) the fence admits, canonical; one that would not admit what it
    says (host bits, IPv4-mapped, a zone, multicast, loopback: bootstrap.cluster.guard.allow) is refused."""
    from bootstrap.cluster.guard.allow import entry_problem

    value = _string(value, loc)
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        loc.fail(f"{_quote(value)} is not an IP address or a network such as 10.0.0.0/24")
    net, why = entry_problem(value)
    if why:
        loc.fail(why)
    return str(net)


def _fence_allow(value: Any, loc: _Loc) -> tuple[str, ...]:
    """cluster.fence_allow: each entry a _network, and all of them together, per IP version after
    collapsing, within the fence's bound (bootstrap.cluster.guard.allow.BOUND)."""
    from bootstrap.cluster.guard.allow import union_problem

    entries = _list(_network)(value, loc)
    found = union_problem([ipaddress.ip_network(e) for e in entries])
    if found:
        loc.item(value, found[0]).fail(found[1])
    return entries


_DASHBOARD_HOSTS = ("data-plane", "localhost", "all")


def _dashboard_host(value: Any, loc: _Loc) -> str:
    """data-plane, localhost, all, or a literal IP (normalised) the head's dashboard binds."""
    value = _string(value, loc)
    if value in _DASHBOARD_HOSTS:
        return value
    ip = _parse_ip(value, loc)
    if ip is None:
        loc.fail(
            f"expected {', '.join(_DASHBOARD_HOSTS[:-1])} or {_DASHBOARD_HOSTS[-1]}"
            f" or an IP address, got {_quote(value)}"
        )
    why = _not_one_host(ip)
    if why and not ip.is_unspecified:  # 0.0.0.0 / :: bind every address of the head
        loc.fail(f"{value} is {why}; give an address of the head")
    return str(ip)


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


#: `ray start` options the plan sets or the fence and the ports table take as Ray's defaults -> where
#: the setting is made instead. Ray's CLI (click) takes no abbreviation, but the last of two values.
_RAY_OWNED = {
    "--head": "the host with role: head",
    "--address": "from the head's ip and {c}.ports.ray_gcs",
    "--node-ip-address": "each host's ip",
    "--port": "set {c}.ports.ray_gcs",
    "--gcs-server-port": "set {c}.ports.ray_gcs",
    "--dashboard-port": "set {c}.ports.dashboard",
    "--dashboard-host": "set {c}.dashboard_host",
    "--metrics-export-port": "set {c}.ports.ray_metrics",
    "--num-gpus": "from each host's gpus, checked with nvidia-smi",
    "--block": "the container's process",
    "--ray-client-server-port": "Ray's default 10001, which the fence covers",
    "--min-worker-port": "Ray's default range 10002-19999, which the fence covers",
    "--max-worker-port": "Ray's default range 10002-19999, which the fence covers",
    "--worker-port-list": "Ray's default range 10002-19999, which the fence covers",
    "--node-manager-port": "a port Ray picks in the ranges the fence covers",
    "--object-manager-port": "a port Ray picks in the ranges the fence covers",
    "--runtime-env-agent-port": "a port Ray picks in the ranges the fence covers",
    "--dashboard-agent-listen-port": "Ray's default, which the fence covers",
    "--dashboard-agent-grpc-port": "a port Ray picks in the ranges the fence covers",
    "--redis-password": "Ray's token authentication, {c}.ray_auth",
}


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


def _check_mapping(
    value: Any, loc: _Loc, fields: Mapping[str, Validator], what: str = "a mapping"
) -> tuple[dict[str, Any], dict[str, _Loc]]:
    """Validate a mapping against a table; returns the converted values and their locations."""
    mapping = _expect_mapping(value, loc, what)
    values: dict[str, Any] = {}
    locs: dict[str, _Loc] = {}
    for key, raw in mapping.items():
        kloc = loc.keyname(mapping, key)
        if not isinstance(key, str):
            kloc.fail(f"keys must be strings, got {_describe(key)}")
        if key not in fields:
            kloc.fail(_unknown_key(key, list(fields)))
        locs[key] = loc.key(mapping, key)
        values[key] = fields[key](raw, locs[key])
    return values, locs


# --------------------------------------------------------------------------------------------
# Cluster


@dataclass
class _SSHDefaults:
    """cluster.ssh user/port/key/jump: defaults for every host, with where they were set."""

    values: dict[str, Any] = field(default_factory=dict)
    locs: dict[str, _Loc] = field(default_factory=dict)
    known_hosts_loc: _Loc | None = None


_PORT_FIELDS: dict[str, Validator] = {"ray_gcs": _port, "dashboard": _port, "vllm": _port, "ray_metrics": _port,
                                       "image_copy": _port, "kv_transfer": _port}

_SSH_FIELDS: dict[str, Validator] = {
    "user": _optional(_user),
    "port": _optional(_port),
    "key": _optional(_path),
    "jump": _optional(_jump),
    "known_hosts": _optional(_path),
    "accept_new_host_keys": _bool,
    "connect_timeout": _positive_number,
    "command_timeout": _positive_number,
    "connect_retries": _int(0, 100),
}

_CLUSTER_FIELDS: dict[str, Validator] = {
    "name": _pattern(_NAME_RX, "lowercase letters, digits and '-', e.g. llama-405b"),
    "image": _image,
    "container_name": _pattern(
        _CONTAINER_RX, "letters, digits, '_', '.', '-', starting with a letter or digit"
    ),
    "accelerator": _choice("gpu", "none"),
    "runtime": _optional(_choice("ray", "none")),
    "gpus_per_node": _optional(_int(0, MAX_GPUS_PER_HOST)),
    "hf_cache": _optional(_remote_abs_path),
    "mounts": _list(_mount),
    "ipc_host": _bool,
    "shm_size": _shm_size,
    "ports": _described("a mapping: cluster.ports below", lambda v, loc: v),  # checked in _ports
    "env": _env,
    "secrets": _list(_env_name),
    "infiniband": _bool,
    "privileged": _bool,
    "nofile": _optional(_nofile),
    "load_image": _bool,
    "peer_copy": _bool,
    "image_mirror": _image_or_off,
    "ray_args": _list(_string),
    "dashboard_host": _dashboard_host,
    "ssh": _described("a mapping: cluster.ssh below", lambda v, loc: v),  # checked in _ssh
    "replicas": _int(1, _MAX_HOSTS),
    "standby": _bool,
    # checked in _router (needs the ports and the secrets) and _monitor (needs the ports)
    "router": _described("a mapping: cluster.router below", lambda v, loc: v),
    "monitor": _described("a mapping: cluster.monitor below", lambda v, loc: v),
    "fence": _bool,
    "fence_allow": _described("a list, each an IP address or a network (CIDR); together at most a /8 of IPv4 "
                              "and a /32 of IPv6", _fence_allow),
    "ray_auth": _choice("token", "off"),
}

_RETENTION_RX = re.compile(r"[1-9][0-9]*(ms|s|m|h|d|w|y)")
_RETENTION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 7 * 86_400_000,
                 "y": 365 * 86_400_000}
#: The longest retention: Prometheus refuses a duration past int64 nanoseconds (about 292 years)
#: and does not start; a century is already a typo.
MAX_RETENTION_YEARS = 100


def _retention(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    m = _RETENTION_RX.fullmatch(value)
    if not m:
        loc.fail(f"{_quote(value)} is not valid: a duration such as 15d, 12h or 2w")
    digits = value[:m.start(1)]
    if len(digits) > 20 or int(digits) * _RETENTION_MS[m.group(1)] > MAX_RETENTION_YEARS * _RETENTION_MS["y"]:
        loc.fail(f"{_quote(value)} is more than {MAX_RETENTION_YEARS} years (Prometheus would not start with it)")
    return value


_retention.accepts = f"a duration such as 15d, 12h or 2w, at most {MAX_RETENTION_YEARS}y"  # type: ignore[attr-defined]

_MONITOR_FIELDS: dict[str, Validator] = {
    "host": _described("the name of a host of the inventory", lambda v, loc: _host_name(v, loc)),
    "port": _port,
    "node_exporter_port": _port,
    "scrape_interval": _int(1, 3600),
    "retention": _retention,
    "image": _image,
    "node_exporter_image": _image,
    "dcgm": _bool,
    "dcgm_image": _image,
    "dcgm_port": _port,
}

def _vip_address(value: Any, loc: _Loc) -> tuple[str, int]:
    """An IPv4 address, optionally with its prefix length (10.0.0.100 or 10.0.0.100/24)."""
    value = _string(value, loc)
    text, _, plen = value.partition("/")
    try:
        ip = ipaddress.IPv4Address(text)
        prefix = int(plen) if plen else 32
        if not plen.isdigit() and plen or not 8 <= prefix <= 32:
            raise ValueError
    except ValueError:
        loc.fail(f"{_quote(value)} is not an IPv4 address with an optional prefix length (8-32), "
                 "e.g. 10.0.0.100 or 10.0.0.100/24")
    why = _not_one_host(ip) or ("a loopback address" if ip.is_loopback else None)
    why = why or ("a link-local address (the kernel's own, never routed)" if ip.is_link_local else None)
    net = ipaddress.IPv4Network(f"{ip}/{prefix}", strict=False)
    if prefix <= 30 and ip in (net.network_address, net.broadcast_address):
        why = f"the {'network' if ip == net.network_address else 'broadcast'} address of {net}"
    if why:
        loc.fail(f"{ip} is {why}: the floating address must be one the clients reach on the router hosts' network")
    return str(ip), prefix


_VIP_FIELDS: dict[str, Validator] = {
    "address": _vip_address,
    "id": _int(1, 255),
    "secret": _described("the name of a secret in cluster.secrets (VRRP's password)",
                         lambda v, loc: _secret_ref(v, loc)),
    "image": _image,
}


def _vip(value: Any, loc: _Loc) -> tuple[Vip, dict[str, _Loc]]:
    values, locs = _check_mapping(value, loc, _VIP_FIELDS,
                                  "a mapping with address (and optionally id, secret, image)")
    if "address" not in values:
        loc.fail("address is missing: the floating address clients use, e.g. {address: 10.0.0.100}")
    address, prefix = values.pop("address")
    return Vip(address=address, prefix=prefix, **values), locs


def _host_names(value: Any, loc: _Loc) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        loc.fail("a non-empty list of host names, e.g. [gpu-01, gpu-05]")
    out: list[str] = []
    for v in value:
        name = _host_name(v, loc)
        if name in out:
            loc.fail(f"{_quote(name)} is listed twice")
        out.append(name)
    return tuple(out)


_ROUTER_FIELDS: dict[str, Validator] = {
    "host": _described("the name of a host of the inventory", lambda v, loc: _host_name(v, loc)),
    "hosts": _described("a list of host names: each runs a router (with vip)", lambda v, loc: _host_names(v, loc)),
    "vip": _described("a mapping: the floating address", lambda v, loc: v),
    "port": _port,
    "policy": _choice(*ROUTER_POLICIES),
    "metrics_port": _port,
    "health_interval": _int(1, 60),
    "api_key": _described("the name of a secret in cluster.secrets (the key stays in your environment)",
                          lambda v, loc: _secret_ref(v, loc)),
    "prefill": _described("a list of replica numbers (0-based) that prefill; the others decode",
                          lambda v, loc: _replica_list(v, loc)),
    "kv_lease": _int(1, 3600),
}


def _replica_list(value: Any, loc: _Loc) -> tuple[int, ...]:
    """A list of distinct replica numbers (checked against cluster.replicas in _router)."""
    if not isinstance(value, list) or not value:
        loc.fail("a non-empty list of replica numbers (0-based), e.g. [0]: the replicas that prefill")
    out: list[int] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            loc.fail(f"{v!r} is not a replica number (0, 1, ...)")
        if v in out:
            loc.fail(f"replica {v} is listed twice")
        out.append(v)
    return tuple(out)

_API_KEY_HINT = ("name the secret in cluster.secrets that holds the key; the key itself belongs in your "
                 "environment, never in the inventory")


def _secret_ref(value: Any, loc: _Loc) -> str:
    """The name of a secret; the value is never echoed (it may be the key itself, pasted)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        loc.fail(f"not a secret's name: {_API_KEY_HINT}")
    return value


def _router(value: Any, loc: _Loc, ports: Ports, replicas: int = 1,
            secret_names: frozenset[str] | set[str] = frozenset()) -> tuple[Router, _Loc | None, _Loc | None]:
    """The router's settings, where its host(s) and its floating address were named (both checked
    against the hosts later).
    With replicas and no `router` mapping the defaults run, so their ports are checked too."""
    if value is None and replicas == 1:
        return Router(), None, None
    values, locs = _check_mapping(value, loc, _ROUTER_FIELDS) if value is not None else ({}, {})
    if replicas == 1 and values:
        key = next(iter(values))
        why = ("does nothing: with cluster.replicas: 1 no router runs and the endpoint would stay open; list "
               "VLLM_API_KEY under cluster.secrets instead (vLLM asks for it)" if "api_key" in values
               else f"does nothing with cluster.replicas: 1 (no router runs); remove {loc.field} or set replicas")
        locs["api_key" if "api_key" in values else key].fail(why)
    vip_locs: dict[str, _Loc] = {}
    if "vip" in values:
        values["vip"], vip_locs = _vip(values["vip"], locs["vip"])
    if "host" in values and "hosts" in values:
        locs["hosts"].fail("set host (one router) or hosts (routers behind cluster.router.vip), not both")
    if "hosts" in values and "vip" not in values and len(values["hosts"]) > 1:
        locs["hosts"].fail("routers on several hosts need a floating address in front of them: set "
                           f"{loc.field}.vip (e.g. {{address: 10.0.0.100}}), or name one host")
    if "vip" in values and len(values.get("hosts") or ()) == 1:
        locs["hosts"].fail("a floating address needs routers on two hosts or more (the default: the heads of the "
                           "first two replicas)")
    if "vip" in values and "host" in values:
        locs["host"].fail("with a floating address the routers run on cluster.router.hosts (default: the heads "
                          "of the first two replicas); use hosts")
    router = Router(**values)
    if router.vip is not None and router.vip.secret is not None and router.vip.secret not in secret_names:
        vip_locs["secret"].fail(f"that name is not listed in cluster.secrets: {_API_KEY_HINT}")
    for name in ("port", "metrics_port"):
        if name in values:
            _check_fixed(values[name], locs[name])
            _check_unprivileged(values[name], locs[name], "the router's container")
    taken = {getattr(ports, name): f"cluster.ports.{name}" for name in _PORT_FIELDS}
    for name in ("port", "metrics_port"):
        port = getattr(router, name)
        if port in taken:
            blame = locs.get(name, loc)
            blame.fail(f"{port} is also {taken[port]}; the router's ports must differ"
                       + ("" if name in values else f" (set {loc.field}.{name})"))
        taken[port] = f"{loc.field}.{name}"
    if router.api_key is not None and router.api_key not in secret_names:
        locs["api_key"].fail(f"that name is not listed in cluster.secrets: {_API_KEY_HINT}")
    if router.prefill:
        where = locs["prefill"]
        outside = [k for k in router.prefill if k >= replicas]
        if outside:
            where.fail(f"replica {outside[0]} is not a replica of this cluster: replicas are numbered 0 to "
                       f"{replicas - 1} (cluster.replicas: {replicas})")
        if len(router.prefill) >= replicas:
            where.fail(f"every replica would prefill and none decode: list fewer than cluster.replicas ({replicas}); "
                       "the replicas not listed decode")
        if router.port == ports.kv_transfer or router.metrics_port == ports.kv_transfer:
            where.fail(f"the router's ports and cluster.ports.kv_transfer ({ports.kv_transfer}) must differ")
    elif router.kv_lease is not None:
        locs["kv_lease"].fail("a KV lease needs prefill/decode disaggregation: set cluster.router.prefill too, "
                              "or remove kv_lease")
    return router, locs.get("hosts") or locs.get("host"), vip_locs.get("address") or locs.get("vip")


def _monitor(value: Any, loc: _Loc, ports: Ports, router: Router | None) -> tuple[Monitor, _Loc | None]:
    """Prometheus' settings, and where its host was named (checked against the hosts later). Its
    ports must differ from every other port a host of this cluster listens on."""
    values, locs = _check_mapping(value, loc, _MONITOR_FIELDS) if value is not None else ({}, {})
    mon = Monitor(**values)
    for name in ("port", "node_exporter_port", "dcgm_port"):
        if name in values:
            _check_fixed(values[name], locs[name])
            _check_unprivileged(values[name], locs[name], "Prometheus' and the exporters' containers")
    taken = {getattr(ports, name): f"cluster.ports.{name}" for name in _PORT_FIELDS}
    if router is not None:
        taken.update({router.port: "cluster.router.port", router.metrics_port: "cluster.router.metrics_port"})
    for name in ("port", "node_exporter_port", *(("dcgm_port",) if mon.dcgm else ())):
        port = getattr(mon, name)
        if port in taken:
            locs.get(name, loc).fail(f"{port} is also {taken[port]}; the monitor's ports must differ"
                                     + ("" if name in values else f" (set {loc.field}.{name})"))
        taken[port] = f"{loc.field}.{name}"
    return mon, locs.get("host")


#: Ports a cluster uses without a setting of their own (the one table every configured port is checked
#: against): (first, last, what holds them).
_FIXED_PORTS: tuple[tuple[int, int, str], ...] = (
    (22, 22, "the hosts' SSH port"),
    (10001, 10001, "Ray's client server"),
    (10002, 19999, "Ray's worker ports (10002-19999)"),
    (29500, 29899, "the range `serve` picks torch's rendezvous port from (29500-29899)"),
    (32768, 60999, "the hosts' ephemeral ports (Linux's default 32768-60999, net.ipv4.ip_local_port_range): any "
                   "outgoing connection may hold it when the container starts"),
)


def _fixed_port_clash(port: int) -> str | None:
    from bootstrap.model import NATIVE_COORD_PORT, NATIVE_MASTER_PORT

    if port in (NATIVE_MASTER_PORT, NATIVE_COORD_PORT):
        return "a fleet replica's torch rendezvous and coordination ports (29599-29600)"
    return next((what for lo, hi, what in _FIXED_PORTS if lo <= port <= hi), None)


def _check_fixed(port: int, loc: _Loc) -> None:
    what = _fixed_port_clash(port)
    if what is not None:
        loc.fail(f"{port} is taken by {what}: pick another port")


def _check_ssh_port(port: int, cluster: Cluster, loc: _Loc) -> None:
    """A host's SSH port (cluster.ssh.port, a host's port / ansible_port) is none of the ports the
    cluster uses on every host (bootstrap.cluster.guard.fence.port_table): Ray or a container would take
    it, and behind a NAT port forward the fence would keep that number open to the cluster's service."""
    from bootstrap.cluster.guard.fence import port_clash

    what = port_clash(cluster, port)
    if what is not None:
        loc.fail(f"{port} is {what}, a port the cluster uses on every host and the fence closes: SSH needs one of "
                 "its own; give sshd (or the forward to it) a port outside the cluster's (docs/security.md, The fence)")


def _check_unprivileged(port: int, loc: _Loc, who: str) -> None:
    """`who` runs with every capability dropped: it cannot bind a port below 1024."""
    if port < 1024:
        runs = "run" if who.endswith("containers") else "runs"
        loc.fail(f"{port} is below 1024: {who} {runs} with every capability dropped (no CAP_NET_BIND_SERVICE) and "
                 "could not listen there; pick a port of 1024 or above")


#: cluster.ports that containers without capabilities listen on (cluster/imagedist/plan.py).
_UNPRIVILEGED_PORTS = {"image_copy": "the image copy's and the registry mirror's containers"}


def _ports(value: Any, loc: _Loc) -> Ports:
    values, locs = _check_mapping(value, loc, _PORT_FIELDS)
    ports = Ports(**values)
    for name in values:
        _check_fixed(values[name], locs[name])
        if name in _UNPRIVILEGED_PORTS:
            _check_unprivileged(values[name], locs[name], _UNPRIVILEGED_PORTS[name])
    seen: dict[int, str] = {}
    for name in _PORT_FIELDS:
        port = getattr(ports, name)
        if port in seen:
            other = seen[port]
            blame, then = (name, other) if name in values else (other, name)
            where = f"cluster.ports.{then}" if then in values else f"the default {then} port"
            locs[blame].fail(f"{port} is also {where}; every port must be different")
        seen[port] = name
    return ports


def _ssh(value: Any, loc: _Loc) -> tuple[SSHSettings, _SSHDefaults]:
    values, locs = _check_mapping(value, loc, _SSH_FIELDS)
    defaults = _SSHDefaults(
        values={k: values[k] for k in ("user", "port", "key", "jump") if values.get(k) is not None},
        locs=locs,
        known_hosts_loc=locs.get("known_hosts"),
    )
    settings = SSHSettings(
        **{k: v for k, v in values.items() if k not in ("user", "port", "key", "jump")}
    )
    return settings, defaults


def _cluster(
    value: Any, loc: _Loc, environ: Mapping[str, str]
) -> tuple[Cluster, _SSHDefaults, dict[str, Any]]:
    """The Cluster, the ssh defaults for hosts, and facts the hosts need (gpus, env, secrets)."""
    values, locs = _check_mapping(value, loc, _CLUSTER_FIELDS)
    kwargs = {
        k: v
        for k, v in values.items()
        if k not in ("ports", "ssh", "env", "secrets", "gpus_per_node", "hf_cache", "router", "monitor")
    }
    kwargs["ports"] = _ports(values.get("ports"), locs.get("ports", loc.sub("ports")))
    settings, defaults = _ssh(values.get("ssh"), locs.get("ssh", loc.sub("ssh")))
    kwargs["ssh"] = settings
    kwargs["hf_cache"] = values.get("hf_cache")

    # Mounts: one destination once; the HF cache has its own.
    taken = {HF_CACHE_IN_CONTAINER: f"{loc.field}.hf_cache"} if kwargs["hf_cache"] else {}
    mounts = values.get("mounts", ())
    for i, mount in enumerate(mounts):
        dst = posixpath.normpath(mount.split(":")[1])
        if dst in taken:
            locs["mounts"].item(_raw(value, "mounts"), i).fail(
                f"{dst} is already mounted by {taken[dst]}"
            )
        taken[dst] = f"{loc.field}.mounts[{i}]"

    # What the plan gives `ray start` is set in one place: the inventory's field, not ray_args.
    for i, arg in enumerate(values.get("ray_args", ())):
        flag = arg.split("=", 1)[0].replace("_", "-") if arg.startswith("--") else ""
        if flag in _RAY_OWNED:
            locs["ray_args"].item(_raw(value, "ray_args"), i).fail(
                f"{flag} is what bootstrap gives `ray start` ({_RAY_OWNED[flag].format(c=loc.field)}): "
                "it is not passed through ray_args"
            )

    # Settings that would do nothing are refused, not ignored.
    if values.get("fence") is False and values.get("fence_allow"):
        locs["fence_allow"].fail(f"does nothing with {loc.field}.fence: false (no fence to admit anyone through)")
    if values.get("runtime") == "none" and values.get("ray_auth") == "token":
        locs["ray_auth"].fail(f"does nothing with {loc.field}.runtime: none (no Ray runs)")
    _check_mirror_and_standby(values, locs, loc)

    # Secrets: listed names must be set; by default HF_TOKEN when it is set.
    env = values.get("env", {})
    secrets: list[Secret] = []
    secret_locs: dict[str, _Loc] = {}
    if "secrets" in values:
        seq = _raw(value, "secrets")
        for i, name in enumerate(values["secrets"]):
            item_loc = secret_locs[name] = locs["secrets"].item(seq, i).at(field=locs["secrets"].field)
            why = SR.name_problem(name)
            if why:
                item_loc.fail(why)
            if name in values["secrets"][:i]:
                item_loc.fail(f"{name} is listed twice")
            if name not in environ and isinstance(environ, _Offline):
                secrets.append(Secret(name, ""))  # offline plan: shown by name only
                continue
            if name not in environ:
                item_loc.fail(f"{name} is not set in your environment")
            if not environ[name]:
                item_loc.fail(f"{name} is set but empty in your environment")
            if not environ[name].strip():
                item_loc.fail(f"{name} is set but blank in your environment (only whitespace)")
            if _BREAKS_ENV_FILE.search(environ[name]):
                item_loc.fail(_BROKEN_SECRET.format(name=name))
            secrets.append(Secret(name, environ[name]))
    elif environ.get("HF_TOKEN", "").strip() and "HF_TOKEN" not in env:  # blank: unset, like empty
        if _BREAKS_ENV_FILE.search(environ["HF_TOKEN"]):
            loc.sub("secrets").fail(_BROKEN_SECRET.format(name="HF_TOKEN"))
        secrets.append(Secret("HF_TOKEN", environ["HF_TOKEN"]))
    secret_names = {s.name for s in secrets}
    for name, (_, vloc) in env.items():
        if name in secret_names:
            vloc.fail(_SECRET_IN_ENV.format(name=name))
    kwargs["secrets"] = tuple(secrets)
    kwargs["env"] = tuple(sorted((k, v) for k, (v, _) in env.items()))
    kwargs["router"], router_host_loc, vip_loc = _router(values.get("router"), locs.get("router", loc.sub("router")),
                                                kwargs["ports"], values.get("replicas", 1), secret_names)
    _secret_roles(value, locs.get("router", loc.sub("router")), kwargs["router"], secrets, secret_locs)
    kwargs["monitor"], monitor_host_loc = _monitor(
        values.get("monitor"), locs.get("monitor", loc.sub("monitor")), kwargs["ports"],
        kwargs["router"] if values.get("replicas", 1) > 1 else None)

    if kwargs["monitor"].dcgm and values.get("accelerator", "gpu") == "none":
        locs["monitor"].key(_raw(value, "monitor"), "dcgm").fail(
            "does nothing with accelerator: none (DCGM exports GPU metrics); remove it")

    cluster = Cluster(**kwargs)
    facts = {
        "gpus_per_node": (values.get("gpus_per_node"), locs.get("gpus_per_node")),
        "env": {k: v for k, (v, _) in env.items()},
        "secret_names": secret_names,
        "replicas_loc": locs.get("replicas"),
        "router_host_loc": router_host_loc,
        "vip_loc": vip_loc,
        "monitor_host_loc": monitor_host_loc,
    }
    return cluster, defaults, facts


def _check_mirror_and_standby(values: dict[str, Any], locs: dict[str, _Loc], loc: _Loc) -> None:
    """The mirror serves a cold `up` whose nodes pull (bootstrap.cluster.image.distribute): an image
    named for it does nothing when this machine streams the image or the image is pinned by digest.
    With peer_copy: false it is kept for a run that turns peer_copy on (the sandbox's inventory)."""
    if values.get("image_mirror"):
        if values.get("load_image"):
            locs["image_mirror"].fail(f"does nothing with {loc.field}.load_image: true (this machine streams the "
                                      "image, no node pulls); remove it or set it to false")
        if "@" in values.get("image", ""):
            locs["image_mirror"].fail(f"does nothing with an image pinned by digest ({loc.field}.image: the mirror "
                                      "cannot tag it back under that name, so the head pulls it and copies it to the "
                                      "others); remove it or set it to false")
    if "standby" in values and values.get("replicas", 1) == 1:
        locs["standby"].fail(f"does nothing with {loc.field}.replicas: 1 (standby serve containers stand beside "
                             "a fleet's replicas); remove it or set replicas")


def _secret_roles(cluster: Any, rloc: _Loc, router: Router, secrets: list[Secret],
                  secret_locs: dict[str, _Loc]) -> None:
    """secretrules.check_roles, told where cluster.router.api_key, .vip.secret and VLLM_API_KEY are."""
    raw = _raw(cluster, "router")
    vip = _raw(raw, "vip")
    vloc = rloc.key(raw, "vip") if vip is not None else rloc.sub("vip")
    where = {"api_key": rloc.key(raw, "api_key"), "vip.secret": vloc.key(vip, "secret")}
    if SR.API_KEY_ENV in secret_locs:
        where[SR.API_KEY_ENV] = secret_locs[SR.API_KEY_ENV]
    SR.check_roles(router, secrets, where)


#: A secret's value goes into a container's env file, one NAME=value per line: a newline or CR would
#: end it and start another variable, a NUL would cut it.
_BREAKS_ENV_FILE = re.compile(r"[\n\r\x00]")
_BROKEN_SECRET = ("{name} in your environment contains a newline, carriage return or NUL: it would not reach the "
                  "containers whole (and a newline would add a variable); fix the value (its value is never shown)")

_SECRET_IN_ENV = (
    "{name} is a secret (cluster.secrets): its value comes from your environment,"
    " not from the inventory"
)


def _raw(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


# --------------------------------------------------------------------------------------------
# Hosts (both formats produce _HostSpecs)


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
    (_string, "a non-empty string"),
    (_nofile, f"an integer from 1024 to {NOFILE_MAX}"),
    (_positive_number, "a positive number of seconds, at most a week"),
    (_bool, "`true` or `false`"),
    (_path, "a path on this machine (`~` is expanded), not starting with `-`"),
    (_remote_abs_path, "an absolute path on the hosts, without `:` or `,`"),
    (_abs_path, "an absolute path, without `:`"),
    (_image, "a Docker image reference (`repo[:tag]` or `repo@sha256:...`)"),
    (_shm_size, "a size: `10.24g`, `512m` or a number of bytes"),
    (_mount, "`SRC:DST[:ro|rw]`: an absolute host path or a volume name, and an absolute path in the container "
             "that is not a system directory"),
    (_address, "a host name, an IP address or a Host alias of ~/.ssh/config, without user or port"),
    (_jump, "a bastion, `[user@]host[:port]`"),
    (_ip, "an IPv4 or IPv6 address of this host (not the unspecified, broadcast or a multicast address)"),
    (_dashboard_host, "`localhost`, `data-plane`, `all` or an IP address"),
    (_env_name, "an environment variable name (letters, digits, `_`)"),
    (_env, "a mapping of environment variable names to values"),
    (_host_name, "a name: letters, digits, `_`, `.`, `-`, starting with a letter or digit"),
):
    _fn.accepts = _text

