"""PyYAML's syntax errors in plain words: for the mistakes a newcomer makes (indentation, a ':'
without a space, a tab, an unclosed bracket or quote) the line, the column, what is wrong and the
fix; the others keep PyYAML's words (bootstrap.inventory.yamlfile says them)."""
from __future__ import annotations

import re

import yaml

from bootstrap.inventory.words import _quote

#: `key:value` on a line: a key (not quoted, no space in it) and a ':' with no space after it.
_NO_SPACE = re.compile(r"^(\s*(?:-\s+)*)([^\s:#'\"\[\]{},&*!|>@`-][^\s:#]*):(?=[^\s/:\\])(\S*)")


def _content_lines(lines: list[str], before: int) -> list[int]:
    """The 0-based numbers of the lines above `before` that hold YAML (not blank, not a comment), nearest first."""
    return [n for n in range(min(before, len(lines)) - 1, -1, -1)
            if lines[n].strip() and not lines[n].lstrip().startswith("#")]


def _key_column(line: str) -> int:
    """The 0-based column of the first key (or value) on a line, after its indentation and `- ` marks."""
    stripped = re.match(r"\s*(?:-\s+)*", line)
    return stripped.end() if stripped else 0


def _no_space(lines: list[str], n: int) -> tuple[int, int, str] | None:
    m = _NO_SPACE.match(lines[n]) if 0 <= n < len(lines) else None
    if m is None:
        return None
    key, value = m[2], m[3]
    return (n, m.end(2), f"a ':' needs a space after it: write {_quote(f'{key}: {value}')} (a key, ': ', its value),"
            " or quote the value if the ':' is part of it")


def _mapping_values(lines: list[str], line: str, above: list[int], pm: yaml.Mark) -> tuple[int, int, str]:
    """PyYAML's "mapping values are not allowed here": a ':' without a space, a key indented more, ': ' in a value."""
    for n in above[:1]:
        found = _no_space(lines, n)
        if found:
            return found
        if len(line) - len(line.lstrip()) > _key_column(lines[n]) and re.search(r":\s+\S", lines[n]):
            return (pm.line, len(line) - len(line.lstrip()), "a key is indented differently from the keys above"
                    f" it: this one is indented more than the line above (line {n + 1}), whose key already has"
                    " its value; indent it like the other keys of its mapping")
    return (pm.line, pm.column, "a value has ': ' in it, which YAML reads as one more key: quote the value"
            " (\"...\"), or start a new line for the next key")


def _block_end(problem: str, lines: list[str], line: str, above: list[int], pm: yaml.Mark) -> tuple[int, int, str]:
    """PyYAML's "expected <block end>": a key or a list item indented differently, or text after a quoted value."""
    n = above[0]
    if "'-'" in problem:
        what = "a list item is indented differently from the items above it"
    elif "<scalar>" in problem and n == pm.line:
        return (pm.line, pm.column, "something follows a quoted value on the same line: put it inside the"
                " quotes, or start a new line for the next key")
    else:
        what = "a key is indented differently from the keys above it"
    col = len(line) - len(line.lstrip())
    return (pm.line, col, f"{what}: this line starts at column {col + 1}, line {n + 1} at column"
            f" {_key_column(lines[n]) + 1}; indent the keys of one mapping (the items of one list) the same,"
            " with spaces")


def plain_syntax(e: yaml.MarkedYAMLError, text: str) -> tuple[int, int, str] | None:
    """(0-based line, 0-based column, what is wrong and the fix) for PyYAML's syntax errors that a
    newcomer makes (indentation, a ':' without a space, a tab, an unclosed bracket or quote); None
    for the others, which keep PyYAML's words."""
    pm, cm = e.problem_mark, e.context_mark
    if pm is None:
        return None
    problem, context = e.problem or "", e.context or ""
    lines = text.splitlines()
    line = lines[pm.line] if pm.line < len(lines) else ""
    above = _content_lines(lines, pm.line)
    if "\t" in problem or "'\\t'" in problem:
        if "\t" in line[: len(line) - len(line.lstrip())]:
            return (pm.line, line.index("\t"), "a tab is used for indentation, and YAML cannot read a tab"
                    " character there: indent with spaces only")
        return (pm.line, pm.column, "a tab character cannot be used here; use spaces")
    if problem.startswith("mapping values are not allowed"):
        return _mapping_values(lines, line, above, pm)
    if problem.startswith("could not find expected ':'") and cm is not None:
        found = _no_space(lines, cm.line)
        if found:
            return found
        return (cm.line, cm.column, "this line is not 'key: value' (no ': ' after a key): add ': ' after the key;"
                " if the line continues the value above it, quote that value")
    if problem.startswith("expected <block end>") and above:
        return _block_end(problem, lines, line, above, pm)
    closing = re.match(r"expected ',' or '([\]}])'", problem)
    if closing and cm is not None:
        opening = "[" if closing[1] == "]" else "{"
        return (pm.line, pm.column, f"the {_quote(opening)} opened on line {cm.line + 1} (column {cm.column + 1}) is"
                f" not closed before this: close it with {_quote(closing[1])}, with ',' between its items")
    if "end of stream" in problem and "quoted scalar" in context and cm is not None:
        quote = lines[cm.line][cm.column] if cm.line < len(lines) and cm.column < len(lines[cm.line]) else "quote"
        return (pm.line, pm.column, f"the {_quote(quote)} opened on line {cm.line + 1} (column {cm.column + 1}) is"
                " never closed: add the closing quote")
    if context.startswith("expected a single document"):
        return (pm.line, pm.column, "a second YAML document starts here ('---'): an inventory is one document;"
                " remove the '---' and what follows, or merge it into the first")
    start = re.match(r"found character '(.)' that cannot start any token", problem)
    if start:
        return (pm.line, pm.column, f"a value cannot start with {_quote(start[1])} (YAML reserves it): quote the"
                " value")
    return None
