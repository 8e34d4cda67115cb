"""Load an inventory file (native or Ansible YAML) into a validated `bootstrap.model.Inventory`.

Every problem is an `InventoryError` naming the file, the 1-based line and the field path
(``hosts[2].ip``, ``cluster.ports.vllm``), on one printable line. Pure: reads the inventory (and,
with check_files, stats the local ssh key / known_hosts and reads the key's first bytes); no
network, no SSH, no DNS.

The work is bounded whatever the file holds: only a regular file of at most `_MAX_FILE_BYTES` is
read, the YAML parser stops after `_MAX_NODES` values, merge keys and Ansible groups repeated
through aliases are counted as they are expanded, and at most `_MAX_HOSTS` hosts are accepted.

The shape of the file is checked by small tables (field -> validator); the rules that span fields
(defaults, one head, uniform GPUs, unique names/addresses/IPs, secrets) are in `_build_hosts` and
`_cluster`. Both formats are turned into the same `_HostSpec`s, so they are validated alike.
"""
from __future__ import annotations

import difflib
import ipaddress
import math
import os
import posixpath
import re
import shlex
import stat
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NoReturn

import yaml

from bootstrap.errors import InventoryError
from bootstrap.model import (
    HF_CACHE_IN_CONTAINER,
    NOFILE_MAX,
    Cluster,
    Host,
    Inventory,
    Monitor,
    ROUTER_POLICIES,
    Ports,
    Router,
    Secret,
    SSHSettings,
    SSHTarget,
)

__all__ = ["load_inventory"]

#: The largest inventory file read: 256 KiB holds 2000 hosts of 130 bytes (a name, an address,
#: an ip, the gpus) each. The pure-Python YAML parser reads blank lines at 1 us a byte and deep
#: indentation at 3 us (measured), so no file of this size costs it a second; a bigger one is
#: refused before it is read (4 MiB would cost 13 s).
_MAX_FILE_BYTES = 256 << 10
#: The most hosts in one inventory: Ray's documented scalability envelope is 2000 nodes per
#: cluster, and serve runs one model across them all (pipeline parallel = nodes).
_MAX_HOSTS = 2000
#: The most YAML values (scalars, lists, mappings, aliases) parsed: 16 per host at the limit
#: (name, address, ip, role, gpus and a few env variables, with their keys), under a second of
#: parsing; a bigger document is refused while it is parsed, before it is built or checked.
_MAX_NODES = 16 * _MAX_HOSTS
#: The most host entries visited in Ansible groups (a host may be listed in a few groups;
#: aliases can repeat a group many times).
_MAX_HOST_OCCURRENCES = 8 * _MAX_HOSTS


def load_inventory(
    path: str | os.PathLike[str],
    environ: Mapping[str, str] | None = None,
    *,
    check_files: bool = True,
    require_secrets: bool = True,
) -> Inventory:
    """Read and validate an inventory.

    environ supplies the values of `cluster.secrets` (default: os.environ). check_files=False skips
    the checks of local files (ssh keys, known_hosts), e.g. for `bootstrap plan` on a laptop, and
    with it or require_secrets=False, listed secrets may be unset (nothing will receive them).
    Raises InventoryError for every problem.
    """
    file = os.fsdecode(os.fspath(path))
    env = os.environ if environ is None else environ
    if not check_files or not require_secrets:
        env = _Offline(env)
    root, root_line = _read_yaml(file)
    top = _Loc(file, None, root_line)
    if root is None:
        top.at(line=None).fail(
            "the file is empty: expected a 'hosts:' list (or an Ansible 'all:' group)"
        )
    if not isinstance(root, dict):
        top.fail(
            f"expected a mapping with 'cluster:' and 'hosts:' at the top, got {_describe(root)}"
        )
    for key in root:
        if not isinstance(key, str):
            top.keyname(root, key).fail(f"keys must be strings, got {_describe(key)}")
    read = _ansible if "all" in root else _native
    (cluster, facts), ssh_defaults, specs = read(root, top, env)
    hosts = _build_hosts(specs, (cluster, facts), ssh_defaults, check_files)
    if check_files and ssh_defaults.known_hosts_loc and cluster.ssh.known_hosts is not None:
        _check_file(cluster.ssh.known_hosts, ssh_defaults.known_hosts_loc, private=False)
    return Inventory(path=file, cluster=cluster, hosts=hosts)


# --------------------------------------------------------------------------------------------
# Locations and messages


@dataclass(frozen=True)
class _Loc:
    """Where a value is: the file, the field path and the 1-based line."""

    file: str
    field: str | None
    line: int | None

    def fail(self, message: str) -> NoReturn:
        path = self.file if self.file.isprintable() and self.file else repr(self.file)
        field = _one_line(self.field) if self.field is not None else None
        raise InventoryError(path, self.line, field, _one_line(message))

    def at(self, **changes: Any) -> _Loc:
        return _Loc(
            self.file, changes.get("field", self.field), changes.get("line", self.line)
        )

    def key(self, mapping: Any, key: Any) -> _Loc:
        """The value under `key` of `mapping` (which is at self)."""
        lines = getattr(mapping, "value_lines", {})
        return _Loc(self.file, _join(self.field, key), lines.get(key, self.line))

    def keyname(self, mapping: Any, key: Any) -> _Loc:
        """The key itself (reported against the mapping's field)."""
        lines = getattr(mapping, "key_lines", {})
        return _Loc(self.file, self.field, lines.get(key, self.line))

    def item(self, seq: Any, index: int) -> _Loc:
        lines = getattr(seq, "item_lines", [])
        line = lines[index] if index < len(lines) else self.line
        return _Loc(self.file, f"{self.field or ''}[{index}]", line)

    def sub(self, name: str) -> _Loc:
        """A field of the thing at self that is not in the file (same line)."""
        return _Loc(self.file, _join(self.field, name), self.line)


def _join(parent: str | None, key: Any) -> str:
    return f"{parent}.{key}" if parent else str(key)


def _one_line(text: str) -> str:
    """The text with every character that is not printable (newlines, tabs, NUL, ESC ...) written
    as in a Python string literal, so that an error is one line a terminal shows as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _quote(text: str, limit: int = 60) -> str:
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return repr(text)


def _describe(value: Any, *, show: bool = True) -> str:
    """`string '22'`, `integer 5`, `a list` ... for "expected X, got Y" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {_int_text(value)}" if show else "an integer"
    if isinstance(value, float):
        return f"number {value}" if show else "a number"
    if isinstance(value, str):
        return f"string {_quote(value)}" if show else "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a value of type {type(value).__name__}"


def _int_text(value: int) -> str:
    """An integer as written, or its number of digits when it is too long to show."""
    text = str(value)
    digits = len(text.lstrip("-"))
    return text if digits <= 30 else f"{text[:1] if value < 0 else ''}<{digits}-digit number>"


def _unknown_key(key: str, valid: list[str] | tuple[str, ...], what: str = "key") -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown {what} {_quote(key)} (did you mean {_quote(close[0])}?)"
    return f"unknown {what} {_quote(key)} (expected one of: {', '.join(valid)})"


# --------------------------------------------------------------------------------------------
# YAML with line numbers


class _Map(dict):
    """A YAML mapping that remembers the lines of its keys and values."""

    line: int = 0
    key_lines: dict[Any, int]
    value_lines: dict[Any, int]


class _Seq(list):
    """A YAML sequence that remembers the lines of its items."""

    line: int = 0
    item_lines: list[int]


class _LoadError(yaml.MarkedYAMLError):
    pass


_TAG = "tag:yaml.org,2002:"
# YAML 1.1 resolves yes/no/on/off as booleans, 0644 as octal, 1:30 as 90 and 2024-01-01 as a
# date: surprising in an inventory. Use the small, YAML 1.2-like set below instead.
_REPLACED = {_TAG + t for t in ("bool", "int", "float", "timestamp", "value")}
#: The deepest nesting of lists and mappings: an inventory needs about 10 (each Ansible group
#: inside another adds two). In flow style ([...], {...}) 10 at most: PyYAML's scanner visits
#: every open flow level for every token, so 32000 values 30 levels deep took 1.4 s, 10 deep 0.9 s.
_MAX_DEPTH = 32
_MAX_FLOW_DEPTH = 10
#: The longest number read, in characters: no port, count or timeout is longer, and Python cannot
#: print integers of more than 4300 digits.
_MAX_NUMBER_CHARS = 100


class _Loader(yaml.SafeLoader):
    """SafeLoader with line numbers, the resolvers below and bounded work.

    Every value parsed is counted (`compose_node`) and merge keys are expanded once per mapping,
    as a dict (`flatten_mapping`), so neither a huge file nor aliases can make loading explode.
    Every constructor is `_located`: a value its tag cannot take is an error at its line.
    """

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        self.nodes = 0  # values parsed
        self.depth = 0  # collections open
        self.flow_depth = 0  # of them in flow style
        self.merged = 0  # entries copied by merge keys
        self.flattened: set[int] = set()  # mappings whose merge keys are resolved
        super().__init__(stream)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise _LoadError(None, None, _too_big(), event.start_mark)
        # Python's stack grows with every level, the scanner's work per token with every flow one:
        # refuse deep nesting before either costs much.
        flow = int(isinstance(event, yaml.CollectionStartEvent) and bool(event.flow_style))
        if self.depth >= _MAX_DEPTH:
            raise _LoadError(None, None, f"invalid YAML: nested more than {_MAX_DEPTH} levels deep",
                             event.start_mark)
        if self.flow_depth + flow > _MAX_FLOW_DEPTH:
            raise _LoadError(None, None, f"invalid YAML: [...] and {{...}} nested more than {_MAX_FLOW_DEPTH}"
                             " levels deep", event.start_mark)
        self.depth += 1
        self.flow_depth += flow
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
            self.flow_depth -= flow

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Resolve the merge keys (`<<: *anchor`) of a mapping in place: its own keys win over
        merged ones, an earlier mapping in `<<: [*a, *b]` over a later one. Its own keys must be
        unique. Each mapping is resolved once and its keys merged as a dict (PyYAML copies every
        merged entry, so merges of merges grow exponentially); merged entries are counted."""
        if id(node) in self.flattened:
            return
        self.flattened.add(id(node))
        own, sources = [], []
        for key_node, value_node in node.value:
            if key_node.tag != _TAG + "merge":
                if key_node.tag == _TAG + "value":
                    key_node.tag = _TAG + "str"
                own.append((key_node, value_node))
            elif isinstance(value_node, yaml.MappingNode):
                sources.append(value_node)
            elif isinstance(value_node, yaml.SequenceNode):
                for sub in value_node.value:
                    if not isinstance(sub, yaml.MappingNode):
                        raise _LoadError(None, None, f"invalid YAML: a merge key (<<) takes mappings,"
                                         f" got a {sub.id}", sub.start_mark)
                sources.extend(reversed(value_node.value))
            else:
                raise _LoadError(None, None, "invalid YAML: a merge key (<<) takes a mapping or a list of"
                                 f" mappings, got a {value_node.id}", value_node.start_mark)
        first: dict[Any, int] = {}
        for key_node, _ in own:
            key = self.hashable_key(key_node)
            if key in first:
                raise _LoadError(None, None, f"duplicate key {_quote(str(key))} (first on line {first[key]})",
                                 key_node.start_mark)
            first[key] = key_node.start_mark.line + 1
        if not sources:
            return
        entries: dict[Any, tuple[yaml.Node, yaml.Node]] = {}  # first place, last value wins
        for source in sources:
            self.flatten_mapping(source)
            self.merged += len(source.value)
            if self.merged > _MAX_NODES:
                raise _LoadError(None, None, _too_big(" once merge keys (<<) are expanded"), node.start_mark)
            for key_node, value_node in source.value:
                entries[self.hashable_key(key_node)] = (key_node, value_node)
        for key_node, value_node in own:
            entries[self.hashable_key(key_node)] = (key_node, value_node)
        node.value = list(entries.values())

    def hashable_key(self, key_node: yaml.Node) -> Any:
        key = self.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise _LoadError(None, None, "a list or mapping cannot be a key", key_node.start_mark) from None
        return key


def _too_big(how: str = "") -> str:
    return (
        f"the file holds more than {_MAX_NODES} YAML values{how}: more than an inventory of"
        f" {_MAX_HOSTS} hosts (the most accepted) needs"
    )


_Loader.add_implicit_resolver(
    _TAG + "bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    _TAG + "int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
)
_Loader.add_implicit_resolver(
    _TAG + "float",
    re.compile(
        r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9]+[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _construct_map(loader: _Loader, node: yaml.Node):  # type: ignore[no-untyped-def]
    if not isinstance(node, yaml.MappingNode):
        raise _LoadError(None, None, f"invalid YAML: a {node.id} cannot be a !!map", node.start_mark)
    data = _Map()
    data.line = node.start_mark.line + 1
    data.key_lines = {}
    data.value_lines = {}
    yield data
    loader.flatten_mapping(node)  # checks the keys; resolves `<<: *anchor`; explicit keys win
    for key_node, value_node in node.value:
        key = loader.hashable_key(key_node)
        data[key] = loader.construct_object(value_node)
        data.key_lines[key] = key_node.start_mark.line + 1
        data.value_lines[key] = value_node.start_mark.line + 1


def _construct_seq(loader: _Loader, node: yaml.Node):  # type: ignore[no-untyped-def]
    if not isinstance(node, yaml.SequenceNode):
        raise _LoadError(None, None, f"invalid YAML: a {node.id} cannot be a !!seq", node.start_mark)
    data = _Seq()
    data.line = node.start_mark.line + 1
    data.item_lines = [item.start_mark.line + 1 for item in node.value]
    yield data
    data.extend(loader.construct_object(item) for item in node.value)


def _short_number(construct: Callable[[Any, yaml.Node], Any]) -> Callable[[Any, yaml.Node], Any]:
    """A number constructor that refuses thousands of digits before converting them."""

    def check(loader: _Loader, node: yaml.Node) -> Any:
        text = loader.construct_scalar(node)
        if len(text) > _MAX_NUMBER_CHARS:
            raise _LoadError(
                None, None, f"invalid YAML: a number of {len(text)} characters is too long (at most"
                f" {_MAX_NUMBER_CHARS}); quote it if it is a string", node.start_mark)
        return construct(loader, node)

    return check


#: What a constructor raises when a value cannot have its tag (`!!int abc`, `!!bool maybe`,
#: `!!timestamp nope`, an integer too long to convert ...).
_BAD_VALUE = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError)


def _located(construct: Callable[[Any, yaml.Node], Any]) -> Callable[[Any, yaml.Node], Any]:
    """The constructor, with every failure turned into an error at the value's line."""

    def located(loader: _Loader, node: yaml.Node) -> Any:
        try:
            data = construct(loader, node)
        except _BAD_VALUE:
            raise _LoadError(None, None, _bad_value(node), node.start_mark) from None
        return _located_steps(data, node) if isinstance(data, types.GeneratorType) else data

    return located


def _located_steps(steps: Any, node: yaml.Node) -> Any:
    try:
        yield from steps
    except _BAD_VALUE:
        raise _LoadError(None, None, _bad_value(node), node.start_mark) from None


def _bad_value(node: yaml.Node) -> str:
    tag = node.tag.replace(_TAG, "!!", 1)
    if isinstance(node, yaml.ScalarNode):
        return f"invalid YAML: {_quote(node.value)} is not a valid {tag} value"
    return f"invalid YAML: this {node.id} is not a valid {tag} value"


_Loader.add_constructor(_TAG + "map", _construct_map)
_Loader.add_constructor(_TAG + "seq", _construct_seq)
for _name in ("int", "float"):
    _Loader.add_constructor(_TAG + _name, _short_number(_Loader.yaml_constructors[_TAG + _name]))
_Loader.yaml_constructors = {tag: _located(c) for tag, c in _Loader.yaml_constructors.items()}


def _read_text(file: str) -> str:
    """The inventory's text. Only a regular file is opened (a FIFO would block, /dev/zero never
    ends, opening some devices acts on them) and at most _MAX_FILE_BYTES are read."""
    nowhere = _Loc(file, None, None)
    if not file:
        nowhere.fail("no inventory file: the path is empty")
    if "\x00" in file:
        nowhere.fail("no such file: a path cannot contain a NUL character")
    try:
        _regular_file(os.stat(file), nowhere)
        # O_NONBLOCK: should the path be swapped for a FIFO after the stat, open does not wait.
        with open(file, "rb", opener=_open_nonblocking) as f:
            _regular_file(os.fstat(f.fileno()), nowhere)
            raw = f.read(_MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        nowhere.fail("no such file")
    except IsADirectoryError:
        nowhere.fail("is a directory, not an inventory file")
    except PermissionError:
        nowhere.fail("cannot read the file: permission denied")
    except OSError as e:
        nowhere.fail(f"cannot read the file: {e.strerror or e}")
    if len(raw) > _MAX_FILE_BYTES:
        nowhere.fail(_too_big_file(len(raw), more=True))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        nowhere.at(line=raw.count(b"\n", 0, e.start) + 1).fail("the file is not valid UTF-8")


def _open_nonblocking(path: str, flags: int) -> int:
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))


_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _regular_file(st: os.stat_result, loc: _Loc) -> None:
    if stat.S_ISDIR(st.st_mode):
        loc.fail("is a directory, not an inventory file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(st.st_mode)), "a special file")
        loc.fail(f"not a regular file ({kind}): give the path of the inventory file")
    if st.st_size > _MAX_FILE_BYTES:
        loc.fail(_too_big_file(st.st_size))


def _too_big_file(size: int, more: bool = False) -> str:
    shown = f"more than {_MAX_FILE_BYTES} bytes" if more else f"{size} bytes"
    return (
        f"the file is {shown}; an inventory is at most {_MAX_FILE_BYTES >> 10} KiB"
        f" (it holds at most {_MAX_HOSTS} hosts)"
    )


def _parser_line(loader: _Loader | None) -> int | None:
    return loader.get_mark().line + 1 if loader is not None else None


def _read_yaml(file: str) -> tuple[Any, int | None]:
    """The document and the line it starts on; (None, None) for an empty document."""
    text = _read_text(file)
    nowhere = _Loc(file, None, None)
    loader = None
    try:
        loader = _Loader(text)
        node = loader.get_single_node()
        if node is None:
            return None, None
        return loader.construct_document(node), node.start_mark.line + 1
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = e.problem or e.context or "invalid YAML"
        if "\\t" in repr(problem) or "\t" in problem:
            nowhere.at(line=line).fail(
                "invalid YAML: a tab character cannot be used here; indent with spaces"
            )
        if isinstance(e, _LoadError):
            nowhere.at(line=line).fail(problem)
        context = f" ({e.context})" if e.context and e.problem else ""
        nowhere.at(line=line).fail(f"invalid YAML: {problem}{context}")
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1 if isinstance(e.position, int) else None
        nowhere.at(line=line).fail(
            f"invalid YAML: the file contains the non-printable character {chr(e.character)!r}"
            f" (#x{e.character:04x}); write it as an escape in a double-quoted string"
            if isinstance(e.character, int)
            else "invalid YAML: the file contains a non-printable character"
        )
    except yaml.YAMLError as e:
        nowhere.fail(f"invalid YAML: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    except RecursionError:
        nowhere.at(line=_parser_line(loader)).fail("invalid YAML: nested too deeply")
    except _BAD_VALUE as e:  # not from a constructor (they are _located): say where the parser was
        nowhere.at(line=_parser_line(loader)).fail(f"invalid YAML: cannot read the document ({type(e).__name__})")
    finally:
        if loader is not None:
            loader.dispose()


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

    return check


def _optional(inner: Validator) -> Validator:
    def check(value: Any, loc: _Loc) -> Any:
        return None if value is None else inner(value, loc)

    return check


def _list(inner: Validator) -> Validator:
    def check(value: Any, loc: _Loc) -> tuple:
        if value is None:
            return ()
        if not isinstance(value, list):
            loc.fail(f"expected a list, got {_describe(value)}")
        return tuple(inner(item, loc.item(value, i)) for i, item in enumerate(value))

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


def _image(value: Any, loc: _Loc) -> str:
    value = _string(value, loc)
    for ch in value:
        if ch.isspace():
            loc.fail(f"{_quote(value)} is not a valid image reference: it contains whitespace")
        if ch in _SHELL_CHARS:
            loc.fail(f"{_quote(value)} is not a valid image reference: it contains {ch!r}")
    name = value.split("@", 1)[0]
    if not _IMAGE.fullmatch(value) or len(name) > 255:
        hint = " (repository names are lowercase)" if any(c.isupper() for c in name) else ""
        loc.fail(
            f"{_quote(value)} is not a valid image reference{hint}: expected "
            "[registry[:port]/]name[:tag][@digest], e.g. vllm/vllm-openai:v0.8.5"
        )
    return value


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
        ok = ok and (port is None or 1 <= int(port) <= 65535)
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


def _env_name(value: Any, loc: _Loc) -> str:
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        shown = _quote(value) if isinstance(value, str) else _describe(value)
        loc.fail(
            f"{shown} is not a valid environment variable name "
            "(letters, digits and '_', not starting with a digit)"
        )
    return value


#: The variables the plan sets in every container itself (bootstrap.cluster.plan.container_spec): neither
#: env nor secrets may set them.
_PLAN_ENV = {
    "VLLM_HOST_IP": "VLLM_HOST_IP is set by bootstrap from each host's ip; set the host's ip instead",
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
                                       "image_copy": _port}

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
    "runtime": _choice("ray", "none"),
    "gpus_per_node": _optional(_int(0)),
    "hf_cache": _optional(_remote_abs_path),
    "mounts": _list(_mount),
    "ipc_host": _bool,
    "shm_size": _shm_size,
    "ports": lambda v, loc: v,  # checked in _ports (needs the locations of every port)
    "env": _env,
    "secrets": _list(_env_name),
    "infiniband": _bool,
    "privileged": _bool,
    "nofile": _optional(_nofile),
    "load_image": _bool,
    "peer_copy": _bool,
    "ray_args": _list(_string),
    "dashboard_host": _dashboard_host,
    "ssh": lambda v, loc: v,  # checked in _ssh
    "replicas": _int(1, _MAX_HOSTS),
    "router": lambda v, loc: v,  # checked in _router (needs the ports and the secrets)
    "monitor": lambda v, loc: v,  # checked in _monitor (needs the ports)
}

_RETENTION_RX = re.compile(r"[1-9][0-9]*(ms|s|m|h|d|w|y)")

_MONITOR_FIELDS: dict[str, Validator] = {
    "host": lambda v, loc: _host_name(v, loc),
    "port": _port,
    "node_exporter_port": _port,
    "scrape_interval": _int(1, 3600),
    "retention": _pattern(_RETENTION_RX, "a duration such as 15d, 12h or 2w"),
    "image": _image,
    "node_exporter_image": _image,
    "dcgm": _bool,
    "dcgm_image": _image,
    "dcgm_port": _port,
}

_ROUTER_FIELDS: dict[str, Validator] = {
    "host": lambda v, loc: _host_name(v, loc),
    "port": _port,
    "policy": _choice(*ROUTER_POLICIES),
    "metrics_port": _port,
    "health_interval": _int(1, 60),
    "api_key": lambda v, loc: _secret_ref(v, loc),
}

_API_KEY_HINT = ("name the secret in cluster.secrets that holds the key; the key itself belongs in your "
                 "environment, never in the inventory")


def _secret_ref(value: Any, loc: _Loc) -> str:
    """The name of a secret; the value is never echoed (it may be the key itself, pasted)."""
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        loc.fail(f"not a secret's name: {_API_KEY_HINT}")
    return value


def _router(value: Any, loc: _Loc, ports: Ports, replicas: int = 1,
            secret_names: frozenset[str] | set[str] = frozenset()) -> tuple[Router, _Loc | None]:
    """The router's settings, and where its host was named (checked against the hosts later).
    With replicas and no `router` mapping the defaults run, so their ports are checked too."""
    if value is None and replicas == 1:
        return Router(), None
    values, locs = _check_mapping(value, loc, _ROUTER_FIELDS) if value is not None else ({}, {})
    router = Router(**values)
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
    return router, locs.get("host")


def _monitor(value: Any, loc: _Loc, ports: Ports, router: Router | None) -> tuple[Monitor, _Loc | None]:
    """Prometheus' settings, and where its host was named (checked against the hosts later). Its
    ports must differ from every other port a host of this cluster listens on."""
    values, locs = _check_mapping(value, loc, _MONITOR_FIELDS) if value is not None else ({}, {})
    mon = Monitor(**values)
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


def _ports(value: Any, loc: _Loc) -> Ports:
    values, locs = _check_mapping(value, loc, _PORT_FIELDS)
    ports = Ports(**values)
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

    # The dashboard's address is set in one place.
    if "dashboard_host" in values:
        for i, arg in enumerate(values.get("ray_args", ())):
            if arg == "--dashboard-host" or arg.startswith("--dashboard-host="):
                locs["ray_args"].item(_raw(value, "ray_args"), i).fail(
                    f"{_quote(arg)} conflicts with {loc.field}.dashboard_host:"
                    " set the dashboard's address only with dashboard_host"
                )

    # Secrets: listed names must be set; by default HF_TOKEN when it is set.
    env = values.get("env", {})
    secrets: list[Secret] = []
    if "secrets" in values:
        seq = _raw(value, "secrets")
        for i, name in enumerate(values["secrets"]):
            item_loc = locs["secrets"].item(seq, i).at(field=locs["secrets"].field)
            if name in _PLAN_ENV:
                item_loc.fail(_PLAN_ENV[name])
            if name in values["secrets"][:i]:
                item_loc.fail(f"{name} is listed twice")
            if name not in environ and isinstance(environ, _Offline):
                secrets.append(Secret(name, ""))  # offline plan: shown by name only
                continue
            if name not in environ:
                item_loc.fail(f"{name} is not set in your environment")
            if not environ[name]:
                item_loc.fail(f"{name} is set but empty in your environment")
            secrets.append(Secret(name, environ[name]))
    elif environ.get("HF_TOKEN") and "HF_TOKEN" not in env:
        secrets.append(Secret("HF_TOKEN", environ["HF_TOKEN"]))
    secret_names = {s.name for s in secrets}
    for name, (_, vloc) in env.items():
        if name in secret_names:
            vloc.fail(_SECRET_IN_ENV.format(name=name))
    kwargs["secrets"] = tuple(secrets)
    kwargs["env"] = tuple(sorted((k, v) for k, (v, _) in env.items()))
    kwargs["router"], router_host_loc = _router(values.get("router"), locs.get("router", loc.sub("router")),
                                                kwargs["ports"], values.get("replicas", 1), secret_names)
    kwargs["monitor"], monitor_host_loc = _monitor(
        values.get("monitor"), locs.get("monitor", loc.sub("monitor")), kwargs["ports"],
        kwargs["router"] if values.get("replicas", 1) > 1 else None)

    cluster = Cluster(**kwargs)
    facts = {
        "gpus_per_node": (values.get("gpus_per_node"), locs.get("gpus_per_node")),
        "env": {k: v for k, (v, _) in env.items()},
        "secret_names": secret_names,
        "replicas_loc": locs.get("replicas"),
        "router_host_loc": router_host_loc,
        "monitor_host_loc": monitor_host_loc,
    }
    return cluster, defaults, facts


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
    "gpus": _optional(_int(0)),
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


_REQUIRED = {
    "name": "a unique name for this host",
    "address": "the host name, IP address or ssh config alias SSH connects to",
}
_ZERO_GPUS = "must be at least 1 with accelerator gpu (use accelerator: none for CPU-only nodes)"


def _build_hosts(
    specs: list[_HostSpec],
    cluster_and_facts: tuple[Cluster, dict[str, Any]],
    defaults: _SSHDefaults,
    check_files: bool,
) -> tuple[Host, ...]:
    cluster, facts = cluster_and_facts
    _identities(specs, defaults)
    groups = _groups(specs, cluster.replicas, facts["replicas_loc"])
    heads = {id(_head(g, f" of replica {k}" if len(groups) > 1 else "")) for k, g in enumerate(groups)}
    group_of = {id(s): k for k, g in enumerate(groups) for s in g}
    gpus = _gpus(specs, cluster, facts)
    router_loc = facts["router_host_loc"]
    if router_loc is not None and cluster.router.host not in {s.values["name"] for s in specs}:
        router_loc.fail(f"{_quote(cluster.router.host)} is not a host of this inventory")
    monitor_loc = facts["monitor_host_loc"]
    if monitor_loc is not None and cluster.monitor.host not in {s.values["name"] for s in specs}:
        monitor_loc.fail(f"{_quote(cluster.monitor.host)} is not a host of this inventory")
    keys_checked: set[str] = set()
    hosts = []
    for spec, n_gpus in zip(specs, gpus):
        ssh = {
            opt: spec.values[opt] if spec.given(opt) else defaults.values.get(opt)
            for opt in ("user", "port", "key", "jump")
        }
        if check_files and ssh["key"] is not None and ssh["key"] not in keys_checked:
            keys_checked.add(ssh["key"])
            where = spec.where("key") if spec.given("key") else defaults.locs["key"]
            _check_file(ssh["key"], where, private=True)
        env = dict(facts["env"])
        for env_name, (env_value, env_loc) in (spec.values.get("env") or {}).items():
            if env_name in facts["secret_names"]:
                env_loc.fail(_SECRET_IN_ENV.format(name=env_name))
            env[env_name] = env_value
        hosts.append(
            Host(
                name=spec.values["name"],
                ssh=SSHTarget(address=spec.values["address"], **ssh),
                ip=spec.values["ip"],
                role="head" if id(spec) in heads else "worker",
                gpus=n_gpus,
                env=tuple(sorted(env.items())),
                replica=group_of[id(spec)],
            )
        )
    return tuple(hosts)


def _identities(specs: list[_HostSpec], defaults: _SSHDefaults) -> None:
    """Names, SSH targets (address and port) and data-plane IPs are unique; sets values["ip"]."""
    names: dict[str, str] = {}
    targets: dict[tuple[Any, int], str] = {}
    ips: dict[_IP, str] = {}  # canonical: ::ffff:10.0.0.1 is 10.0.0.1, 2001:0db8::1 is 2001:db8::1
    for spec in specs:
        for required, what in _REQUIRED.items():
            if not spec.given(required):
                spec.where(required).fail(f"required: {what}")
        name, address = spec.values["name"], spec.values["address"]
        if name in names:
            spec.where("name").fail(f"{_quote(name)} is already the name of {names[name]}")
        names[name] = spec.loc.field or name
        port = spec.values.get("port") or defaults.values.get("port") or 22
        address_ip = _parse_ip(address)
        target = (_canonical_ip(address_ip) if address_ip else address.lower(), port)
        if target in targets:
            spec.where("address").fail(
                f"{address} (port {port}) is already the address of {targets[target]}"
            )
        targets[target] = name
        if spec.given("ip"):
            ip = spec.values["ip"]
        elif address_ip is not None:
            ip = _ip(address, spec.where("ip").at(line=spec.where("address").line))
        else:
            spec.where("ip").fail(f"required because address {_quote(address)} is not an IP")
        why = _not_one_host(address_ip) if address_ip is not None else None
        if why:
            spec.where("address").fail(f"{address} is {why}; give the address SSH reaches this host on")
        key = _canonical_ip(ipaddress.ip_address(ip))
        if key in ips:
            spec.where("ip").fail(f"{ip} is already the ip of {ips[key]}")
        ips[key] = name
        spec.values["ip"] = ip


def _groups(specs: list[_HostSpec], replicas: int, loc: _Loc | None) -> list[list[_HostSpec]]:
    """The hosts split into `replicas` equal serving groups: a host's `replica` pins it, the others
    fill the groups in order."""
    n = len(specs)
    pinned = [s for s in specs if s.values.get("replica") is not None]
    if replicas == 1 and not pinned:
        return [list(specs)]
    where = loc or specs[0].loc.at(field="cluster.replicas")
    if replicas > n:
        where.fail(f"{replicas} replicas need at least {replicas} hosts; the inventory lists {n}")
    if n % replicas:
        where.fail(f"{replicas} replicas do not divide {n} hosts into equal groups"
                   f" (each replica is a full serving group: give {replicas} x k hosts)")
    size = n // replicas
    groups: list[list[_HostSpec]] = [[] for _ in range(replicas)]
    for s in pinned:
        k = s.values["replica"]
        if k >= replicas:
            s.where("replica").fail(f"{k} is not a replica of this cluster: replicas are numbered 0 to"
                                    f" {replicas - 1} (cluster.replicas: {replicas})")
        if len(groups[k]) == size:
            s.where("replica").fail(f"replica {k} already has {size} hosts: with {n} hosts and {replicas}"
                                    f" replicas every replica has {size}")
        groups[k].append(s)
    free = iter(s for s in specs if s.values.get("replica") is None)
    for g in groups:
        while len(g) < size:
            g.append(next(free))
    order = {id(s): i for i, s in enumerate(specs)}
    return [sorted(g, key=lambda s: order[id(s)]) for g in groups]


def _head(specs: list[_HostSpec], of: str = "") -> _HostSpec:
    """Exactly one head: the host that says so, else the first host not marked worker."""
    heads = [s for s in specs if s.values.get("role") == "head"]
    if len(heads) > 1:
        heads[1].where("role").fail(
            f"{heads[1].values['name']} is a second head ({heads[0].values['name']} is the head);"
            f" exactly one host may be the head{of}"
        )
    if heads:
        return heads[0]
    for spec in specs:
        if spec.values.get("role") is None:
            return spec
    specs[0].where("role").fail(f"every host{of} is a worker; make one host role: head")


def _gpus(specs: list[_HostSpec], cluster: Cluster, facts: dict[str, Any]) -> list[int | None]:
    """Each host's GPU count: None with accelerator none, else >= 1 and equal on every host."""
    per_node, per_node_loc = facts["gpus_per_node"]
    if cluster.accelerator == "none":
        if per_node:
            per_node_loc.fail(f"must be absent or 0 with accelerator none, got {per_node}")
        for spec in specs:
            if spec.values.get("gpus"):
                spec.where("gpus").fail(
                    f"must be absent or 0 with accelerator none, got {spec.values['gpus']}"
                )
        return [None] * len(specs)
    if per_node == 0:
        per_node_loc.fail(_ZERO_GPUS)
    reference = (per_node, per_node_loc.field) if per_node else None
    out = []
    for spec in specs:
        n = spec.values.get("gpus")
        if n is None and per_node is None:
            spec.where("gpus").fail(
                "required with accelerator gpu: set the host's gpus or cluster gpus_per_node"
            )
        n = per_node if n is None else n
        if n == 0:
            spec.where("gpus").fail(_ZERO_GPUS)
        if reference is None:
            reference = (n, spec.values["name"])
        elif n != reference[0]:
            spec.where("gpus").fail(
                f"{n} differs from {reference[0]} on {reference[1]}: the cluster must be uniform"
            )
        out.append(n)
    return out


def _check_file(path: str, loc: _Loc, *, private: bool) -> None:
    """A local file (ssh key, known_hosts) exists; a private key is one (not empty, not the public
    key) and is not open to others."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        loc.fail(f"{path}: no such file")
    except OSError as e:
        loc.fail(f"{path}: cannot be read: {e.strerror or e}")
    if not stat.S_ISREG(st.st_mode):
        loc.fail(f"{path} is not a file")
    if not os.access(path, os.R_OK):
        loc.fail(f"{path} is not readable by you")
    if private:
        _check_private_key(path, loc)
    mode = stat.S_IMODE(st.st_mode)
    if private and mode & 0o077:
        what = "readable" if mode & 0o044 else "accessible"
        loc.fail(
            f"{path} is {what} by others (mode {mode:04o}): run chmod 600 {shlex.quote(path)}"
        )


#: How public keys start: OpenSSH's one-line form (id_ed25519.pub, authorized_keys) and PEM/RFC 4716.
_PUBLIC_KEY = re.compile(
    rb"(?:(?:ssh|sk-ssh|ecdsa-sha2|sk-ecdsa-sha2)-[A-Za-z0-9@.-]+\s+AAAA"
    rb"|-----BEGIN (?:RSA |EC )?PUBLIC KEY-----|---- BEGIN SSH2 PUBLIC KEY ----)"
)


def _check_private_key(path: str, loc: _Loc) -> None:
    """The key file is not empty and not a public key (its first bytes are read, never shown)."""
    try:
        with open(path, "rb", opener=_open_nonblocking) as f:
            head = f.read(4096).lstrip()
    except OSError as e:
        loc.fail(f"{path}: cannot be read: {e.strerror or e}")
    if not head:
        loc.fail(f"{path} is empty: expected an SSH private key")
    if _PUBLIC_KEY.match(head):
        hint = f" ({path[:-4]}?)" if path.endswith(".pub") else ""
        loc.fail(f"{path} is a public key: give the private key{hint}")


_TOO_MANY_HOSTS = (
    f"more than {_MAX_HOSTS} hosts: bootstrap makes one Ray cluster, and Ray supports"
    f" {_MAX_HOSTS} nodes in one; split the machines into several clusters"
)


# --------------------------------------------------------------------------------------------
# Native format

_NATIVE_KEYS = {name: name for name in _HOST_FIELDS}


def _native(root: dict, top: _Loc, environ: Mapping[str, str]):  # type: ignore[no-untyped-def]
    for key in root:
        if key not in ("cluster", "hosts"):
            top.keyname(root, key).fail(_unknown_key(key, ["cluster", "hosts"], "top-level key"))
    cluster, defaults, facts = _cluster(root.get("cluster"), top.key(root, "cluster"), environ)
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


# --------------------------------------------------------------------------------------------
# Ansible YAML format

#: logical host field -> the Ansible variables that set it (first wins within one place).
_ANSIBLE_VARS: dict[str, tuple[str, ...]] = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "key": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "ip": ("vllm_host_ip",),
    "role": ("bootstrap_role",),
    "gpus": ("bootstrap_gpus",),
    "replica": ("bootstrap_replica",),
    "env": ("bootstrap_env",),
}
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
    cluster, defaults, facts = _cluster(bootstrap, bootstrap_loc, environ)

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
            values[logical] = _HOST_FIELDS[logical](raw, var_loc)
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


def _check_bootstrap_vars(variables: Mapping[Any, Any], loc: _Loc, top: bool) -> None:
    """Ansible ignores variables it does not know; bootstrap_* ones are ours, so a misspelt one
    would silently do nothing."""
    for name in variables:
        if not isinstance(name, str) or not name.startswith("bootstrap"):
            continue
        if name == "bootstrap" and not top:
            loc.keyname(variables, name).fail("cluster settings are read only from all.vars.bootstrap")
        if name.startswith("bootstrap_") and name not in _BOOTSTRAP_VARS:
            loc.keyname(variables, name).fail(_unknown_key(name, _BOOTSTRAP_VARS, "variable"))


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
