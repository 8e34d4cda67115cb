"""The `bootstrap` command's frame: the root group and its help, the signal handler, and how a command ends.

_run calls a command's body: a domain error becomes one line and its exit code (errors.ExitStatus),
an option the inventory refuses (face.OptionError) a usage error of the command, Ctrl-C or SIGTERM
exit 130 with each host's state. The commands themselves are in cli/commands_*.py.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

import click

from bootstrap import face
from bootstrap.cli import render, runlog
from bootstrap.cli.become import become_option
from bootstrap.cli.params import INVENTORY_BEFORE, inventory_before_option
from bootstrap.errors import BootstrapError, ExitStatus
from bootstrap.face import OptionError


def _fail(exc: BootstrapError) -> "NoReturn":  # noqa: F821
    render.failure(exc)
    path = runlog.finish(int(exc.exit_status), exc)
    if path is not None and exc.exit_status != ExitStatus.BAD_INPUT:  # bad input: its one line is all
        render.err.print(render._escape(f"  run log: {path}"), highlight=False, soft_wrap=True)
    sys.exit(int(exc.exit_status))


class _Interrupts:
    """The handler of SIGINT and SIGTERM while a command runs. The first raises KeyboardInterrupt
    where the main thread is: the command stops its remote work and reports each host's state. The
    next one is only noted, not raised into that clean-up: a KeyboardInterrupt raised inside
    threading's own clean-up (Condition.wait's, Thread.join's) breaks it -- `RuntimeError: release
    unlocked lock` instead of exit 130, and locks left held. One more exits at once with 130; the
    cluster lock goes with the process's SSH connection (its remote holder exits when it closes)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.seen = 0
        self.before: dict[int, object] = {}

    def install(self) -> None:
        for signum in self.SIGNALS:
            before = signal.getsignal(signum)
            if signum == signal.SIGINT and before == signal.SIG_IGN:
                continue  # started with Ctrl-C ignored (in the background): it stays ignored
            self.before[signum] = before
            signal.signal(signum, self)

    def uninstall(self) -> None:
        """Put the handlers back, unless a signal came: the process is on its way out with 130 then,
        and one more must not change that. This handler stays while the interpreter joins its threads
        (a third signal still exits at once), then (atexit) the signals are ignored: Python puts the
        default handlers back as it finalizes, and a SIGTERM then would end it with -15, not 130."""
        if self.seen:
            atexit.register(self.ignore_late)
            return
        for signum, before in self.before.items():
            signal.signal(signum, before)  # type: ignore[arg-type]

    def ignore_late(self) -> None:
        for signum in self.before:
            signal.signal(signum, signal.SIG_IGN)

    def __call__(self, signum, frame) -> None:  # noqa: ANN001 - signal handler signature
        self.seen += 1
        if self.seen == 1:
            raise KeyboardInterrupt
        # os.write, not print: the interrupted main thread may be inside a print to stderr
        if self.seen == 2:
            os.write(2, render.INTERRUPTED_AGAIN.encode())
            return
        os.write(2, render.INTERRUPTED_AT_ONCE.encode())
        os._exit(int(ExitStatus.INTERRUPTED))


def _command_done(host: str, shown: str, code, seconds: float) -> None:
    """Each remote command: a line in the run log; on stderr too with -v."""
    line = runlog.command(host, shown, code, seconds)
    if runlog.verbose:
        render.err.print(line, markup=False, highlight=False, soft_wrap=True)


def _run(fn):
    """Call fn, mapping domain errors and interrupts to one line + a documented exit code.

    SIGTERM is handled like Ctrl-C: commands that change hosts stop their remote work and report
    each host's state (see _Interrupts)."""
    interrupts = _Interrupts()
    if threading.current_thread() is threading.main_thread():
        interrupts.install()
    runlog.mask = render.mask_credentials
    runlog.start(sys.argv)
    face.trace_commands(_command_done)
    try:
        res = fn()
        runlog.finish(0)
        return res
    except OptionError as exc:  # the command line's mistake: a usage error of the command
        runlog.finish(int(ExitStatus.BAD_INPUT), exc)
        if exc.param_hint is not None:
            raise click.BadParameter(str(exc), param_hint=exc.param_hint) from None
        raise click.UsageError(str(exc)) from None
    except BootstrapError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        render.interrupted()
        path = runlog.finish(int(ExitStatus.INTERRUPTED))
        if path is not None:
            render.err.print(render._escape(f"  run log: {path}"), highlight=False, soft_wrap=True)
        sys.exit(int(ExitStatus.INTERRUPTED))
    except click.ClickException as exc:  # raised by a command's own checks: a usage error, exit 2
        runlog.finish(int(ExitStatus.BAD_INPUT) if isinstance(exc, click.UsageError) else exc.exit_code, exc)
        raise
    except SystemExit as exc:  # a command's own exit status (exit_on): the log says it
        runlog.finish(exc.code if isinstance(exc.code, int) else 1)
        raise
    except BaseException as exc:
        runlog.finish(1, exc)
        raise
    finally:
        face.trace_commands(None)
        interrupts.uninstall()


class _KnowsCommand:
    """Usage errors from click's parser carry no context: give them this command's, so the line
    names the command (`up: Option '--parallel' requires an argument`)."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            if e.ctx is None:
                e.ctx = ctx
            raise


class _Command(_KnowsCommand, click.Command):
    pass


#: The root help's sections: every command in one (a test checks), in the order a newcomer meets them.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cluster", ("validate", "plan", "sudoers", "up", "status", "exec", "down")),
    ("checks", ("check-nccl", "check-kv", "doctor", "logs")),
    ("serving", ("serve", "rollout", "drain", "undrain", "adapter", "bench")),
    ("observe", ("top", "monitor")),
    ("sandbox (try it on one machine)", ("sandbox",)),
)
#: What each exit code means, for --help (errors.ExitStatus documents them in the code).
EXIT_MEANINGS = {
    ExitStatus.OK: "done",
    ExitStatus.ERROR: "a step on a host failed, or a check found an error",
    ExitStatus.BAD_INPUT: "bad input (inventory, arguments): nothing was touched on any host",
    ExitStatus.PREFLIGHT: "a host is not ready (unreachable, no Docker, wrong GPUs, no Ray): nothing changed",
    ExitStatus.TIMEOUT: "a deadline passed",
    ExitStatus.LOCKED: "another up/down holds the cluster lock: nothing changed",
    ExitStatus.INTERRUPTED: "interrupted (Ctrl-C, SIGTERM): each host's state is listed",
}


def _take_verbose(args: list[str]) -> list[str]:
    """-v/--verbose after the command's name (`bootstrap up -v`): the root's, taken out before `--`
    (what follows `--` is the user's own command or vLLM's flags)."""
    cut = args.index("--") if "--" in args else len(args)
    if not any(a in ("-v", "--verbose") for a in args[:cut]):
        return args
    runlog.verbose = True
    return [a for a in args[:cut] if a not in ("-v", "--verbose")] + args[cut:]


class _Group(_KnowsCommand, click.Group):
    """A group below the root (`monitor`, `sandbox`): its commands under click's "Commands:"
    heading, in the order they are defined (not the root's sections). Its commands and groups are
    of the same kind; `-i` given before the command reaches none of them that reads no inventory."""

    command_class = _Command
    group_class = type

    def list_commands(self, ctx) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx, formatter) -> None:
        rows = [(n, self.commands[n].get_short_help_str(SUMMARY_LIMIT))
                for n in self.list_commands(ctx) if not self.commands[n].hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, click.Group):
            rest = _take_verbose(rest)
        if (cmd is not None and not isinstance(cmd, click.Group) and ctx.meta.get(INVENTORY_BEFORE) is not None
                and not any(p.name == "inventory" for p in cmd.params)):
            raise click.UsageError(f"{ctx.command_path} {name} reads no inventory: remove -i/--inventory", ctx)
        return name, cmd, rest


#: a command's summary in the lists of commands: its docstring's first sentence whole (click cuts it at the
#: terminal's width with "..." by default), wrapped by the help formatter
SUMMARY_LIMIT = 400


class _Main(_Group):
    """The root command: click's usage errors (bad value, missing argument, unknown option or
    command) become one line on stderr and exit 2, like every other error here. Its groups
    (`monitor`, `sandbox`) are _Groups."""

    group_class = _Group

    def list_commands(self, ctx) -> list[str]:
        return click.Group.list_commands(self, ctx)

    def format_commands(self, ctx, formatter) -> None:
        """The commands in SECTIONS, a section each; one not placed there goes under "other"."""
        listed = {n for _, names in SECTIONS for n in names}
        rest = sorted(n for n in self.list_commands(ctx) if n not in listed)
        for title, names in (*SECTIONS, ("other", tuple(rest))):
            rows = [(n, self.commands[n].get_short_help_str(SUMMARY_LIMIT))
                    for n in names if n in self.commands and not self.commands[n].hidden]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)

    def format_epilog(self, ctx, formatter) -> None:
        with formatter.section("Exit codes"):
            formatter.write_dl([(str(int(s)), EXIT_MEANINGS[s]) for s in ExitStatus])
        with formatter.section("Shell completion"):
            formatter.write_text('bash: eval "$(_BOOTSTRAP_COMPLETE=bash_source bootstrap)" in ~/.bashrc '
                                 '(zsh_source, fish_source for zsh and fish)')

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name or render.PROG, complete_var, False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as click does
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            render.usage_error(e)
            sys.exit(int(ExitStatus.BAD_INPUT) if isinstance(e, click.UsageError) else e.exit_code)
        except click.Abort:
            render.aborted()
            sys.exit(int(ExitStatus.INTERRUPTED))
        sys.exit(rv if isinstance(rv, int) else 0)


def _verbose(ctx, param, value):
    if value:
        runlog.verbose = True
    return value


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@inventory_before_option
@become_option
@click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_verbose,
              help="Every step of every host and every remote command on stderr as it happens (before or after the "
                   "command's name); they always go to the run log (~/.cache/bootstrap/runs/, $BOOTSTRAP_RUNS).")
@click.version_option(package_name="bootstrap-vllm")
def main() -> None:
    """Turn GPU machines reachable over SSH and running Docker into one vLLM serving service.

    \b
    bootstrap up -i hosts.yaml           start a vLLM container on every host, joined as one cluster
    bootstrap check-nccl -i hosts.yaml   prove the nodes can all-reduce, with bandwidth
    bootstrap serve -i hosts.yaml MODEL  serve MODEL with a split the model can take

    Every command takes -i/--inventory (default $BOOTSTRAP_INVENTORY, then ./hosts.yaml), before
    or after its name, and -h/--help. The documentation: docs/ in the repository (mkdocs serve).
    """


def exit_on(result) -> None:
    """End the command with the result's exit status when it is not 0 (exit 1: a host or a check failed)."""
    status = result.exit_status
    if status != ExitStatus.OK:
        sys.exit(int(status))
