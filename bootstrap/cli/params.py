"""The command line's values: click option types, the options every command shares, and the checks
that refuse a bad value with one line (exit 2) before any host is contacted.
"""
from __future__ import annotations

import functools
import math
import os
import re
import sys
from pathlib import Path

import click

from bootstrap import face
from bootstrap.cli.become import become_option, become_password
from bootstrap.errors import Declined, FleetError, ServePlanError, UsageError
from bootstrap.face import DEFAULT_PARALLEL
from bootstrap.face import mode as M
from bootstrap.face import serve_flags as P


def read_inventory(path: str | None, check_files: bool = True, require_secrets: bool = True):
    """The inventory that --inventory names, else $BOOTSTRAP_INVENTORY, else ./hosts.yaml, loaded
    (face.load_inventory)."""
    path = inventory_path(path)
    ctx = click.get_current_context(silent=True)
    return face.load_inventory(path, check_files=check_files, require_secrets=require_secrets,
                               # --accept-new-host-keys on this command
                               accept_new_host_keys=bool(ctx is not None and ctx.meta.get(ACCEPT_NEW_KEYS)),
                               become_password=become_password(ctx))


def inventory_path(path: str | None) -> str:
    """The path of the inventory that --inventory names, else $BOOTSTRAP_INVENTORY, else ./hosts.yaml;
    one the user named that cannot be an inventory file is a bad argument."""
    given = "--inventory"
    if path is None:
        path, given = os.environ.get("BOOTSTRAP_INVENTORY"), "$BOOTSTRAP_INVENTORY"
        if not path:
            if not Path("hosts.yaml").exists():
                raise click.UsageError("no inventory: pass -i FILE, set BOOTSTRAP_INVENTORY, or create ./hosts.yaml")
            path, given = "hosts.yaml", None
    if given is not None:  # named by the user: a path that cannot be an inventory is a bad argument
        why = ("is empty" if not path.strip() else "no such file" if not os.path.lexists(path)
               else "is a directory, not an inventory file" if os.path.isdir(path) else None)
        if why is not None:
            raise click.BadParameter(f"{path if path.strip() else repr(path)}: {why}", param_hint=given)
    return path


def quote(value: str, limit: int = 60) -> str:
    """repr of a value for a message, cut to `limit` characters (a 5000-digit number is not echoed whole)."""
    return repr(value if len(value) <= limit else value[:limit - 3] + "...")


#: The longest wait any option takes: a week (more is a typo, and overflows the socket timeouts and
#: clocks it is given to).
MAX_SECONDS = 7 * 24 * 3600.0


class Seconds(click.ParamType):
    """A finite number of seconds: above 0, or from `least` (inclusive); at most `most` (a week
    unless said). Every option that takes seconds has this type: nan, inf and 1e999 are refused
    like any value out of range, and only ASCII numbers are read."""

    name = "seconds"

    def __init__(self, least: float | None = None, most: float | None = MAX_SECONDS):
        self.least, self.most = least, most
        if least is None:
            self.kind = "a positive number of seconds" + (f" up to {most:g}" if most is not None else "")
        elif most is None:
            self.kind = f"a number of seconds of {least:g} or more"
        else:
            self.kind = f"a number of seconds from {least:g} to {most:g}"

    def convert(self, value, param, ctx):
        try:
            if isinstance(value, str) and not value.isascii():
                raise ValueError(value)
            v = float(value)
        except (TypeError, ValueError):
            self.fail(f"{quote(str(value))} is not a number of seconds", param, ctx)
        if not (math.isfinite(v) and (v > 0 if self.least is None else v >= self.least)
                and (self.most is None or v <= self.most)):
            shown = str(value).strip()
            self.fail(f"{shown if len(shown) <= 40 else quote(shown, 40)} is not {self.kind}", param, ctx)
        return v


SECONDS = Seconds()


class Text(click.ParamType):
    """A string given on the command line: not empty or blank (an empty `--image ""` is a slip, never
    a value), no NUL. Every option and argument that takes text as it is has this type: click's
    plain STRING is replaced by it on every command (text_params), so a new option has it too."""

    name = "text"

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not value.strip():
                self.fail(f"{value!r} is empty", param, ctx)
            if "\0" in value:
                self.fail(f"{quote(value)} contains a NUL character", param, ctx)
        return value


TEXT = Text()


#: command -> its string parameters whose command refuses an empty value itself, saying more (no
#: model given to serve ...; the image reference's check).
OWN_EMPTY_CHECK = {"serve": ("model",), "rollout": ("model", "image")}


def _then_text(callback):
    """A parameter's callback, then Text's check of what it let through."""
    def check(ctx, param, value):
        value = callback(ctx, param, value)
        return TEXT.convert(value, param, ctx) if isinstance(value, str) else value
    return check


def text_params(group: click.Group) -> None:
    """Every option and argument of every command under `group` that takes a plain string (flags
    aside) refuses an empty value, once, when the CLI is defined: it gets the type Text, or, with a
    callback of its own (whose message says more), Text's check after it; OWN_EMPTY_CHECK aside."""
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            text_params(cmd)
        for p in cmd.params:
            if (type(p.type) is not click.types.StringParamType or getattr(p, "is_flag", False)
                    or p.name in OWN_EMPTY_CHECK.get(cmd.name or "", ())):
                continue
            if p.callback is None:
                p.type = TEXT
            else:
                p.callback = _then_text(p.callback)


class FilePath(click.Path):
    """A file to read or write: not blank, no NUL, not a folder (an existing one, or a name ending in /)."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        if isinstance(value, str):
            if not value.strip():
                self.fail(f"{value!r} is empty", param, ctx)
            if "\0" in value:
                self.fail(f"{value!r} contains a NUL character", param, ctx)
            if value.endswith("/"):
                self.fail(f"{value!r} names a folder, not a file", param, ctx)
        return super().convert(value, param, ctx)


#: ctx.meta key: the -i/--inventory given before the command (`bootstrap -i hosts.yaml up`)
INVENTORY_BEFORE = "bootstrap.inventory_before"


def _inventory_before(ctx, param, value):
    if value is not None:
        ctx.meta[INVENTORY_BEFORE] = value
    return value


def _inventory(ctx, param, value):
    """The command's -i, or the one given before the command; both, differing: a usage error."""
    before = ctx.meta.get(INVENTORY_BEFORE)
    if value is None or before is None:
        return value if value is not None else before
    if os.path.abspath(value) != os.path.abspath(before):
        raise click.UsageError(f"-i/--inventory given twice, {before!r} before the command and {value!r} after it:"
                               " give it once", ctx)
    return value


inventory_option = click.option(
    "-i", "--inventory", "inventory", type=FilePath(), default=None, callback=_inventory,
    help="Inventory file (native or Ansible YAML). Default: $BOOTSTRAP_INVENTORY or ./hosts.yaml.")
#: The root's -i: `bootstrap -i hosts.yaml up` is `bootstrap up -i hosts.yaml`.
inventory_before_option = click.option(
    "-i", "--inventory", "inventory", type=FilePath(), default=None, expose_value=False, callback=_inventory_before,
    help="The inventory of the command that follows (the same as its own -i/--inventory).")
parallel_option = click.option(
    "--parallel", type=click.IntRange(1, 1024), default=DEFAULT_PARALLEL, show_default=True,
    help="How many hosts to work on at once.")
json_option = click.option("--json", "as_json", is_flag=True, help="Print a JSON document on stdout.")
#: ctx.meta key: --accept-new-host-keys was given (read_inventory applies it to the inventory's SSH settings)
ACCEPT_NEW_KEYS = "bootstrap.accept_new_host_keys"


def _accept_new_keys(ctx, param, value):
    if value:
        ctx.meta[ACCEPT_NEW_KEYS] = True
    return value


#: The same flag on every command that opens SSH connections (up and exec take it as a parameter of
#: their own, spelled the same).
accept_keys_option = click.option(
    "--accept-new-host-keys", is_flag=True, expose_value=False, callback=_accept_new_keys,
    help="Trust and record SSH host keys not yet known (changed keys are still refused).")
def host_options(f):
    """-i/--inventory, --accept-new-host-keys, -K and --parallel, in that order: what every command that
    contacts the hosts takes."""
    return inventory_option(accept_keys_option(become_option(parallel_option(f))))


yes_option = click.option(
    "-y", "--yes", is_flag=True,
    help="Do not ask before removing: needed where no terminal can answer (a script, CI).")


def confirm(what: str, yes: bool) -> None:
    """Ask before a command removes what `what` says: [y/N] on a terminal; without one, --yes or a
    refusal (exit 2) before any host is contacted. A "no" leaves everything as it was (exit 1)."""
    if yes:
        return
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError(f"{what}. No terminal to ask: pass --yes to go on")
    if not click.confirm(f"{what}. Go on?", default=False, err=True):
        raise Declined("not confirmed: nothing was removed")


def renamed(old: str, new: str, dest: str, kind: click.ParamType | None = None, callback=None):
    """`old`, the former name of option `new` (parameter `dest`), kept for one release: hidden from
    --help and the reference, read as `new` with a note on stderr when the command ends (not after a
    refusal: bad input stays one line); both given at once is refused.
    Every time limit is `--timeout` (or `--X-timeout` where a command has two)."""
    alias = "renamed_" + old.lstrip("-").replace("-", "_")

    def decorate(f):
        @functools.wraps(f)
        def run(*args, **kw):
            value = kw.pop(alias)
            if value is None:
                return f(*args, **kw)
            ctx = click.get_current_context()
            if ctx.get_parameter_source(dest) is click.core.ParameterSource.COMMANDLINE:
                raise click.UsageError(f"{old} is the old name of {new}: give one of them")
            kw[dest] = value
            refused = False
            try:
                return f(*args, **kw)
            except click.UsageError:
                refused = True  # bad input stays one line
                raise
            except SystemExit as exc:
                refused = exc.code == 2
                raise
            finally:  # last, where it is seen
                if not refused:
                    click.echo(f"note: {old} is now {new}; {old} goes in the next release", err=True)
        return click.option(old, alias, type=kind, default=None, hidden=True, callback=callback,
                            help=f"The former name of {new}, read for one release.")(run)
    return decorate


LOCK_SECONDS = Seconds(0, 86400)


def lock_timeout_option(f):
    """--lock-timeout (formerly --lock-wait): queue behind another up/down on the cluster."""
    f = renamed("--lock-wait", "--lock-timeout", "lock_wait", LOCK_SECONDS)(f)
    return click.option(
        "--lock-timeout", "lock_wait", type=LOCK_SECONDS, default=0.0, show_default=True,
        help="Seconds to wait for another `up`/`down` on this cluster to finish (0: refuse at once, exit 5).")(f)


# Option callbacks, click's (ctx, param, value): a bad value raises click.BadParameter, which click
# completes with the option's name.

def check_nonempty(ctx, param, value):
    """An option that, when given, must not be blank."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} is empty", ctx, param)
    return value


def check_name(ctx, param, value):
    """A name (a model's): not blank, on one line, no control characters."""
    if check_nonempty(ctx, param, value) is not None and not value.isprintable():
        raise click.BadParameter(f"{quote(value)} contains a control character", ctx, param)
    return value


def check_host_names(ctx, param, value: str | None) -> tuple[str, ...] | None:
    """`--limit a,b`: the names, checked against the inventory once it is read. Blank items are
    skipped; a list with no name at all is refused (it would otherwise mean every host)."""
    if value is None:
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        raise click.BadParameter(f"no host name in {quote(value)}")
    return names


def check_command_words(ctx, param, argv: tuple[str, ...]) -> tuple[str, ...]:
    """exec's COMMAND: its first word names a program; no word can hold a NUL (argv cannot)."""
    if argv and not argv[0].strip():
        raise click.BadParameter(f"the command word is empty ({argv[0]!r}): the program to run comes first")
    for word in argv:
        if "\0" in word:
            raise click.BadParameter(f"{quote(word)} contains a NUL character")
    return argv


MAX_SIZE = 1 << 34


def check_sizes(ctx, param, value: str | None) -> str | None:
    """`--sizes 1024,1048576`: whole numbers of bytes, multiples of 4 (float32), up to 16 GiB."""
    if value is None:
        return None
    sizes = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        if not re.fullmatch(r"[0-9]+", part):  # ASCII digits: str.isdigit() also takes '²', int() does not
            where = f" in {quote(value)}" if part != value.strip() else ""
            raise click.BadParameter(f"{quote(part)}{where} is not a whole number of bytes")
        if len(part.lstrip("0")) > len(str(MAX_SIZE)):  # too big, and int() refuses over 4300 digits
            raise click.BadParameter(f"{quote(part, 24)} is not a positive multiple of 4 bytes (float32) up to "
                                     f"{MAX_SIZE}")
        n = int(part)
        if n < 4 or n % 4 or n > MAX_SIZE:
            raise click.BadParameter(f"{n} is not a positive multiple of 4 bytes (float32) up to {MAX_SIZE}")
        sizes.append(n)
    if not sizes:
        raise click.BadParameter(f"no size in {quote(value)}")
    return ",".join(map(str, sizes))


def check_listen(ctx, param, value: str | None) -> str | None:
    """serve's --listen: an IP address (an IPv6 one may name its interface) or a host name."""
    import ipaddress

    if value is None:
        return None
    try:
        ipaddress.ip_address(value)
        # ipaddress takes any text after % as an IPv6 scope: it must name an interface
        ok = re.fullmatch(r"[^%]*(%[A-Za-z0-9_.-]+)?", value) is not None
    except ValueError:
        ok = re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?", value) is not None
    if not ok:
        raise click.BadParameter(f"{quote(value)} is not an IP address or host name")
    return value


def check_url(ctx, param, value: str | None) -> str | None:
    """bench's --url: http://HOST:PORT, as the load generator reads it."""
    if value is not None:
        try:
            face.bench_load.split_url(value)
        except UsageError as exc:
            raise click.BadParameter(str(exc).removeprefix("bench: ")) from None
    return value


def check_png(ctx, param, value: str | None) -> str | None:
    """Checked before the load runs, not after it: the folder exists and matplotlib is there."""
    import importlib.util

    if value is None:
        return None
    parent = Path(value).expanduser().parent
    if not parent.is_dir():
        raise click.BadParameter(f"{value!r}: no folder {str(parent)!r}")
    if importlib.util.find_spec("matplotlib") is None:
        raise click.BadParameter("writing a PNG needs matplotlib: pip install matplotlib, or pip install '.[png]'"
                                 " in the clone")
    return value


# Checks of a command's values together, and against the inventory once it is read.

#: ctx.meta key: the words the user gave before `--` (PassThrough.parse_args).
BEFORE_DASHDASH = "bootstrap.before_dashdash"


class PassThrough(click.Command):
    """A command whose trailing words go to vLLM after `--`. It keeps the words given before `--`, so
    that an option-like word there that bootstrap does not know (a misspelt `--tpp`) is refused
    (check_own_words) rather than forwarded to vLLM and run for real."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[BEFORE_DASHDASH] = tuple(args[:args.index("--")] if "--" in args else args)
        return super().parse_args(ctx, args)


_NUMBER = re.compile(r"-\d+(\.\d*)?")


def check_own_words(ctx: click.Context, positional: int, example: str) -> None:
    """Every word before `--` must be bootstrap's: one of its options (with its value) or one of its
    `positional` arguments. Anything else is refused with one line naming it (with the option it
    resembles), before any host is touched: vLLM's flags go after `--` only."""
    opts = option_table(ctx.command)
    words = ctx.meta.get(BEFORE_DASHDASH, ())
    seen, i = 0, 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.startswith("-") and w != "-" and not _NUMBER.fullmatch(w):
            flag = w.split("=", 1)[0]
            p = opts.get(flag)
            if p is None and not w.startswith("--") and w[:2] in opts:  # -ihosts.yaml
                continue
            if p is None and flag in ("-y", "--yes"):
                raise click.UsageError(f"no such option: {flag}: bootstrap {ctx.info_name} asks no question before it "
                                       "acts, so there is nothing to answer")
            if p is None:
                raise click.UsageError(f"no such option: {flag}{resembles(ctx, flag)}; options for vLLM go after --, "
                                       f"e.g. {example}")
            if not (p.is_flag or p.count) and "=" not in w:
                i += 1  # its value
            continue
        seen += 1
        if seen > positional:
            raise click.UsageError(f"unexpected argument {w!r}: arguments for vLLM go after --, e.g. {example}")


def option_table(cmd: click.Command) -> dict[str, click.Option]:
    """Every spelling of each of the command's options (-i, --inventory, --no-dp, ...) -> the option."""
    return {o: p for p in cmd.params if isinstance(p, click.Option) for o in (*p.opts, *p.secondary_opts)}


def resembles(ctx: click.Context, flag: str) -> str:
    """" (did you mean --stop?)" where `flag` is close to one of this command's long options, else ""."""
    import difflib

    longs = [o for o in option_table(ctx.command) if o.startswith("--")]
    close = difflib.get_close_matches(flag.split("=", 1)[0], longs, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _options_of(cmd: click.Command | None) -> set[str]:
    return {o for p in (cmd.params if cmd is not None else ()) if isinstance(p, click.Option) for o in p.opts}


def check_not_bootstrap_options(ctx: click.Context, extra: tuple[str, ...]) -> None:
    """A word after `--` that is an option of this command (serve, rollout), or of serve (whose split and
    settings a rollout keeps), is refused with one line: vLLM would refuse it (`--tp`), or read it as
    something else. --served-model-name is vLLM's too (refused there as a setting the plan sets)."""
    name = ctx.info_name or "serve"
    own = _options_of(ctx.command)
    root = ctx.find_root()
    serve = root.command.get_command(root, "serve") if name != "serve" and isinstance(root.command, click.Group) \
        else None
    served = _options_of(serve) - own
    for arg in extra:
        flag = arg.split("=", 1)[0]
        if flag == "--served-model-name" or (flag == "--model" and name == "serve"):
            continue  # vLLM's own too: refused as what the plan sets (P.check_extra: use the MODEL argument)
        if flag in own:
            raise click.UsageError(f"{flag} is an option of bootstrap {name}, not of vLLM: put it before --")
        if flag in served:
            raise click.UsageError(f"{flag} is an option of bootstrap serve, not of vLLM: bootstrap {name} keeps "
                                   f"each replica's split and settings (bootstrap serve MODEL {flag} ... serves "
                                   "anew)")


def check_serve_args(ctx: click.Context, model: str | None, extra: tuple[str, ...], stop: bool,
                     dry_run: bool) -> None:
    """What serve can refuse from its arguments alone, before reading the inventory."""
    if stop:
        if model is not None or extra:
            got = " ".join(a for a in (model, *extra) if a is not None)
            raise click.UsageError(f"--stop takes no MODEL or vLLM arguments (got {got!r})")
        if dry_run:
            raise click.UsageError("--dry-run plans a serve; it cannot be combined with --stop")
        return
    if model is None:
        return  # a pool's serve (the inventory's models:), or missing MODEL: check_pool_serve, once it is read
    if model.startswith("-"):
        raise click.UsageError(f"no such option: {model}{resembles(ctx, model)} (vLLM's flags go after MODEL and --)")
    try:
        P.check_model_ref(model)
    except ServePlanError as exc:
        raise click.BadParameter(str(exc), ctx, param_hint="MODEL") from None
    check_not_bootstrap_options(ctx, extra)
    try:
        P.check_extra(extra)
    except ServePlanError as exc:
        raise click.UsageError(str(exc)) from None
    check_own_words(ctx, 1, "bootstrap serve MODEL -- --max-model-len 4096")


def check_pool_serve(inv, model: str | None, given: dict) -> None:
    """serve on an inventory read: MODEL for one model, none for a pool (models:), whose options are
    each model's own (tp, pp, args in models:): `given` names serve's options that were set."""
    if not inv.models:
        if model is None:
            raise click.UsageError("missing MODEL: a Hugging Face id (org/name) or an absolute path inside the "
                                   "containers, or --stop (or list the models in the inventory's models:)")
        return
    names = ", ".join(m.name for m in inv.models)
    if model is not None:
        raise click.UsageError(f"{inv.path} serves its models: ({names}): run serve with no MODEL (change "
                               "models: to change what is served)")
    for opt, value in given.items():
        if value not in (None, False, ()):
            raise click.UsageError(f"{opt}: a pool's models take their own in models: (tp, pp, args) in {inv.path}")


def check_parallelism(inv, tp: int | None, pp: int | None, dp: int | None = None, *, ep: bool = False) -> None:
    """serve's --tp/--pp/--dp/--ep, when given: a split every replica of the cluster can hold (serve/mode.py)."""
    opts = M.Options(tp, pp, dp, ep=ep)
    if not opts.given:
        return
    try:
        M.check(M.Hosts.of(inv), opts)
    except M.SplitRefused as exc:
        where = _on_which(inv) if exc.per_replica else ""
        raise click.UsageError(f"{exc.option}: {exc}{where}" if exc.option else str(exc)) from None


def _replica_sizes(inv) -> list[int]:
    """The replicas' node counts, replica 0's first: a forced split must fit each."""
    return list(dict.fromkeys(len(g) for g in inv.replicas))


def _on_which(inv) -> str:
    sizes = _replica_sizes(inv)
    if len(sizes) == 1:
        return ""
    return (f" (--tp/--pp/--dp apply to every replica, and the replicas have {'/'.join(map(str, sizes))} nodes: "
            "leave them out to have each replica's split planned for its nodes)")


def check_rollout_args(model: str | None, extra: tuple[str, ...], keep_flags: bool, image: str | None = None) -> None:
    """What rollout can refuse from its arguments alone, before reading the inventory: what serve and
    the inventory would refuse in its place (the model, the vLLM flags, the image reference)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        check_own_words(ctx, 0, "bootstrap rollout -- --max-model-len 4096")
        check_not_bootstrap_options(ctx, extra)
    if image is not None:
        why = face.image_problem(image)
        if why is not None:
            raise click.BadParameter(why, param_hint="--image")
    if keep_flags and extra:
        raise click.UsageError("--keep-flags keeps the flags served now: give no vLLM flags with it")
    if model is not None:
        try:
            P.check_model_ref(model)
        except ServePlanError as exc:
            raise click.BadParameter(str(exc), param_hint="--model") from None
    try:
        P.check_extra(extra)
    except ServePlanError as exc:
        raise click.UsageError(str(exc)) from None


def check_fleet_flags(inv, extra: tuple[str, ...]) -> None:
    """The vLLM flags after `--` that this fleet's plan sets beyond serve's (a disaggregated fleet's
    --kv-transfer-config, in any spelling: fleet.plan.check_pd_flags), once the inventory is read and
    before any host is contacted: a usage error that names the command."""
    try:
        face.fleet_plan.check_pd_flags(inv, extra)
    except FleetError as exc:
        raise click.UsageError(str(exc)) from None


def check_kv_port(inv, port: int | None) -> None:
    """check-kv's --port: not a port the cluster or the hosts hold (other than the side channel's own,
    cluster.ports.kv_transfer, the default): the check's listener would fail, or take it from them."""
    if port is None:
        return
    what = face.fence.port_clash(inv.cluster, port)
    if what == "cluster.ports.kv_transfer":
        return
    if what is None and port in {h.ssh.port or 22 for h in inv.hosts}:
        what = "the hosts' SSH port"
    if what is None and 32768 <= port <= 60999:
        what = "in the hosts' ephemeral ports (Linux's default 32768-60999), which outgoing connections take"
    if what is not None:
        raise click.BadParameter(f"{port} is {what}: give a port the cluster does not use (the default is "
                                 f"cluster.ports.kv_transfer, {inv.cluster.ports.kv_transfer})", param_hint="--port")


def check_hosts(inv, hosts: tuple[str, ...]) -> None:
    """logs' HOSTS: each one a host of the inventory."""
    names = {h.name for h in inv.hosts}
    for h in hosts:
        if h not in names:
            raise click.BadParameter(f"no host {h!r} in {inv.path} (hosts: {', '.join(sorted(names))})",
                                     param_hint="HOSTS")
