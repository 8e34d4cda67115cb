"""The CLI's printing core: the two consoles, the progress reporter, and how every value is made safe to print.

Progress and errors go to stderr (`err`), `--json` documents and results to stdout (`out`). Every
value from a user, an inventory or a host goes through _escape: printed as it is, on one line, any
credential in it shown as ***. The renderers of each command (cli/render*.py) build on it.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time

from rich.console import Console
from rich.table import Table

from bootstrap import face

# Wide when not on a terminal, so tables in logs and CI output do not wrap evidence mid-word.
# No emoji codes: a `:name:` in a value is printed as it is.
err = Console(stderr=True, highlight=False, emoji=False, soft_wrap=True, width=None if sys.stderr.isatty() else 200)
out = Console(highlight=False, emoji=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)

PROG = "bootstrap"


class LineReporter:
    """A line per host and stage on stderr (safe from many threads)."""

    SHOW_START = {"pull", "load-image", "copy-image", "copy-model", "relay-model", "start-head", "head-gcs",
                  "start-workers", "down"}

    def __init__(self, console: Console = err, quiet: bool = False):
        self.console = console
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.lock = threading.Lock()

    def event(self, host: str, stage: str, status: str, detail: str = "") -> bool:
        """Print the event's line (every event goes to the run log); True when its detail is on it whole."""
        from bootstrap.cli import runlog

        runlog.event(f"{host:<16} {stage:<14} {status} {detail}".rstrip())
        if self.quiet or (status == "start" and stage not in self.SHOW_START and not runlog.verbose):
            return False
        if runlog.verbose and len(detail) > 300:
            with self.lock:
                self.console.print(f"[dim]{time.monotonic() - self.t0:7.1f}s[/] {_escape(f'{host:<16}')} "
                                   f"{_escape(f'{stage:<14}')} {_escape(status)} [dim]{_escape(detail)}[/]")
            return True
        color = {"done": "green", "failed": "red", "start": "cyan", "warning": "yellow"}.get(status, "white")
        t = time.monotonic() - self.t0
        line = f"[dim]{t:7.1f}s[/] {_escape(f'{host:<16}')} {_escape(f'{stage:<14}')} [{color}]{_escape(status)}[/]"
        if detail:
            line += f" [dim]{_escape(detail[:300])}[/]"
        with self.lock:
            self.console.print(line)
        return len(detail) <= 300

    def close(self) -> None:
        """Nothing to end (LiveReporter ends its live rows)."""


class LiveReporter(LineReporter):
    """On a terminal: LineReporter's lines, and while vLLM starts a live row per node under them (its
    step and how long that step has lasted, ticking in place) instead of the heartbeat lines; a new
    step is still a line of its own. Not on a terminal, or with --json: LineReporter (progress_reporter)."""

    HEARTBEAT = re.compile(r" \(this step \d+ s so far\)\Z")

    def __init__(self, console: Console = err):
        super().__init__(console)
        self.rows: dict[str, tuple[str, float]] = {}
        self.live = None

    def event(self, host: str, stage: str, status: str, detail: str = "") -> bool:
        from bootstrap.cli import runlog

        if stage == "vllm-start":
            step = self.HEARTBEAT.sub("", detail)
            with self.lock:
                row = self.rows.get(host)
                again = status == "waiting" and row is not None and row[0] == step
                if status == "waiting" and not again:
                    self.rows[host] = (step, time.monotonic())
                elif status != "waiting":
                    self.rows.pop(host, None)
                self._show()
            if again:  # the row says it, ticking
                runlog.event(f"{host:<16} {stage:<14} {status} {detail}".rstrip())
                return True
        return super().event(host, stage, status, detail)

    def _show(self) -> None:
        from rich.live import Live

        if self.rows and self.live is None:
            self.live = Live(self, console=self.console, transient=True, refresh_per_second=2)
            self.live.start()
        elif not self.rows and self.live is not None:
            self.live.stop()
            self.live = None

    def __rich__(self) -> Table:
        grid = Table.grid(padding=(0, 2))
        now = time.monotonic()
        for host, (step, since) in sorted(dict(self.rows).items()):
            grid.add_row(f"  [cyan]{_escape(host)}[/]", _escape(step), f"[dim]{now - since:.0f} s[/]")
        return grid

    def close(self) -> None:
        with self.lock:
            self.rows.clear()
            self._show()


def progress_reporter(as_json: bool) -> LineReporter:
    """The reporter of a command that waits for vLLM: live rows on a terminal, lines otherwise."""
    if not as_json and err.is_terminal:
        return LiveReporter(err)
    return LineReporter(quiet=as_json)


# rich reads `[` + one of a-z # / @ ... `]` as a tag; backslashes before a `[` escape it (an even
# run before a tag is halved and the tag stays a tag); `\[` in plain text prints `[`.
_TAG = re.compile(r"\[[a-z#/@][^[]*?]")
_BRACKET = re.compile(r"(\\*)\[")
_TRAILING_BACKSLASHES = re.compile(r"\\+\Z")
# An empty span of the null style: ends a value's trailing backslashes, so that markup after the
# value (`[/]`) is neither escaped by them nor halves them.
_STOP = "[none][/none]"


def _printable(text: str, keep: str = "") -> str:
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


# -- credentials: masked in every line printed, wherever they came from ----------------------------
def _flag_spellings(flag: str) -> str:
    """A regex for `flag` and each prefix of it from its fifth character (`--api`, `--hf-t`: what
    vLLM's argparse would read as it), `-` or `_` inside."""
    parts = [re.escape(c) if c != "-" else "[-_]" for c in flag[2:]]
    tail = ""
    for part in reversed(parts[3:]):
        tail = f"(?:{part}{tail})?"
    return "".join(parts[:3]) + tail


#: A flag whose value is a credential: vLLM's (any spelling it reads as one), and any flag named for one
_FLAG_NAME = (r"(--(?:" + "|".join(map(_flag_spellings, face.CREDENTIAL_FLAGS))
              + r")|-{1,2}(?:[A-Za-z0-9]+[-_])*(?:token|password|passwd|secret|api[-_]?key))")
_CRED_FLAG = r"(?<![\w-])" + _FLAG_NAME
_VALUE = r"""('[^']*'|"[^"]*"|[^\s'",\])]+)"""
#: After a space, a bare word of lowercase letters (or a parenthesis) is prose, not a value: a refusal
#: names the flag and goes on in words (`--api-key would put ...`). An argv is masked whole (_argv).
_NOT_PROSE = r"""(?![a-z]+(?:[\s,.;:)]|\Z)|\()"""
_MASKS = (
    # 'FLAG=value' quoted whole (shlex, repr): to its closing quote
    (re.compile(r"(')" + _FLAG_NAME + r"=(?!\*\*\*)[^']*", re.I), r"\1\2=***"),
    # FLAG=value, FLAG value, and the next item after it in a list's repr or JSON
    (re.compile("(?i:" + _CRED_FLAG + ")" + r"""(=|["']\s*,\s*|["']?\s+""" + _NOT_PROSE + r""")"""
                + r"""(?!["']?\*\*\*)""" + _VALUE),
     lambda m: m[1] + m[2] + (m[3][0] + "***" + m[3][0] if m[3][0] in "'\"" else "***")),
    # NAME=value where NAME is a credential's: a variable's (HF_TOKEN=...), a URL query's (?token=...); not
    # a tokenizer's eos_token=
    (re.compile(r"(?<![A-Za-z0-9_])((?:[A-Z][A-Z0-9_]*_)?(?:TOKEN|PASSWORD|PASSWD|SECRET|API_KEY|APIKEY)="
                r"|(?:access_|auth_|hf_)?(?:token|password|passwd|secret|api_key|apikey)=)(?!\*\*\*)" + _VALUE),
     r"\1***"),
    # a URL's or an image reference's user:password@
    (re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?!\*\*\*@)[^/\s@]+@"), r"\1***@"),
    (re.compile(r"""((?:^|(?<=[\s'"=(\[,]))[A-Za-z0-9._%+-]+:)(?!\*\*\*@)[^\s/@:'"]+@(?!sha\d+:)(?=[A-Za-z0-9\[])"""),
     r"\1***@"),
    # a value that is a credential by its form (inventory/envvars.py's, as a word of its own)
    (re.compile(r"(?<![A-Za-z0-9])(?:" + face._CREDENTIAL_VALUE.pattern + ")"),
     lambda m: m[0] if m[0].endswith(":***@") else "***"),  # a URL whose password is masked already
)


def mask_credentials(text: str) -> str:
    """`text` with every credential-shaped value shown as ***: the value after a credential flag (any
    spelling vLLM reads as one: `--api-ke x`, `--hf_tok=x`), a NAME=value of a credential's name, a
    URL's or an image reference's `user:password@`, and a value that is a credential by its form
    (hf_..., sk-..., a JWT). Every line the CLI prints goes through it (_escape, _json)."""
    for regex, repl in _MASKS:
        text = regex.sub(repl, text)
    return text


def _mask_doc(doc):
    """A JSON document with mask_credentials applied to every string, and the item after a
    credential flag in a list (an argv) shown as ***."""
    if isinstance(doc, str):
        return mask_credentials(doc)
    if isinstance(doc, dict):
        return {k: _mask_doc(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        flag = re.compile(_FLAG_NAME + r"(=.*)?\Z", re.I | re.S)

        def item(i: int, v):
            if not isinstance(v, str):
                return _mask_doc(v)
            if i and isinstance(doc[i - 1], str) and flag.match(doc[i - 1]) and "=" not in doc[i - 1]:
                return "***"  # the value after a credential flag
            m = flag.match(v)
            return m[1] + "=***" if m and m[2] else mask_credentials(v)
        return [item(i, v) for i, v in enumerate(doc)]
    return doc


def _argv(argv) -> str:
    """An argv as one shell line, the value after each credential flag shown as ***."""
    return shlex.join(_mask_doc([str(a) for a in argv]))


def _escape(text: object, *, lines: bool = False, markup: bool = True) -> str:
    """A string from a user, an inventory or a host, made safe to print: shown as it is, on one line.

    Control and other unprintable characters (ESC, newline, NUL, lone surrogates) are shown as
    Python escapes (`\\x1b`, `\\n`): a value stays on its line and cannot drive the terminal.
    lines=True keeps the text's line breaks and tabs (a log tail, a report). markup=True (text
    for rich's print, tables included): brackets and backslashes are escaped so that rich shows
    them literally, whatever markup comes before or after.
    """
    text = mask_credentials(str(text))
    if lines:
        text = "\n".join(_printable(ln, "\t") for ln in text.splitlines())
    else:
        text = _printable(text)
    if not markup:
        return text
    plain = text

    def bracket(m: re.Match) -> str:
        tag = _TAG.match(plain, m.end() - 1) is not None
        return m.group(1) * (2 if tag else 1) + "\\["
    text = _BRACKET.sub(bracket, plain)
    trailing = _TRAILING_BACKSLASHES.search(text)
    return text + trailing.group() + _STOP if trailing else text


def _json(doc, console: Console | None = None) -> None:
    """A JSON document on stdout (`console`: another console, as render.py's own renderers pass theirs),
    credentials masked."""
    (console or out).print_json(json.dumps(_mask_doc(doc)))


def _log_tail(tail: str, of: str = "the vLLM log") -> None:
    if tail:
        err.print(f"[dim]--- last lines of {of} ---[/]")
        err.print(_escape(tail, lines=True))


def _ssh_tunnel(h, ip: str, port) -> str:
    """How to open a service on `h` listening on ip:port from this machine: the `ssh -L` with the
    inventory's SSH port, jump host and key (bootstrap.exposure.ssh_tunnel_argv)."""
    return f"from here: {shlex.join(face.ssh_tunnel_argv(h, ip, port))}, then http://localhost:{port}"


def findings(found) -> None:
    """A table of findings (cause, evidence, fix); nothing when there are none."""
    if not found:
        return
    t = Table(title="findings")
    for col in ("severity", "host", "cause", "evidence", "fix"):
        t.add_column(col)
    color = {"error": "red", "warning": "yellow", "info": "cyan"}
    for f in found:
        t.add_row(f"[{color.get(f.severity, 'white')}]{_escape(f.severity)}[/]", _escape(f.host or "(cluster)"),
                  _escape(f.title), _escape(f.evidence, lines=True), _escape(f.fix, lines=True))
    out.print(t)


def kv_line(kv) -> str:
    """The KV cache capacity as figures: tokens, and how many requests of the longest length fit."""
    line = f"KV cache: {kv.tokens:,} tokens"
    if kv.concurrency is not None and kv.request_tokens:
        line += f" ({kv.concurrency:g} requests of {kv.request_tokens:,} tokens at once)"
    return line
