"""The validators of single values, pure: (value, loc) -> converted value, raising through loc.fail.

Strings, numbers, switches, choices, lists, paths, image references, sizes and mounts, and
`_check_mapping`, which checks a mapping against a table (field -> validator). `accepts` says in
words what a validator takes (the inventory reference prints it).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import os
import posixpath
import re
from typing import Any, Callable, Mapping

from bootstrap.errors import InventoryError
from bootstrap.inventory.yamlfile import _describe, _int_text, _Loc, _Map, _quote, _unknown_key
from bootstrap.model import NOFILE_MAX

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

_USER_RX = r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?"
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


def _check_mapping(
    value: Any, loc: _Loc, fields: Mapping[str, Validator], what: str = "a mapping"
) -> tuple[dict[str, Any], dict[str, _Loc]]:
    """Validate a mapping against a table; returns the converted values and their locations."""
    mapping = _expect_mapping(value, loc, what)
    values: dict[str, Any] = {}
    locs: dict[str, _Loc] = {}
    found = FOUND.get()
    for key, raw in mapping.items():
        try:
            kloc = loc.keyname(mapping, key)
            if not isinstance(key, str):
                kloc.fail(f"keys must be strings, got {_describe(key)}")
            if key not in fields:
                kloc.fail(_unknown_key(key, list(fields)))
            locs[key] = loc.key(mapping, key)
            values[key] = fields[key](raw, locs[key])
        except InventoryError as exc:
            if found is None:
                raise
            found.append(exc)  # validate: go on to the next key (this one is left out)
            locs.pop(key, None)
    return values, locs


#: `validate`'s linter run: the field errors found so far, each key of every table checked (None: the first
#: error stops the load, as for every other command). load_inventory(collect=True) sets it.
FOUND: contextvars.ContextVar[list[InventoryError] | None] = contextvars.ContextVar("inventory_errors", default=None)
#: those of FOUND that stand alone (gathered): what fails after them is no consequence of them
ALONE: contextvars.ContextVar[list[InventoryError] | None] = contextvars.ContextVar("inventory_alone", default=None)


@contextlib.contextmanager
def gathered():
    """A check that stands alone (a secret's value in this environment, a key file on this machine): in
    `validate`'s run (FOUND set) its error is recorded and the run goes on past the block, so that it never
    hides the file's other errors; in any other run it is raised."""
    try:
        yield
    except InventoryError as exc:
        found, alone = FOUND.get(), ALONE.get()
        if found is None or alone is None:
            raise
        found.append(exc)
        alone.append(exc)  # load_inventory keeps going past it


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
):
    _fn.accepts = _text
