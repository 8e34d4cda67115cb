"""What the `bootstrap` command prints: progress lines, tables, text and JSON documents of each result.

Progress and errors go to stderr (`err`), `--json` documents and results to stdout (`out`). Every
value from a user, an inventory or a host goes through _escape: printed as it is, on one line.
"""
from __future__ import annotations

import json
import re
import shlex
import sys
import threading
import time

import click
from rich.console import Console
from rich.table import Table

from bootstrap.cluster.run import HostTiming
from bootstrap.cluster.runtime import UNDECIDED as RUNTIME_UNDECIDED
from bootstrap.doctor.logsources import SOURCES
from bootstrap.errors import BootstrapError, GroupError, Interrupted, notes_of, was_shown
from bootstrap.inventory.fields import _CREDENTIAL_VALUE  # the one definition of a credential's form
from bootstrap.serve.passthrough import CREDENTIAL_FLAGS
from bootstrap.serve.plan import split_label

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
        """Print the event's line; True when its detail is on it whole."""
        if self.quiet or (status == "start" and stage not in self.SHOW_START):
            return False
        color = {"done": "green", "failed": "red", "start": "cyan", "warning": "yellow"}.get(status, "white")
        t = time.monotonic() - self.t0
        line = f"[dim]{t:7.1f}s[/] {_escape(f'{host:<16}')} {_escape(f'{stage:<14}')} [{color}]{_escape(status)}[/]"
        if detail:
            line += f" [dim]{_escape(detail[:300])}[/]"
        with self.lock:
            self.console.print(line)
        return len(detail) <= 300


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


def _standby_cell(standbys: dict[str, str] | None) -> str:
    """A replica's standbys: how many of its members have one running (cluster.standby)."""
    if standbys is None:
        return "-"
    up = sum(1 for v in standbys.values() if v == "running")
    return f"[green]{up}/{len(standbys)}[/]" if up == len(standbys) else f"[yellow]{up}/{len(standbys)}[/]"


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
_FLAG_NAME = (r"(--(?:" + "|".join(map(_flag_spellings, CREDENTIAL_FLAGS))
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
    # a value that is a credential by its form (inventory/fields.py's, as a word of its own)
    (re.compile(r"(?<![A-Za-z0-9])(?:" + _CREDENTIAL_VALUE.pattern + ")"),
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


def _json(doc) -> None:
    out.print_json(json.dumps(_mask_doc(doc)))


# -- errors --------------------------------------------------------------------------------------
def failure(exc: BootstrapError) -> None:
    """A domain error: one line, then each host's state (an interrupt) or result (a group), then
    any second failure attached to an error (errors.add_note: e.g. a container that could not be
    removed after the `docker run` that used it failed), one `also:` line each."""
    err.print(f"[red]error:[/] {_escape(str(exc))}")
    for note in notes_of(exc):
        err.print(f"  [red]also:[/] {_escape(note)}")
    if isinstance(exc, Interrupted):
        for host, state in exc.states.items():
            color = "green" if state.startswith("done") else "yellow"
            err.print(f"  {_escape(f'{host:<16}')} [{color}]{_escape(state)}[/]")
    if isinstance(exc, GroupError):
        told = set(_told(exc))
        for host, r in exc.results.items():
            mark = "[red]FAILED[/]" if isinstance(r, BaseException) else "[green]ok[/]"
            why = _escape(r) if isinstance(r, BaseException) and not was_shown(r) and host not in told else ""
            err.print(f"  {_escape(f'{host:<16}')} {mark} {why}".rstrip())
            for note in notes_of(r) if isinstance(r, BaseException) else ():
                err.print(f"  {'':<16} [red]also:[/] {_escape(note)}")


def _told(exc: GroupError) -> list[str]:
    """The failed hosts whose error the `error:` line carries (GroupError's str: the first three)."""
    return sorted(exc.failures)[:3]



#: Written by the signal handler (cli._Interrupts) as they are, with os.write: a second signal while
#: the first one's clean-up runs, and a third.
INTERRUPTED_AGAIN = "interrupted again: finishing the clean-up (once more to exit at once)\n"
INTERRUPTED_AT_ONCE = "interrupted a third time: exiting at once; the cluster lock is released with the connection\n"


def interrupted() -> None:
    """Ctrl-C or SIGTERM while a command runs."""
    err.print("[yellow]interrupted[/]: remote commands in flight were abandoned; run the same "
              "command again to continue from where each host is")


def aborted() -> None:
    """Ctrl-C while click reads the command line."""
    err.print("[yellow]interrupted[/]")


def _param_name(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def usage_line(e: click.ClickException) -> str:
    """`up: --parallel: 0 is not in the range 1<=x<=1024 (bootstrap up --help)`: the command, the
    option or argument, the value and what to read; one line whatever click's message was."""
    names: list[str] = []
    ctx = getattr(e, "ctx", None)
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    if isinstance(e, click.BadParameter) and not isinstance(e, click.MissingParameter) and (
            e.param is not None or e.param_hint):
        hint = (e.param_hint if isinstance(e.param_hint, str) else "/".join(e.param_hint) if e.param_hint
                else _param_name(e.param))
        msg = f"{hint}: {e.message}"
    else:
        msg = e.format_message()
    # A newline in a value stays in the message: the caller's _escape shows it as \n, on one line.
    msg = msg.strip().rstrip(".")
    where = f"{' '.join(names)}: " if names else ""
    return f"{where}{msg} ({' '.join([PROG, *names, '--help'])})"


def usage_error(e: click.ClickException) -> None:
    err.print(f"[red]error:[/] {_escape(usage_line(e))}")


def _log_tail(tail: str, of: str = "the vLLM log") -> None:
    if tail:
        err.print(f"[dim]--- last lines of {of} ---[/]")
        err.print(_escape(tail, lines=True))


# -- validate ------------------------------------------------------------------------------------
def validated(inv) -> None:
    gpus = f", {inv.gpus_per_node} GPU(s) per node" if inv.cluster.accelerator == "gpu" else ""
    out.print(_escape(f"{inv.path}: ok: {len(inv.hosts)} host(s), head {inv.head.name} ({inv.head.ip}){gpus}"))


# -- plan ----------------------------------------------------------------------------------------
def plan_rows(actions, as_json: bool, live: bool, runtime: str | None = "", why: str = "") -> None:
    """Each host's container (`plan`; `up --dry-run` with live=True: and what would change).
    runtime None: not decided yet (cluster.runtime unset, the image not looked at): then why says
    so, and the rows show the containers with Ray."""
    if as_json:
        doc = [{"host": a.host, "role": a.spec.role, "action": a.action, "reason": a.reason,
                "runtime": runtime if runtime is not None else RUNTIME_UNDECIDED,
                "spec_hash": a.spec.spec_hash, "argv": list(a.spec.run_argv())} for a in actions]
        _json(doc)
        return
    if why and not why.startswith("cluster.runtime:"):
        out.print(_escape(f"runtime: {runtime or RUNTIME_UNDECIDED}: {why}"))
    for a in actions:
        head = f"[bold]{_escape(a.host)}[/] ({_escape(a.spec.role)})"
        if live:
            color = {"keep": "green", "create": "cyan", "recreate": "yellow"}[a.action]
            head += f"  [{color}]{a.action}[/]: {_escape(a.reason)}"
        out.print(head)
        out.print("  " + _escape(_argv(a.spec.run_argv())), soft_wrap=True)


def fleet_plan(replicas, routers, router_url: str, keeper_argv, as_json: bool, standby: str | None = None) -> None:
    """`plan` with replicas: replicas is [(url, actions)] per replica, then the routers
    (fleet.plan.RouterLaunch) and the keeper; `standby`: the members' standby containers' name
    (cluster.standby), else None."""
    if as_json:
        _json({
            "replicas": [{"replica": k, "url": url,
                          "hosts": [{"host": a.host, "role": a.spec.role, "spec_hash": a.spec.spec_hash,
                                     "argv": list(a.spec.run_argv())} for a in acts]}
                         for k, (url, acts) in enumerate(replicas)],
            "router": {"host": routers[0].host, "endpoint": router_url + "/v1", "argv": list(routers[0].run)},
            "routers": [{"host": r.host, "argv": list(r.run), "vip_argv": list(r.vip_create),
                         "vip_config": r.vip_config} for r in routers],
            "keeper": list(keeper_argv), "standby": standby})
        return
    for k, (url, acts) in enumerate(replicas):
        out.print(f"[bold]replica {k}[/] -> {_escape(url)}")
        plan_rows(acts, False, live=False)
    for r in routers:
        out.print(f"[bold]router[/] on {_escape(r.host)} -> {_escape(router_url)}/v1 "
                  "(worker URLs as `bootstrap serve` starts them)")
        out.print("  " + _escape(_argv(r.run)), soft_wrap=True)
        if r.vip_create:
            out.print(f"[bold]keepalived[/] on {_escape(r.host)} (the floating address)")
            out.print("  " + _escape(_argv(r.vip_create)), soft_wrap=True)
    out.print("[bold]keeper[/] on every host (restarts serve/router containers stopped outside bootstrap"
              + (f"; puts a member's standby, {_escape(standby)}, in place of a killed serve container)"
                 if standby else ")"))
    out.print("  " + _escape(_argv(keeper_argv)), soft_wrap=True)


# -- up ------------------------------------------------------------------------------------------
def up_replica(k: int, hosts) -> None:
    err.print(_escape(f"replica {k}: {', '.join(h.name for h in hosts)}"))


def left_out(skipped: dict) -> None:
    for host, why in skipped.items():
        err.print(f"[yellow]warning:[/] {_escape(host)} left out (--allow-partial): {_escape(why)}")


def up(inv, res, label: str, total: float, started_at: float, as_json: bool) -> None:
    """`up`'s result: each host's action and Ray state, where the image came from, the summary line."""
    alive = {n.ip: n for n in (res.ray.nodes if res.ray else ()) if n.alive}
    if as_json:
        # times: time.time() seconds; run_start/run_end/started_at/ready_at on this machine's
        # clock, ray_seen on the head's (head_clock_offset = head minus this machine)
        no_time = HostTiming().as_dict()
        _json({
            "changed": res.changed, "seconds": round(total, 3),
            "stages": {k: round(v, 3) for k, v in res.timings.stages.items()},
            "hosts": [{"host": a.host, "ip": inv.host(a.host).ip, "role": a.spec.role,
                       "action": a.action, "reason": a.reason, "ray_alive": inv.host(a.host).ip in alive,
                       "gpus": alive[inv.host(a.host).ip].gpus if inv.host(a.host).ip in alive else 0,
                       "image_from": res.image_from.get(a.host),
                       **(res.host_timings[a.host].as_dict() if a.host in res.host_timings else no_time)}
                      for a in res.actions],
            "started_at": round(started_at, 3),
            "ready_at": None if res.ready_at is None else round(res.ready_at, 3),
            "gcs_open": None if res.gcs_open is None else round(res.gcs_open, 3),
            "head_clock_offset": None if res.head_clock_offset is None else round(res.head_clock_offset, 3),
            "skipped": dict(res.skipped), "warnings": res.warnings,
            "runtime": res.runtime, "runtime_why": res.runtime_why})
        return
    ray = res.runtime != "none"
    t = Table(title=f"cluster {_escape(inv.cluster.name)}{label}")
    for col in ("host", "ip", "role", "action", *(("ray", "GPUs") if ray else ())):
        t.add_column(col)
    for a in res.actions:
        ip = inv.host(a.host).ip
        n = alive.get(ip)
        cells = ["[green]alive[/]" if n else "[red]missing[/]", f"{n.gpus:g}" if n else "-"] if ray else []
        t.add_row(_escape(a.host), _escape(ip), _escape(a.spec.role), _escape(f"{a.action} ({a.reason})"), *cells)
    out.print(t)
    if res.runtime_why and not res.runtime_why.startswith("cluster.runtime:"):
        out.print(_escape(f"runtime: {res.runtime or RUNTIME_UNDECIDED}: {res.runtime_why}"))
    if res.image_from:
        by_src: dict[str, list[str]] = {}
        for host, src in res.image_from.items():
            by_src.setdefault(src, []).append(host)
        out.print(_escape("image: " + "; ".join(
            f"{', '.join(hs)} from {'the registry' if src == 'registry' else src}" for src, hs in by_src.items())))
    verb = "ready" if res.changed else "already up: nothing changed"
    gpus = sum(n.gpus for n in alive.values())
    part = f" ({len(res.skipped)} host(s) left out: {', '.join(res.skipped)})" if res.skipped else ""
    if not ray:
        out.print(_escape(f"cluster {verb}: {len(res.actions)} node container(s) running, no Ray (`serve` runs "
                          f"vLLM's native multi-node mode), head {inv.head.ip}{part}; took {total:.1f}s"))
        return
    out.print(_escape(f"Ray cluster {verb}: {len(alive)} node(s), {gpus:g} GPU(s), head {inv.head.ip}:"
                      f"{inv.cluster.ports.ray_gcs}{part}; took {total:.1f}s"))


# -- status --------------------------------------------------------------------------------------
def status(inv, st, as_json: bool) -> None:
    """`status`: each node's container and Ray state, then what is served and the Ray dashboard."""
    rows = st.nodes
    if as_json:
        _json({"nodes": [r.as_dict() for r in rows],
               "serving": st.serving.to_dict() if st.serving else None,
               "ray_dashboard": st.dashboard, "runtime": st.runtime,
               "ray_error": st.ray_error or None, "serving_error": st.serving_error or None})
        return
    ray = st.runtime != "none"
    native = "" if ray else " (no Ray: vLLM's native multi-node mode)"
    t = Table(title=f"cluster {_escape(inv.cluster.name)}{native}")
    for col in ("host", "ip", "role", "container", "ray" if ray else "node", "GPUs", "note"):
        t.add_column(col)
    for r in rows:
        cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
        t.add_row(_escape(r.host), _escape(r.ip), _escape(r.role), cont,
                  "[green]alive[/]" if r.ray_alive else "[red]no[/]",
                  f"{r.gpus:g}" if r.ray_alive else "-", _escape(r.error[:120]))
    out.print(t)
    for line in _status_lines(inv, st):
        out.print(line)


def exposure(inv, found, as_json: bool) -> None:
    """`status --exposure`: each listening socket of the cluster's, then one line: what is open beyond
    SSH and the endpoint."""
    beyond = [e for e in found if e.open_beyond]
    if as_json:
        _json({"listeners": [dict(host=e.host, address=e.address, port=e.port, what=e.what, bind=e.bind,
                                  auth=e.auth, reach=e.reach, expected=e.expected, open_beyond=e.open_beyond,
                                  fence_allow=list(e.allowed), public=list(e.public))
                             for e in found],
               "fence": inv.cluster.fence, "open_beyond": len(beyond)})
        return
    t = Table(title=f"cluster {_escape(inv.cluster.name)}: listening ports")
    for col in ("host", "address", "port", "what", "bind", "auth", "reachable by"):
        t.add_column(col)
    colour = {"anyone": "red", "unknown": "red", "members": "green", "this host": "green"}
    for e in found:
        reach = e.reach + (" (by design)" if e.expected and e.reach == "anyone" else "")
        style = "yellow" if e.expected and e.reach == "anyone" else colour[e.reach]
        if e.allowed:  # fenced: the networks cluster.fence_allow admits come through too
            reach += " and " + ", ".join(n + (" (public)" if n in e.public else "") for n in e.allowed)
            style = "red" if e.public and not e.expected else style
        t.add_row(_escape(e.host), _escape(e.address), str(e.port), _escape(e.what), _escape(e.bind),
                  _escape(e.auth), f"[{style}]{_escape(reach)}[/]")
    out.print(t)
    wild = sum(1 for e in found if e.bind == "all interfaces")
    if beyond:
        out.print(f"[red]{len(beyond)} port(s) open to non-members beyond SSH and the endpoint[/]: "
                  + ", ".join(f"{_escape(e.host)}:{e.port} ({_escape(e.what)})" for e in beyond[:12])
                  + (f" and {len(beyond) - 12} more" if len(beyond) > 12 else "")
                  + ("" if inv.cluster.fence else " -- cluster.fence is off")
                  + _public_allowed(beyond))
    else:
        out.print(f"nothing open to non-members beyond SSH and the endpoint ({len(found)} listening socket(s), "
                  f"{wild} on all interfaces, fenced)")


def _public_allowed(beyond) -> str:
    """The public networks cluster.fence_allow admits to the ports open beyond, and the fix."""
    nets = list(dict.fromkeys(n for e in beyond for n in e.public))
    if not nets:
        return ""
    return (f" -- cluster.fence_allow admits public address space ({_escape(', '.join(nets))}): "
            "narrow it to the addresses that need the cluster's ports")


def fleet_status(inv, groups, fs, as_json: bool) -> None:
    """`status` with replicas: each group's nodes, each replica as the router sees it, the endpoint
    and each group's Ray dashboard."""
    nodes = [(k, r) for k, g in enumerate(groups) for r in g.nodes]
    if as_json:
        _json({"nodes": [{"replica": k, **r.as_dict()} for k, r in nodes],
               "fleet": fs.to_dict(), "ray_dashboard": [g.dashboard for g in groups],
               "ray_error": [g.ray_error or None for g in groups]})
        return
    t = Table(title=f"cluster {_escape(inv.cluster.name)}: {inv.cluster.replicas} replicas")
    for col in ("replica", "host", "ip", "role", "container", "ray", "note"):
        t.add_column(col)
    for k, r in nodes:
        cont = _escape(r.container) if r.reachable else "[red]unreachable[/]"
        t.add_row(str(k), _escape(r.host), _escape(r.ip), _escape(r.role), cont,
                  "[green]alive[/]" if r.ray_alive else "[red]no[/]", _escape(r.error[:120]))
    out.print(t)
    pd = any(r.role for r in fs.replicas)
    t = Table(title=f"serving through the router on {_escape(fs.router_host)} ({_escape(fs.router)})"
              + (": prefill/decode disaggregated" if pd else ""))
    for col in ("replica", *(("serves", "KV pulled (failed)") if pd else ()), "hosts", "url", "health", "in router",
                "router says", "running", "waiting", "served", "restarts", "standby", "model"):
        t.add_column(col)
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    for r in fs.replicas:
        color = "green" if r.health == "healthy" else ("yellow" if r.health.startswith("starting") else "red")
        rot = "-" if r.in_rotation is None else ("[green]yes[/]" if r.in_rotation else "[yellow]no[/]")
        model = (f"{r.spec.model} {' '.join(r.spec.extra)}".strip() + (f" (--dp {r.spec.dp})" if r.spec.dp else "")
                 if r.spec else "-")
        served = num(r.succeeded)
        if r.engines and len(r.engines) > 1:  # a data parallel replica: each engine's share
            order = sorted(r.engines.items(), key=lambda x: (len(x[0]), x[0]))  # 0, 1, ..., 10
            served += " (" + ", ".join(f"engine {k}: {n:g}" for k, n in order) + ")"
        says = ("-" if r.router_healthy is None else "[red]unhealthy[/]" if not r.router_healthy
                else "[yellow]circuit open[/]" if r.router_circuit_closed is False else "[green]healthy[/]")
        kv = ("-" if r.kv_transfers is None and r.kv_failed is None
              else f"{num(r.kv_transfers)} ({'[red]' + num(r.kv_failed) + '[/]' if r.kv_failed else num(r.kv_failed)})")
        t.add_row(str(r.index), *((_escape(r.role or "-"), kv) if pd else ()), _escape(", ".join(r.hosts)),
                  _escape(r.url), f"[{color}]{_escape(r.health)}[/]", rot, says, num(r.running), num(r.waiting),
                  _escape(served), str(r.restarts), _standby_cell(r.standbys), _escape(model))
    out.print(t)
    if len(fs.routers) > 1 or fs.vip:
        t = Table(title="routers" + (f": floating address {_escape(fs.vip)}" if fs.vip else ""))
        for col in ("host", "router", "workers", *(("keepalived", "holds the address") if fs.vip else ())):
            t.add_column(col)
        for rv in fs.routers:
            st = f"[green]{_escape(rv.state)}[/]" if rv.state == "running" else f"[red]{_escape(rv.state)}[/]"
            workers = "-" if rv.workers is None else _escape(", ".join(rv.workers) or "none")
            holds = "-" if rv.holds_vip is None else "[green]yes[/]" if rv.holds_vip else "no"
            vipcols = () if not fs.vip else (_escape(rv.vip_state or "-"), holds)
            t.add_row(_escape(rv.host), st, workers, *vipcols)
        out.print(t)
    if fs.vip:
        held = f"held by {fs.vip_holder}" if fs.vip_holder else "[red]held by no router host[/]"
        out.print(f"endpoint: {_escape(fs.endpoint)} (floating address, {_escape(held) if fs.vip_holder else held})")
    else:
        out.print(_escape(f"endpoint: {fs.endpoint} (router {fs.router}; one host: cluster.router.vip "
                          "puts a floating address in front of routers on two hosts)"))
    for k, g in enumerate(groups):
        if g.ray_error:
            out.print(f"Ray of replica {k}: [yellow]unknown[/]: {_escape(g.ray_error)}")
        if g.dashboard:
            out.print(_dashboard_line(f"Ray dashboard of replica {k}", g.dashboard, inv.replicas[k][0]))


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _status_lines(inv, st) -> list[str]:
    """The serving and dashboard lines under the node table."""
    lines = []
    if st.ray_error:
        lines.append(f"Ray: [yellow]unknown[/]: {_escape(st.ray_error)}")
    v = st.serving
    if v is None and st.serving_error:
        lines.append(f"serving: [yellow]unknown[/]: {_escape(st.serving_error)}")
    elif v is None:
        lines.append("serving: nothing (bootstrap serve MODEL)")
    else:
        color = "green" if v.health == "healthy" else ("yellow" if v.health.startswith("starting") else "red")
        name = v.served[0] if v.served else v.model
        lines.append(f"serving: {_escape(name)} on {_escape(v.endpoint)} [{color}]{_escape(v.health)}[/] "
                     + _escape(f"(backend {v.backend}, {f'DP={v.dp} x ' if v.dp > 1 else ''}TP={v.tp} PP={v.pp}, "
                               + (f"EP={v.ep} over {v.all2all or 'the default all-to-all'}, " if v.ep > 1 else "")
                               + f"{len(v.nodes)} node(s), up {_uptime(v.uptime_s)})"))
        if v.dp > 1 and v.engines is not None:
            lines.append(_escape("engines: " + ", ".join(f"{k}: {n:g} request(s) served"
                                                          for k, n in sorted(v.engines.items(), key=lambda x: x[0]))))
        if v.kv is not None:
            lines.append(_escape(kv_line(v.kv)))
    if st.dashboard:
        lines.append(_dashboard_line("Ray dashboard", st.dashboard, inv.head))
    return lines


def _dashboard_line(label: str, address: str, head) -> str:
    """The Ray dashboard's address, with the `ssh -L` line when it listens on localhost."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    line = f"{label}: http://{'[' + host + ']:' + port if ':' in host and not address.startswith('[') else address}"
    if host.startswith("127.") or host == "::1":
        line += f" on {head.name} ({_ssh_tunnel(head, host, port)})"
    return _escape(line)


def prometheus(url: str | None, host, port) -> None:
    """The line under `status`: Prometheus' URL on `host` and how to reach it, or that it is not running."""
    if url:
        out.print(_escape(f"Prometheus: {url} on {host.name} ({_ssh_tunnel(host, host.ip, port)})"))
    else:
        out.print("Prometheus: not running (bootstrap monitor up)")


def prometheus_unknown(exc: BootstrapError) -> None:
    """The line under `status` when the monitor host (or its Docker) does not answer: Prometheus'
    state is unknown, which is not "not running"."""
    out.print(f"Prometheus: [yellow]unknown[/]: {_escape(exc)}")


def top_without_prometheus(exc: BootstrapError) -> None:
    """`top --source auto` when the monitor host (or its Docker) does not answer: say so, then sample
    with the probes."""
    err.print(f"[yellow]warning:[/] cannot use Prometheus: {_escape(exc)}; sampling every host's container instead")


def _ssh_tunnel(h, ip: str, port) -> str:
    """How to open a service on `h` listening on ip:port from this machine: the `ssh -L` with the
    inventory's SSH port, jump host and key (bootstrap.exposure.ssh_tunnel_argv)."""
    from bootstrap.exposure import ssh_tunnel_argv

    return f"from here: {shlex.join(ssh_tunnel_argv(h, ip, port))}, then http://localhost:{port}"


# -- exec ----------------------------------------------------------------------------------------
def exec_echo(width: int, as_json: bool):
    """exec's on_result: each host's output as it finishes, every line prefixed with the host."""
    lock = threading.Lock()

    def emit(r) -> None:
        if as_json:
            return
        with lock:
            for stream, text in ((sys.stdout, r.stdout), (sys.stderr, r.stderr)):
                for line in text.splitlines():
                    stream.write(_escape(f"{r.host:<{width}} | {line}", lines=True, markup=False) + "\n")
                stream.flush()
            if r.error:
                err.print(f"{_escape(f'{r.host:<{width}}')} [red]![/] {_escape(r.error)}")
    return emit


def exec_results(res, as_json: bool) -> None:
    """exec's summary: each host's exit code and seconds; then a line naming the failures, if any."""
    if as_json:
        _json([r.as_dict() for r in res])
    else:
        t = Table()
        for col in ("host", "exit", "seconds"):
            t.add_column(col, justify="left" if col == "host" else "right")
        for r in res:
            code = "[green]0[/]" if r.ok else (f"[red]{r.exit_code}[/]" if r.exit_code is not None
                                               else "[red]timeout[/]" if not r.unreachable
                                               else "[red]unreachable[/]")
            t.add_row(_escape(r.host), code, f"{r.seconds:.2f}")
        out.print(t)
    bad = [r for r in res if not r.ok]
    if bad:
        down = [r.host for r in res if r.unreachable]
        msg = f"{len(bad)} of {len(res)} host(s) failed"
        if down:
            msg += f"; unreachable: {', '.join(down)}"
        err.print(f"[red]error:[/] {_escape(msg)}")


# -- down ----------------------------------------------------------------------------------------
def down_result(groups, as_json: bool, fleet=None) -> None:
    """down's result: per replica group (one without replicas) the hosts whose container was removed
    and those that had none; with replicas first the fleet's own containers removed per host."""
    if as_json:
        doc = {"groups": [{"removed": list(g.removed), "absent": list(g.absent)} for g in groups]}
        if fleet is not None:
            doc["fleet_removed"] = {h: list(names) for h, names in fleet.items()}
        _json(doc)
        return
    if fleet is not None:
        out.print(_escape(f"removed the serve containers, the router and the keepers of {len(groups)} replicas"))
    for g in groups:
        down(g)


def down(res) -> None:
    if res.removed:
        out.print(_escape(f"removed the container on {len(res.removed)} host(s): {', '.join(res.removed)}"))
    if res.absent:
        out.print(_escape(f"nothing to remove on {len(res.absent)} host(s): {', '.join(res.absent)}"))


# -- check-nccl ----------------------------------------------------------------------------------
def nccl(res, as_json: bool) -> None:
    """check-nccl's result: each node, the bandwidth per message size, the transport, the verdict."""
    from bootstrap.nccl import parse as N

    if as_json:
        _json({
            "ok": res.ok, "verdict": res.verdict, "backend": res.backend, "world_size": res.world_size,
            "seconds": round(res.seconds, 2), "timed_out": list(res.timed_out),
            "nodes": [n.__dict__ for n in res.nodes],
            "bandwidth": [b.__dict__ for b in res.bandwidth],
            "bandwidth_note": N.bandwidth_note(res.world_size, res.bandwidth),
            "transport": None if res.transport is None else {
                "network": res.transport.network, "gdrdma": res.transport.gdrdma,
                "nccl_version": res.transport.nccl_version},
            "findings": [f.__dict__ for f in res.findings], "warnings": res.warnings})
        return
    t = Table(title="nodes")
    for col in ("host", "ip", "node rank", "ranks", "last phase", "result"):
        t.add_column(col)
    for n in res.nodes:
        t.add_row(_escape(n.host), _escape(n.ip), str(n.node_rank), str(n.ranks), _escape(n.last_phase or "-"),
                  "[green]ok[/]" if n.ok else f"[red]FAIL[/] {_escape(n.error[:160])}")
    out.print(t)
    if N.bandwidth_note(res.world_size, res.bandwidth):
        for line in N.format_bandwidth(res.world_size, res.backend, res.bandwidth):
            out.print(_escape(line))
    elif res.bandwidth:
        b = Table(title=f"all-reduce ({res.backend}, {res.world_size} ranks)")
        for col in ("size (B)", "count", "time (us)", "algbw (GB/s)", "busbw (GB/s)"):
            b.add_column(col, justify="right")
        for r in res.bandwidth:
            b.add_row(str(r.bytes), str(r.count), f"{r.time_us:.1f}", f"{r.algbw_GBps:.4f}",
                      f"{r.busbw_GBps:.4f}")
        out.print(b)
    if res.transport is not None:
        out.print(_escape(f"NCCL transport: {res.transport.network or 'unknown'}"
                          f"{' with GPUDirect RDMA' if res.transport.gdrdma else ''}"))
    findings(res.findings)
    for w in res.warnings:
        err.print(f"[bold red]{_escape(w)}[/]")
    out.print(("[green]" if res.ok else "[red]") + _escape(res.verdict) + "[/]")


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


# -- doctor --------------------------------------------------------------------------------------
def doctor(inv, rep, as_json: bool) -> None:
    if as_json:
        _json({"ok": rep.ok, "findings": [f.__dict__ for f in rep.findings]})
        return
    findings(rep.findings)
    n_err = sum(f.severity == "error" for f in rep.findings)
    out.print(f"{len(rep.findings)} finding(s), {n_err} error(s) on {len(inv.hosts)} host(s)"
              if rep.findings else f"no problems found on {len(inv.hosts)} host(s)")


# -- logs ----------------------------------------------------------------------------------------
def log_echo(width: int, as_json: bool = False):
    """logs' emit(source, line): the line on stdout after its host and source (a JSON object per line
    with --json); safe from many threads."""
    lock = threading.Lock()
    sw = max(len(s) for s in SOURCES)

    def emit(src, line: str) -> None:
        with lock:
            if as_json:
                click.echo(json.dumps(_mask_doc({"host": src.host, "source": src.source, "line": line})))
            else:
                click.echo(_escape(f"{src.host:<{width}} {src.source:<{sw}} | {line}", lines=True, markup=False))
    return emit


def logs_result(res, asked: bool) -> None:
    """After the logs: on stderr, what was asked for and is not there, and what could not be read."""
    if asked:
        for src in res.absent:
            err.print(_escape(f"note: no {src.source} log on {src.host}: "
                              + (f"{src.path} is not in {src.container}" if src.path
                                 else f"no container {src.container}")))
    if not res.read:
        err.print(_escape("error: none of the chosen logs exists on the chosen hosts"
                          + ("" if asked else " (is the cluster up? `bootstrap up`)")))
    for what, why in res.failed.items():
        err.print(_escape(f"error: could not read {what}: {why}"))


# -- serve ---------------------------------------------------------------------------------------
def serve_plan(plan, dry_run: bool) -> None:
    """The serve plan, before anything starts: model, backend, split and why, each node's command."""
    shape = (f" ({plan.shape.describe()}; config.json from {plan.config_source})"
             if plan.shape is not None and plan.shape.known else " (config.json not read: split unchecked)")
    out.print(f"model:   {_escape(plan.model)}{_escape(shape)}")
    out.print(_escape(f"backend: {plan.backend} ({plan.backend_reason})"))
    out.print(f"split:   {_escape(plan.split.reason)}")
    if plan.fit is not None:
        out.print(f"fit:     {_escape(plan.fit.message)}")
    width = max(len(n.host) for n in plan.nodes)
    for n in plan.nodes:
        cmd = _argv(n.argv) if n.argv else "(a Ray worker: vLLM places its ranks here through Ray)"
        out.print(_escape(f"  {n.host:<{width}} {n.ip:<15} {cmd}"))
    out.print(_escape(f"endpoint: {plan.endpoint}"))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        if plan.secrets:
            out.print(_escape(f"a real run needs {', '.join(plan.secrets)} set in your environment (cluster.secrets)"))
        out.print("dry run: nothing was started")


def fleet_serve_plan(plan, dry_run: bool) -> None:
    """The fleet's serve plan, before anything starts: each replica's commands, the router, the endpoint."""
    out.print(f"model:    {_escape(plan.spec.model)} (image {_escape(plan.spec.image)})")
    if plan.uniform:
        out.print(f"split:    {_escape(plan.split.reason)} on each replica (backend native)")
    for r in plan.replicas:
        out.print(_escape(f"replica {r.index}{f' ({r.role})' if r.role else ''}: {', '.join(r.hosts)} -> {r.url}"))
        if not plan.uniform:
            out.print(f"  split: {_escape(plan.split_of(r).reason)} (backend native)")
        for m in r.members:
            out.print(_escape(f"  {m.host} rank {m.rank}: {_argv(m.vllm)}"))
    for r in plan.routers:
        out.print(_escape(f"router on {r.host}: {_argv(r.run)}"))
        if r.vip_create:
            out.print(_escape(f"keepalived on {r.host}: {_argv(r.vip_create)}"))
    out.print(_escape(f"endpoint: {plan.endpoint}" + (" (floating address)" if plan.vip else "")))
    for note in plan.notes:
        out.print(f"note: {_escape(note)}")
    if dry_run:
        out.print("dry run: nothing was started")


def dry_run(plan, as_json: bool) -> None:
    """serve --dry-run: the plan was printed before; with --json, the plan as a document."""
    if as_json:
        _json({"dry_run": True, **plan.to_dict()})


def serve_failed(exc, with_findings: bool = True) -> None:
    """Why vLLM did not come up: its log's last lines, and what they point at."""
    _log_tail(exc.log_tail, getattr(exc, "tail_of", "the vLLM log"))
    if with_findings:
        findings(exc.findings)


def serve_stopped() -> None:
    out.print("stopped serving on every node; the Ray cluster is still up")


def served(res, as_json: bool) -> None:
    """serve's result: the endpoint, the split, the KV cache and a curl to try."""
    kv = res.kv
    if as_json:
        _json({
            "endpoint": res.endpoint, "model": res.model, "served": res.served, "backend": res.backend,
            "tp": res.parallelism.tp, "pp": res.parallelism.pp, "dp": res.parallelism.dp,
            "ep": res.parallelism.ep_size, "ready_seconds": round(res.ready_seconds, 1),
            "kv_cache_tokens": getattr(kv, "tokens", None), "notes": res.notes,
            "split_reason": res.plan.split.reason if res.plan else None,
            "backend_reason": res.plan.backend_reason if res.plan else None})
        return
    for n in res.notes:
        out.print(f"note: {_escape(n)}")
    dp_part = f"DP={res.parallelism.dp} x " if res.parallelism.dp > 1 else ""
    ep_part = f", EP={res.parallelism.ep_size}" if res.parallelism.ep else ""
    out.print(_escape(f"serving {res.served[0] if res.served else res.model} on {res.endpoint} "
                      f"(backend {res.backend}, {dp_part}TP={res.parallelism.tp}, PP={res.parallelism.pp}{ep_part}); "
                      f"ready in {res.ready_seconds:.0f}s"))
    if kv is not None:
        out.print(_escape(kv_line(kv)))
    out.print("try: " + _escape(res.curl()))


def kv_line(kv) -> str:
    """The KV cache capacity as figures: tokens, and how many requests of the longest length fit."""
    line = f"KV cache: {kv.tokens:,} tokens"
    if kv.concurrency is not None and kv.request_tokens:
        line += f" ({kv.concurrency:g} requests of {kv.request_tokens:,} tokens at once)"
    return line


def fleet_serve_stopped(replicas: int) -> None:
    out.print(f"stopped serving on {replicas} replicas and the router; the node containers are still up")


def fleet_served(inv, res, as_json: bool) -> None:
    """serve's result with replicas: the router's endpoint, each replica's time to ready, a curl."""
    if as_json:
        _json({"endpoint": res.endpoint, "served": res.served, **res.plan.to_dict(),
               "ready_seconds": {str(k): v for k, v in res.ready_seconds.items()},
               "seconds": round(res.seconds, 1), "kv_check": [r.to_dict() for r in res.kv]})
        return
    for n in res.notes:
        out.print(f"note: {_escape(n)}")
    for r in res.kv:
        out.print(_escape(f"kv-check: {r.describe()}"))
    ready = ", ".join(f"replica {k} {t:.0f}s" for k, t in sorted(res.ready_seconds.items()))
    plan = res.plan
    shape = (f"{len(plan.replicas)} replicas x {split_label(plan.split.par)}" if plan.uniform else
             "replicas " + ", ".join(f"{r.index}{f' ({r.role})' if r.role else ''} {split_label(plan.split_of(r).par)}"
                                     for r in plan.replicas))
    out.print(_escape(f"serving {res.served[0] if res.served else res.plan.spec.model} on {res.endpoint} "
                      f"({shape}, router "
                      f"{inv.cluster.router.policy} on {', '.join(r.host for r in res.plan.routers)}"
                      f"{', floating address' if res.plan.vip else ''}); ready: {ready}; "
                      f"took {res.seconds:.0f}s"))
    out.print("try: " + _escape(res.curl()))


def kv_check(results, infiniband: bool, as_json: bool) -> None:
    """check-kv: one line per prefill x decode pair, the warnings, and the verdict."""
    ok = all(r.ok for r in results)
    if as_json:
        _json({"ok": ok, "pairs": [r.to_dict() for r in results],
               "warnings": [w for w in (r.warning(infiniband) for r in results) if w]})
        return
    for r in results:
        (out if r.ok else err).print(_escape(f"kv-check: {r.describe()}"))
    for w in (r.warning(infiniband) for r in results):
        if w:
            err.print(f"warning: {_escape(w)}")
    bad = sum(not r.ok for r in results)
    out.print(f"KV transfer check: {'PASS' if ok else 'FAIL'} ({len(results)} pair(s)"
              f"{f', {bad} failed' if bad else ''})")


# -- rollout -------------------------------------------------------------------------------------
def rollout_step(as_json: bool):
    """rollout's on_step(k, what): a timed line per replica and step on stderr."""
    t0 = time.monotonic()

    def step(k: int, what: str) -> None:
        if not as_json:
            err.print(_escape(f"{time.monotonic() - t0:7.1f}s replica {k}: {what}"))
    return step


def rollout_failed(exc) -> None:
    """The failed replica's log tail, then each replica's state."""
    _log_tail(exc.log_tail, "the failed replica's vLLM log")
    for k, st in sorted(exc.states.items()):
        err.print(_escape(f"  replica {k}: {st}"))


def rollout(res, as_json: bool) -> None:
    if as_json:
        _json({"endpoint": res.endpoint, "model": res.target.model,
               "extra": list(res.target.extra), "image": res.target.image,
               "replaced": res.replaced, "unchanged": res.unchanged,
               "seconds": round(res.seconds, 1),
               "steps": {str(k): {n: round(v, 1) for n, v in d.items()}
                         for k, d in res.steps.items()}})
        return
    if not res.replaced:
        out.print(_escape(f"every replica already serves {res.target.describe()}: nothing to do"))
        return
    out.print(_escape(f"rolled out {res.target.describe()} to replica(s) {', '.join(map(str, res.replaced))} "
                      f"in {res.seconds:.0f}s; serving on {res.endpoint}"))


# -- top -----------------------------------------------------------------------------------------
def top(inv, frame, as_json: bool) -> None:
    """One frame of `top` (--once, --json)."""
    if as_json:
        _json(frame.to_dict())
    else:
        out.print(_top_table(inv, frame))


def top_live(inv, look, interval: float) -> None:
    """`top` until Ctrl-C: a frame from look() every `interval` seconds, redrawn in place."""
    from rich.live import Live

    with Live(_top_table(inv, look()), console=out, auto_refresh=False,
              screen=False, transient=False) as live:
        while True:
            t0 = time.monotonic()
            live.update(_top_table(inv, look()), refresh=True)
            time.sleep(max(0.0, interval - (time.monotonic() - t0)))


def _top_table(inv, frame) -> Table:
    def f(v, fmt="{:.1f}", unit=""):
        return "-" if v is None else fmt.format(v) + unit

    def ms(v):
        return "-" if v is None else f"{v * 1000:.0f}"

    stamp = time.strftime("%H:%M:%S", time.localtime(frame.t))
    src = "probes" if frame.source == "probe" else f"Prometheus {frame.source}"
    t = Table(title=_escape(f"{inv.cluster.name} at {stamp}, every {frame.interval:g}s from {src}; "
                            f"latency over the last {frame.window:.0f}s"), title_justify="left")
    for col in ("replica", "running", "waiting", "req/s", "tok/s", "TTFT p50/p95 ms", "ITL p50/p95 ms",
                "KV %", "hosts / why down"):
        t.add_column(col, justify="left" if col in ("replica", "hosts / why down") else "right")
    for r in (r for r in frame.rows if r.kind == "replica"):
        style = None if r.up else "red"
        t.add_row(_escape(r.name), f(r.running, "{:.0f}"), f(r.waiting, "{:.0f}"), f(r.req_s, "{:.2f}"),
                  f(r.tok_s), f"{ms(r.ttft_p50)}/{ms(r.ttft_p95)}", f"{ms(r.itl_p50)}/{ms(r.itl_p95)}", f(r.kv),
                  _escape(", ".join(r.hosts) if r.up else f"DOWN: {r.error}"), style=style)
    n = Table(title_justify="left")
    for col in ("node", "replica", "CPU %", "mem %", "GPU %", "GPU mem %", "why down"):
        n.add_column(col, justify="left" if col in ("node", "why down") else "right")
    for r in (r for r in frame.rows if r.kind == "node"):
        n.add_row(_escape(r.name), "-" if r.replica is None else str(r.replica), f(r.cpu), f(r.mem),
                  f(r.gpu_util), f(r.gpu_mem), "" if r.up else _escape(f"DOWN: {r.error}"),
                  style=None if r.up else "red")
    grid = Table.grid()
    grid.add_row(t)
    grid.add_row(n)
    return grid


# -- bench ---------------------------------------------------------------------------------------
def bench(res, spread, png: str | None, as_json: bool) -> None:
    """bench's result: the report with its histograms, how the requests spread over the replicas."""
    from bootstrap.serve import bench as B

    if as_json:
        _json({**res.to_dict(), **({"spread": spread.to_dict()} if spread else {})})
        return
    out.print(_escape(B.format_result(res), lines=True))
    if spread is not None:
        out.print(_escape(spread.describe()))
    if png:
        out.print(_escape(f"histograms: {png}"))


# -- monitor -------------------------------------------------------------------------------------
def targets(res) -> None:
    """Prometheus' scrape targets, up or down."""
    t = Table(title=f"Prometheus {_escape(res.url)} on {_escape(res.host)}: "
                    f"{len(res.targets) - len(res.down)} of {len(res.targets)} target(s) up")
    for col in ("job", "host", "replica", "url", "health", "error"):
        t.add_column(col)
    for x in res.targets:
        color = "green" if x.health == "up" else "red"
        t.add_row(_escape(x.job), _escape(x.host), x.replica or "-", _escape(x.url), f"[{color}]{x.health}[/]",
                  _escape(x.error[:100]))
    out.print(t)


def monitor_up(inv, res, as_json: bool) -> None:
    """monitor up's result: the targets, where Prometheus is and how to reach it, the warnings."""
    if as_json:
        _json(res.to_dict())
        return
    targets(res)
    when = (f"all up {res.all_up_after:.1f}s after the start" if res.all_up_after is not None
            else f"{len(res.down)} down")
    mh = next(h for h in inv.hosts if h.name == res.host)
    out.print(_escape(f"Prometheus: {res.url} ({when}; took {res.seconds:.1f}s); "
                      f"{_ssh_tunnel(mh, mh.ip, inv.cluster.monitor.port)}"))
    if res.down and not res.down_infrastructure:
        out.print("note: vLLM's targets are up once `bootstrap serve` runs; Prometheus keeps trying")
    for w in res.warnings:
        out.print(f"[yellow]warning:[/] {_escape(w)}")


def monitor_status(res, as_json: bool) -> None:
    if as_json:
        _json(res.to_dict())
    else:
        targets(res)


def monitor_down(removed: dict, purge: bool, as_json: bool) -> None:
    if as_json:
        _json({"hosts": removed, "purged": purge})
        return
    out.print(_escape(f"monitoring removed from {len(removed)} host(s)" + (" (data purged)" if purge else "")))


# -- sandbox -------------------------------------------------------------------------------------
def sandbox_log(message: str) -> None:
    err.print(f"[dim]sandbox:[/] {_escape(message)}")


def sandbox_up(info) -> None:
    out.print(_escape(f"sandbox up: {len(info.nodes)} node(s) on {info.subnet}, registry {info.registry}"
                      + (f"; {info.gpu.describe()}" if info.gpu.shaped else "")
                      + (f"; {info.links.describe()}" if info.links.shaped else "")))
    out.print(_escape(f"inventory: {info.inventory}"))
    if info.gpu_inventory:
        out.print(_escape(f"GPU inventory: {info.gpu_inventory} (the same nodes as a GPU cluster; vLLM still "
                          "computes on CPU)"))
    out.print(_escape(f"next: bootstrap up -i {info.inventory}"))


def sandbox_down() -> None:
    out.print("sandbox down")
