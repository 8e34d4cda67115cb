"""Read an inventory file safely and parse it as YAML that remembers where every value is.

Only a regular file of at most `_MAX_FILE_BYTES` is read; the parser (`_Loader`) counts the values
it parses (at most `_MAX_NODES`), bounds the nesting and expands merge keys once, so a hostile
file costs little. Every mapping and list it builds (`_Map`, `_Seq`) knows the lines of its
entries, and `_Loc` turns them into one-line `InventoryError`s; the message helpers shared by the
rest of the package (`_quote`, `_describe`, `_unknown_key` ...) are here too.
"""
from __future__ import annotations

import difflib
import os
import re
import stat
import types
from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import yaml

from bootstrap.errors import InventoryError
from bootstrap.inventory.words import _one_line, _quote
from bootstrap.inventory.yamlsyntax import plain_syntax

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


# --------------------------------------------------------------------------------------------
# Locations and messages


@dataclass(frozen=True)
class _Loc:
    """Where a value is: the file, the field path and the 1-based line.

    A value reached through a YAML alias (`*a`, `<<: *a`) is reported at the line that uses the
    alias, what the user changes for this field; `source` is then the line the value is written on
    (inside the anchor), added to the message. Everything under such a value keeps the alias's line."""

    file: str
    field: str | None
    line: int | None
    source: int | None = None

    def fail(self, message: str) -> NoReturn:
        path = self.file if self.file.isprintable() and self.file else repr(self.file)
        field = _one_line(self.field) if self.field is not None else None
        if self.source is not None and self.source != self.line:
            message = f"{message} (through a YAML alias; the value is on line {self.source})"
        raise InventoryError(path, self.line, field, _one_line(message))

    def at(self, **changes: Any) -> _Loc:
        source = changes.get("source", None if "line" in changes else self.source)
        return _Loc(
            self.file, changes.get("field", self.field), changes.get("line", self.line), source
        )

    def key(self, mapping: Any, key: Any) -> _Loc:
        """The value under `key` of `mapping` (which is at self)."""
        written = getattr(mapping, "value_lines", {}).get(key)
        used = getattr(mapping, "alias_lines", {}).get(key)
        return self._reached(_join(self.field, key), written, used)

    def keyname(self, mapping: Any, key: Any) -> _Loc:
        """The key itself (reported against the mapping's field)."""
        written = getattr(mapping, "key_lines", {}).get(key)
        used = getattr(mapping, "key_alias_lines", {}).get(key)
        return self._reached(self.field, written, used)

    def item(self, seq: Any, index: int) -> _Loc:
        lines = getattr(seq, "item_lines", [])
        written = lines[index] if index < len(lines) else None
        used = getattr(seq, "alias_lines", {}).get(index)
        return self._reached(f"{self.field or ''}[{index}]", written, used)

    def sub(self, name: str) -> _Loc:
        """A field of the thing at self that is not in the file (same line)."""
        return _Loc(self.file, _join(self.field, name), self.line, self.source)

    def _reached(self, field: str | None, written: int | None, used: int | None) -> _Loc:
        """A part of the thing at self, written on line `written` (None: not known) and reached
        through an alias used on line `used` (None: written in place)."""
        if self.source is not None:  # inside an alias already: its line stays
            return _Loc(self.file, field, self.line, written or self.source)
        if used is not None:
            return _Loc(self.file, field, used, written)
        return _Loc(self.file, field, written or self.line)


def _join(parent: str | None, key: Any) -> str:
    return f"{parent}.{key}" if parent else str(key)


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


#: Names people write for a field, and the field they mean (when that field is one of those
#: expected): difflib alone matches `ipaddr` to 'address' by letters, not to `ip` by meaning.
_ALIASES = {
    **dict.fromkeys(("ipaddr", "ip_addr", "ip_address", "ipaddress", "ipv4", "ipv6", "data_ip", "private_ip",
                     "internal_ip", "node_ip", "host_ip"), "ip"),
    **dict.fromkeys(("host", "hostname", "host_name", "addr", "ssh_host", "fqdn", "public_ip"), "address"),
    **dict.fromkeys(("username", "ssh_user", "login"), "user"),
    **dict.fromkeys(("ssh_port",), "port"),
    **dict.fromkeys(("ssh_key", "key_file", "identity_file", "private_key"), "key"),
    **dict.fromkeys(("gpu", "num_gpus", "gpu_count", "ngpus"), "gpus"),
    **dict.fromkeys(("jump_host", "bastion", "proxy_jump", "proxyjump"), "jump"),
    **dict.fromkeys(("environment",), "env"),
}


def _unknown_key(key: str, valid: list[str] | tuple[str, ...], what: str = "key") -> str:
    alias = _ALIASES.get(key.lower().replace("-", "_"))
    close = [alias] if alias in valid else difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown {what} {_quote(key)} (did you mean {_quote(close[0])}?)"
    return f"unknown {what} {_quote(key)} (expected one of: {', '.join(valid)})"


# --------------------------------------------------------------------------------------------
# YAML with line numbers


class _Map(dict):
    """A YAML mapping that remembers the lines of its keys and values (where they are written), and
    for those reached through an alias (`key: *a`; a key and its value merged by `<<: *a`) the line
    of that alias."""

    line: int = 0
    key_lines: dict[Any, int]
    value_lines: dict[Any, int]
    key_alias_lines: dict[Any, int]
    alias_lines: dict[Any, int]


class _Seq(list):
    """A YAML sequence that remembers the lines of its items, and of the aliases among them."""

    line: int = 0
    item_lines: list[int]
    alias_lines: dict[int, int]


class _LoadError(yaml.MarkedYAMLError):
    #: the field being read, when the parser knows it
    field: str | None = None


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
        #: (parent node, index or key node) -> the line of the alias composed there, which uses it
        self.alias_uses: dict[tuple[Any, Any], int] = {}
        #: mapping node -> {key merged in: (the line of the alias its key came through, its value's)}
        self.merged_uses: dict[Any, dict[Any, tuple[int | None, int | None]]] = {}
        self.path: list[tuple[Any, Any]] = []  # (parent node, index or key node) of each value open
        super().__init__(stream)

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        self.nodes += 1
        self.path.append((parent, index))
        if self.nodes > _MAX_NODES:
            self.refuse(_too_big(), event.start_mark)
        # Python's stack grows with every level, the scanner's work per token with every flow one:
        # refuse deep nesting before either costs much.
        flow = int(isinstance(event, yaml.CollectionStartEvent) and bool(event.flow_style))
        if self.depth >= _MAX_DEPTH:
            self.refuse(f"invalid YAML: nested more than {_MAX_DEPTH} levels deep", event.start_mark)
        if self.flow_depth + flow > _MAX_FLOW_DEPTH:
            self.refuse(f"invalid YAML: [...] and {{...}} nested more than {_MAX_FLOW_DEPTH} levels deep",
                        event.start_mark)
        if isinstance(event, yaml.AliasEvent) and parent is not None and index is not None:
            self.alias_uses[(parent, index)] = event.start_mark.line + 1
        self.depth += 1
        self.flow_depth += flow
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
            self.flow_depth -= flow
            self.path.pop()

    def refuse(self, problem: str, mark: yaml.Mark) -> NoReturn:
        """Stop parsing: `problem` at `mark`, in the field being composed."""
        error = _LoadError(None, None, problem, mark)
        error.field = self.field()
        raise error

    def field(self) -> str | None:
        """The field path of the value being composed (`hosts[3].env.A`), None at the top."""
        field = None
        for parent, index in self.path:
            if isinstance(parent, yaml.SequenceNode):
                field = f"{field or ''}[{index}]"
            elif isinstance(parent, yaml.MappingNode):
                key = index.value if isinstance(index, yaml.ScalarNode) else "?"
                field = _join(field, key)
        return field

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Resolve the merge keys (`<<: *anchor`) of a mapping in place: its own keys win over
        merged ones, an earlier mapping in `<<: [*a, *b]` over a later one. Its own keys must be
        unique. Each mapping is resolved once and its keys merged as a dict (PyYAML copies every
        merged entry, so merges of merges grow exponentially); merged entries are counted."""
        if id(node) in self.flattened:
            return
        self.flattened.add(id(node))
        own, sources = self.merge_sources(node)
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
        uses: dict[Any, tuple[int | None, int | None]] = {}  # where each merged key was used
        for source, used in sources:
            self.flatten_mapping(source)
            self.merged += len(source.value)
            if self.merged > _MAX_NODES:
                raise _LoadError(None, None, _too_big(" once merge keys (<<) are expanded"), node.start_mark)
            inherited = self.merged_uses.get(source, {})
            for key_node, value_node in source.value:
                key = self.hashable_key(key_node)
                entries[key] = (key_node, value_node)
                uses[key] = (used, used) if used is not None else inherited.get(
                    key, (None, self.alias_uses.get((source, key_node))))
        for key_node, value_node in own:
            key = self.hashable_key(key_node)
            entries[key] = (key_node, value_node)
            uses.pop(key, None)
        node.value = list(entries.values())
        self.merged_uses[node] = uses

    def merge_sources(self, node: yaml.MappingNode) -> tuple[list[tuple[yaml.Node, yaml.Node]],
                                                             list[tuple[yaml.MappingNode, int | None]]]:
        """A mapping's own entries, and the mappings its merge keys name (those of `<<: [*a, *b]`
        last first), each with the line of the alias used."""
        own: list[tuple[yaml.Node, yaml.Node]] = []
        sources: list[tuple[yaml.MappingNode, int | None]] = []  # and the line of the alias used
        for key_node, value_node in node.value:
            if key_node.tag != _TAG + "merge":
                if key_node.tag == _TAG + "value":
                    key_node.tag = _TAG + "str"
                own.append((key_node, value_node))
            elif isinstance(value_node, yaml.MappingNode):
                sources.append((value_node, self.alias_uses.get((node, key_node))))
            elif isinstance(value_node, yaml.SequenceNode):
                for sub in value_node.value:
                    if not isinstance(sub, yaml.MappingNode):
                        raise _LoadError(None, None, f"invalid YAML: a merge key (<<) takes mappings,"
                                         f" got a {sub.id}", sub.start_mark)
                sources.extend(reversed([(sub, self.alias_uses.get((value_node, i)))
                                         for i, sub in enumerate(value_node.value)]))
            else:
                raise _LoadError(None, None, "invalid YAML: a merge key (<<) takes a mapping or a list of"
                                 f" mappings, got a {value_node.id}", value_node.start_mark)
        return own, sources

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
    data.key_alias_lines = {}
    data.alias_lines = {}
    yield data
    loader.flatten_mapping(node)  # checks the keys; resolves `<<: *anchor`; explicit keys win
    merged = loader.merged_uses.get(node, {})
    for key_node, value_node in node.value:
        key = loader.hashable_key(key_node)
        data[key] = loader.construct_object(value_node)
        data.key_lines[key] = key_node.start_mark.line + 1
        data.value_lines[key] = value_node.start_mark.line + 1
        key_used, value_used = merged.get(key) or (None, loader.alias_uses.get((node, key_node)))
        if key_used is not None:
            data.key_alias_lines[key] = key_used
        if value_used is not None:
            data.alias_lines[key] = value_used


def _construct_seq(loader: _Loader, node: yaml.Node):  # type: ignore[no-untyped-def]
    if not isinstance(node, yaml.SequenceNode):
        raise _LoadError(None, None, f"invalid YAML: a {node.id} cannot be a !!seq", node.start_mark)
    data = _Seq()
    data.line = node.start_mark.line + 1
    data.item_lines = [item.start_mark.line + 1 for item in node.value]
    uses = ((i, loader.alias_uses.get((node, i))) for i in range(len(node.value)))
    data.alias_lines = {i: line for i, line in uses if line is not None}
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
        plain = None if isinstance(e, _LoadError) else plain_syntax(e, text)
        if plain is not None:
            at, column, words = plain
            raise InventoryError(file if file.isprintable() else repr(file), at + 1, None,
                                 _one_line(f"invalid YAML: {words}"), column + 1) from None
        if "\\t" in repr(problem) or "\t" in problem:
            nowhere.at(line=line).fail(
                "invalid YAML: a tab character cannot be used here; indent with spaces"
            )
        if isinstance(e, _LoadError):
            nowhere.at(line=line, field=e.field).fail(problem)
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
