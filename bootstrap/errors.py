"""Errors and exit codes.

Every failure is an exception that carries what the user needs to act on it (host, command, exit
code, output tail). The CLI is the only place that turns them into a line on stderr and an exit
code; nothing below it prints.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Sequence


class ExitStatus(enum.IntEnum):
    """Documented exit codes (README, "Exit codes")."""

    OK = 0
    #: A remote step failed (a command on a host, a container that did not start).
    ERROR = 1
    #: Bad input: inventory, arguments. Nothing was touched on any host.
    BAD_INPUT = 2
    #: Preflight found a host not ready (unreachable, no Docker, wrong GPU count, no ray in image).
    #: Nothing was changed on any host.
    PREFLIGHT = 3
    #: A deadline passed (Ray did not report every node in time).
    TIMEOUT = 4
    #: Another `up`/`down` holds the cluster lock on the head host. Nothing was changed.
    LOCKED = 5
    #: Interrupted by Ctrl-C / SIGTERM.
    INTERRUPTED = 130


class BootstrapError(Exception):
    """Base of every error the CLI reports as one line."""

    exit_status = ExitStatus.ERROR


class UsageError(BootstrapError):
    exit_status = ExitStatus.BAD_INPUT


class Declined(BootstrapError):
    """The user answered no to a confirmation (`down`): nothing was changed, exit 1."""


class ServePlanError(UsageError):
    """Bad input for a serve plan (sizes, flags, manifests). One line, nothing touched."""


class ModelSplitError(ServePlanError):
    """The model cannot be split this way (vLLM would refuse it after loading): exit 2, nothing started."""


class FleetError(UsageError):
    """A fleet request that cannot work (exit 2), refused before anything changes."""


@dataclass
class InventoryError(BootstrapError):
    """A problem in the inventory file: names the file, the line and the field."""

    path: str
    line: int | None
    field: str | None
    message: str
    #: the 1-based column, where it says more than the line (a YAML syntax error: FILE:LINE:COL)
    column: int | None = None
    exit_status = ExitStatus.BAD_INPUT

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.path
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class InventoryErrors(BootstrapError):
    """Every field error of an inventory at once (`validate`, a linter's run), in the order of the file.
    Its text is the first error's line and how many more there are; `errors` holds each."""

    exit_status = ExitStatus.BAD_INPUT

    def __init__(self, errors: list[InventoryError]) -> None:
        self.errors = errors
        more = f" (and {len(errors) - 1} more: `bootstrap validate` lists them)" if len(errors) > 1 else ""
        super().__init__(f"{errors[0]}{more}")


@dataclass
class CommandFailed(BootstrapError):
    """A remote command exited non-zero (or timed out)."""

    host: str
    command: str
    exit_code: int | None
    output_tail: str = ""
    hint: str = ""

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        code = "timed out" if self.exit_code is None else f"exit {self.exit_code}"
        tail = " | ".join(ln for ln in self.output_tail.strip().splitlines()[-3:] if ln.strip())
        msg = f"{self.host}: `{self.command}` failed ({code})"
        if tail:
            msg += f": {tail}"
        if self.hint:
            msg += f" -- {self.hint}"
        return msg


def add_note(exc: BaseException, note: str) -> None:
    """Attach a second failure to the one in flight (PEP 678's notes; set by hand before Python
    3.11). The CLI prints an error's notes under its line, so the second failure is not lost."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]


def notes_of(exc: BaseException) -> list[str]:
    """The notes attached to an error (add_note), oldest first."""
    return [str(n) for n in getattr(exc, "__notes__", ()) or ()]


def mark_shown(exc: BaseException) -> None:
    """Say that a host's error was printed whole as it happened (a progress line), so that the
    summary at the end names the host without printing the same error again."""
    try:
        exc.__bootstrap_shown__ = str(exc)  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__
        pass


def was_shown(exc: BaseException) -> bool:
    """mark_shown was called on this error, and it says the same since."""
    return getattr(exc, "__bootstrap_shown__", None) == str(exc)


@dataclass
class PreflightFailed(BootstrapError):
    """A host is not ready for the cluster; nothing was changed on it."""

    host: str
    reason: str
    hint: str = ""
    exit_status = ExitStatus.PREFLIGHT
    prefix = ""

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        msg = f"{self.host}: {self.prefix}{self.reason}"
        return f"{msg} -- {self.hint}" if self.hint else msg


@dataclass
class HostUnreachable(PreflightFailed):
    prefix = "cannot connect over SSH: "


@dataclass
class MonitorUnreachable(HostUnreachable):
    """The monitor host does not answer over SSH: whether Prometheus runs there is unknown, which is
    not the same as "Prometheus is not running" (`monitor status`, `top`, the line under `status`)."""

    prefix = "the monitor host is unreachable (whether Prometheus runs is unknown): "


@dataclass
class ConnectionLost(HostUnreachable):
    """An open SSH connection dropped under a command (the host answered a moment before)."""


@dataclass
class DeadlineExceeded(BootstrapError):
    what: str
    missing: tuple[str, ...] = ()
    exit_status = ExitStatus.TIMEOUT

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.missing:
            return f"{self.what}; missing: {', '.join(self.missing)}"
        return self.what


@dataclass
class GroupError(BootstrapError):
    """Some hosts failed. Carries every host's outcome (like fabric's GroupException)."""

    stage: str
    results: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    @property
    def failures(self) -> dict[str, BaseException]:
        return {h: r for h, r in self.results.items() if isinstance(r, BaseException)}

    @property
    def exit_status(self) -> ExitStatus:  # type: ignore[override]
        codes = {getattr(e, "exit_status", ExitStatus.ERROR) for e in self.failures.values()}
        if codes and codes <= {ExitStatus.PREFLIGHT}:
            return ExitStatus.PREFLIGHT
        if ExitStatus.TIMEOUT in codes:
            return ExitStatus.TIMEOUT
        return ExitStatus.ERROR

    def __str__(self) -> str:
        fails = self.failures
        names = ", ".join(sorted(fails))
        first = "; ".join(str(e) for _, e in sorted(fails.items())[:3])
        more = f" (+{len(fails) - 3} more)" if len(fails) > 3 else ""
        return f"{self.stage} failed on {len(fails)} of {len(self.results)} host(s) [{names}]: {first}{more}"


class LockBusy(BootstrapError):
    """Another `up`/`down` holds the cluster lock on the head host."""

    exit_status = ExitStatus.LOCKED

    def __init__(self, host: str, path: str, holder: str, waited: float) -> None:
        self.host, self.path, self.holder = host, path, holder
        who = f"held by {holder}" if holder else "held by another run"
        waited_s = f" after waiting {waited:g}s" if waited else ""
        super().__init__(f"{host}: the cluster lock {path} is {who}{waited_s}; nothing was changed -- "
                         "wait for that run to finish, or pass --lock-timeout SECONDS to queue behind it")


class LockLost(BootstrapError):
    """The SSH connection holding the cluster lock dropped, and another run took the lock meanwhile."""

    exit_status = ExitStatus.LOCKED

    def __init__(self, host: str, path: str, holder: str, *, ours: bool = False) -> None:
        self.host, self.path, self.holder = host, path, holder
        what = ("our old holder of it on the host had not exited in time" if ours else
                f"{holder or 'another run'} took the lock meanwhile")
        super().__init__(f"{host}: the SSH connection holding the cluster lock {path} dropped and {what}; "
                         "stopped here so that two runs never change the cluster at once -- rerun when that run "
                         "is done (`bootstrap status` shows where each host is)")


class ServeFailed(BootstrapError):
    """vLLM (or a replica, or the router) did not serve: the log tail and the findings in it."""

    def __init__(self, message: str, log_tail: str = "", findings: Sequence[object] = (),
                 tail_of: str = "the vLLM log"):
        super().__init__(message)
        self.log_tail = log_tail
        self.findings = list(findings)
        #: what log_tail is the end of (the CLI's heading above it)
        self.tail_of = tail_of


class ReplicaFailed(BootstrapError):
    """One replica's new spec did not serve during a rollout; `state` is where the rollback left it."""

    def __init__(self, cause: str, state: str, log_tail: str = ""):
        super().__init__(f"{cause} ({state})")
        self.cause, self.state, self.log_tail = cause, state, log_tail


class RolloutFailed(BootstrapError):
    """A rollout stopped: `states` says which spec each replica serves now."""

    def __init__(self, message: str, states: dict[int, str], log_tail: str = ""):
        super().__init__(message)
        self.states = states
        self.log_tail = log_tail


class BenchError(BootstrapError):
    """The benchmark could not start (models endpoint unreachable, no model served) or write its PNG."""


@dataclass
class Interrupted(BootstrapError):
    """Ctrl-C / SIGTERM: remote work stopped; carries the state each host was left in."""

    command: str
    stage: str
    states: Mapping[str, str] = field(default_factory=dict)
    exit_status = ExitStatus.INTERRUPTED

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        return (f"interrupted during {self.stage or 'start-up'}: remote work stopped; "
                f"run `bootstrap {self.command}` again to continue from the state below")
