"""The CLI reference, generated from click's own objects: the documentation's CLI reference page prints
`markdown()` (docs/hooks.py); tests/docs/test_cli_reference.py checks the built page against the
commands.

The commands come in the sections and the order `bootstrap --help` shows them: the root group's own
format_commands is run against a recording formatter, so whatever orders and sections its help
orders and sections the reference too. Each command: its usage line, its help text (paragraphs as
paragraphs; click's `\\b` blocks and the `Example:` lines as code blocks, unreflowed), a table of its
options (spellings, what it takes, its default: nothing where there is none, on/off for flags, the
`show_default` text where an option sets one) and, under a group, its subcommands. Then the exit
codes: every errors.ExitStatus, with the meaning the root help's epilog gives it. Pure.
"""
from __future__ import annotations

import enum
import html
import inspect
import re
from contextlib import contextmanager

import click

try:  # click >= 8.2: a parameter without a default holds this sentinel
    from click._utils import UNSET as _UNSET
except ImportError:  # pragma: no cover - click 8.1
    _UNSET = object()

EXAMPLE = re.compile(r"(Example(?: \([^)]*\))?):\s+(bootstrap\b.*)", re.S)
CODE_SPAN = re.compile(r"`([^`\n]+)`")


#: (title, or None outside a section; the rows of its write_dl; its texts of write_text)
Section = tuple[str | None, list[tuple[str, str]], list[str]]


class _Recorder(click.HelpFormatter):
    """A help formatter that keeps what a command writes, section by section, instead of text:
    [(title or None, rows of write_dl, texts of write_text)]."""

    def __init__(self) -> None:
        super().__init__(width=10_000)
        self.sections: list[Section] = []

    def _current(self):
        if not self.sections:
            self.sections.append((None, [], []))
        return self.sections[-1]

    @contextmanager
    def section(self, name):
        self.sections.append((name, [], []))
        yield

    def write_dl(self, rows, col_max: int = 30, col_spacing: int = 2) -> None:
        self._current()[1].extend((str(a), str(b)) for a, b in rows)

    def write_text(self, text: str) -> None:
        self._current()[2].append(text)


def command_sections(group: click.Group, ctx: click.Context) -> list[tuple[str, list[str]]]:
    """(section title, command names) as `group --help` lists them."""
    rec = _Recorder()
    group.format_commands(ctx, rec)
    return [(title or "Commands", [name for name, _ in rows]) for title, rows, _ in rec.sections if rows]


def epilog_sections(group: click.Group, ctx: click.Context) -> list[Section]:
    rec = _Recorder()
    group.format_epilog(ctx, rec)
    return rec.sections


# -- text ----------------------------------------------------------------------------------------
def _escape(text: str) -> str:
    """Plain text for a markdown paragraph or table cell: nothing in it is markup, `|` included."""
    text = html.escape(text, quote=False)
    text = re.sub(r"([\\`*_\[\]])", r"\\\1", text)
    return text.replace("|", "&#124;")


def code(text: str) -> str:
    """Inline code that holds anything, `|` and backticks included, in a table cell too."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def inline(text: str) -> str:
    """One line of help text: whitespace collapsed (a cell holds no paragraph), `...` spans as code,
    the rest escaped."""
    text = " ".join(text.split())
    out, at = [], 0
    for m in CODE_SPAN.finditer(text):
        out += [_escape(text[at:m.start()]), code(m.group(1))]
        at = m.end()
    out.append(_escape(text[at:]))
    line = "".join(out)
    return "\\" + line if re.match(r"([-+]|\d+\.)\s", line) else line  # not a list item


def _fence(lines: list[str]) -> list[str]:
    ticks = "```"
    while any(ticks in ln for ln in lines):
        ticks += "`"
    return [ticks + "text", *lines, ticks, ""]


def help_text(text: str | None) -> list[str]:
    """A command's help as markdown: click's paragraphs, its `\\b` blocks as code blocks (click does not
    rewrap them), `Example: bootstrap ...` paragraphs as a label and a code block."""
    text = inspect.cleandoc(text or "").split("\f", 1)[0]
    out: list[str] = []
    for para in re.split(r"\n[ \t]*\n", text):
        if not para.strip():
            continue
        lines = para.splitlines()
        if lines[0].strip() == "\b":
            out += _fence([ln.rstrip() for ln in lines[1:]])
        elif m := EXAMPLE.fullmatch(para.strip()):
            out += [f"**{_escape(m.group(1))}:**", "", *_fence([ln.strip() for ln in m.group(2).splitlines()])]
        else:
            out += [inline(para), ""]
    return out


# -- options -------------------------------------------------------------------------------------
def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    try:
        return param.make_metavar(ctx)  # click >= 8.2
    except TypeError:  # pragma: no cover - click 8.1
        return param.make_metavar()


def _is_flag(param: click.Parameter) -> bool:
    return isinstance(param, click.Option) and param.is_flag and not param.count


def _unset(value) -> bool:
    return value is None or value is _UNSET


def _value(value) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        return ", ".join(_value(v) for v in value)
    return str(value)


def default_cell(param: click.Parameter) -> str:
    """What an option is when not given: the show_default text where the option sets one, nothing
    where show_default=False hides it or there is no default (None, click's UNSET), on/off for flags."""
    if getattr(param, "required", False):
        return "required"
    if param.is_eager and not param.expose_value:  # --help, --version: they act, they hold no value
        return ""
    shown = getattr(param, "show_default", None)
    if isinstance(shown, str):
        return inline(shown)
    if shown is False:
        return ""
    value = param.default
    if callable(value):
        return "dynamic"
    if _is_flag(param):
        if getattr(param, "is_bool_flag", False):
            return "on" if value is True else "off"
        values = value if isinstance(value, (list, tuple)) else (value,)
        return "on" if param.flag_value in values else "off"
    if _unset(value) or (isinstance(value, (list, tuple)) and not value):
        return ""
    return code(_value(value))


def type_cell(param: click.Option, ctx: click.Context) -> str:
    if _is_flag(param):
        return "flag"
    if param.count:
        return "count (repeatable)"
    if isinstance(param.type, click.Choice):
        cell = "one of " + ", ".join(code(str(c)) for c in param.type.choices)
    else:
        cell = code(_metavar(param, ctx))
        describe = getattr(param.type, "_describe_range", None)
        if describe and isinstance(param.type, click.types._NumberRangeBase):
            cell += " " + code(describe())
    return cell + (" (repeatable)" if param.multiple else "")


def options_table(cmd: click.Command, ctx: click.Context) -> list[str]:
    opts = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
    if not opts:
        return []
    out = ["| Option | Takes | Default | Description |", "|---|---|---|---|"]
    for p in opts:
        names = ", ".join(code(o) for o in (*p.opts, *p.secondary_opts))
        out.append(f"| {names} | {type_cell(p, ctx)} | {default_cell(p)} | {inline(p.help or '')} |")
    return [*out, ""]


def arguments_line(cmd: click.Command, ctx: click.Context) -> list[str]:
    args = [p for p in cmd.get_params(ctx) if isinstance(p, click.Argument)]
    if not args:
        return []
    parts = [f"{code(_metavar(a, ctx))} ({'required' if a.required else 'optional'}"
             f"{', any number' if a.nargs == -1 else ''})" for a in args]
    return ["Arguments: " + "; ".join(parts) + ".", ""]


# -- the page ------------------------------------------------------------------------------------
def _context(cmd: click.Command, name: str, parent: click.Context | None) -> click.Context:
    return click.Context(cmd, info_name=name, parent=parent, **(cmd.context_settings or {}))


def _usage(cmd: click.Command, ctx: click.Context) -> str:
    f = click.HelpFormatter(width=10_000)
    cmd.format_usage(ctx, f)
    return f.getvalue().strip().removeprefix("Usage:").strip()


def command(cmd: click.Command, ctx: click.Context, level: int) -> list[str]:
    out = [f"{'#' * min(level, 6)} {ctx.command_path}", "", "```text", _usage(cmd, ctx), "```", ""]
    out += help_text(cmd.help)
    out += arguments_line(cmd, ctx)
    out += options_table(cmd, ctx)
    if isinstance(cmd, click.Group):
        for _, names in command_sections(cmd, ctx):
            for name in names:
                out += command(cmd.commands[name], _context(cmd.commands[name], name, ctx), level + 1)
    return out


def markdown(root: click.Group | None = None, prog: str | None = None) -> str:
    """The reference of `root` (bootstrap's main command): the root command, then a heading per
    section of its help with its commands under it, then the exit codes and the rest of its epilog."""
    from bootstrap.errors import ExitStatus

    if root is None:
        from bootstrap.cli import main as root
        from bootstrap.cli.render import PROG as prog
    ctx = _context(root, prog or root.name, None)
    out = [f"## {ctx.command_path}", "", "```text", _usage(root, ctx), "```", "",
           *help_text(root.help), *options_table(root, ctx)]
    for title, names in command_sections(root, ctx):
        out += [f"## {_escape(title)}", ""]
        for name in names:
            sub = root.commands[name]
            out += command(sub, _context(sub, name, ctx), 3)
    meanings: dict[str, str] = {}
    rest = []
    for title, rows, texts in epilog_sections(root, ctx):
        if title == "Exit codes":
            meanings = dict(rows)
        else:
            rest.append((title, rows, texts))
    out += ["## Exit codes", "", "| Code | Name | Meaning |", "|---|---|---|"]
    out += [f"| {int(s)} | {code(s.name)} | {inline(meanings.get(str(int(s)), ''))} |" for s in ExitStatus]
    out.append("")
    for title, rows, texts in rest:
        out += [f"## {_escape(title or 'More')}", ""]
        out += [f"- {code(a)}: {inline(b)}" for a, b in rows] + ([""] if rows else [])
        out += [x for t in texts for x in (inline(t), "")]
    return "\n".join(out)
