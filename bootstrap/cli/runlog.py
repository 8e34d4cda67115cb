"""The run log: one file per command that runs (`~/.cache/bootstrap/runs/`), kept for what the screen
does not keep.

It holds the command line, every event of every host (those the screen shows, and the start of every
stage, which it does not), every remote command with its exit status and time, and how the run ended
(with the error's cause chain). The error line names it. Credentials are masked as on the screen, and
bootstrap keeps secrets off command lines, so none reaches it. `-v/--verbose` prints the same events
and commands on stderr as they happen.

$BOOTSTRAP_RUNS: another folder for the logs; `off`: none. The newest KEEP logs are kept: only files named as
run logs are (OWN: `20261207T130525.041011Z-serve.log`), so a folder shared with other programs' logs loses
none of theirs, and the log just opened is never among them.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

RUNS_ENV = "BOOTSTRAP_RUNS"
#: how many run logs are kept (the oldest go first)
KEEP = 100
#: the name of a run log (start): a UTC stamp to the microsecond, the command's name; nothing else is ours
OWN = re.compile(r"\d{8}T\d{6}\.\d{6}Z-[A-Za-z0-9-]{1,24}\.log")


def runs_dir() -> Path | None:
    """Where the run logs go: $BOOTSTRAP_RUNS, else $XDG_CACHE_HOME or ~/.cache, under bootstrap/runs; None: off."""
    given = os.environ.get(RUNS_ENV)
    if given is not None:
        return None if given.strip().lower() in ("", "off", "0", "none") else Path(given).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "bootstrap" / "runs"


class RunLog:
    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, line: str) -> None:
        text = mask(line)
        with self.lock:
            if not self.file.closed:
                self.file.write(f"{time.monotonic() - self.t0:9.2f}s {text}\n")
                self.file.flush()

    def close(self, status: int, exc: BaseException | None = None) -> None:
        if exc is not None:
            self.write(f"error: {exc}")
            if not _expected(exc):  # a bug's traceback; a user's mistake or a host's failure is its line
                for line in "".join(traceback.format_exception(exc)).rstrip().splitlines():
                    self.write(f"  {line}")
            cause = exc.__cause__ or exc.__context__
            while cause is not None:
                self.write(f"  because: {type(cause).__name__}: {cause}")
                cause = cause.__cause__ or cause.__context__
        self.write(f"exit {status}")
        with self.lock:
            self.file.close()


def _expected(exc: BaseException) -> bool:
    import click

    from bootstrap.errors import BootstrapError
    return isinstance(exc, (BootstrapError, click.ClickException))


#: the run log of the command running in this process (None: none, or off)
current: RunLog | None = None
#: -v/--verbose: every event and remote command on stderr too
verbose = False
#: what masks credentials in a line (the CLI sets show.mask_credentials: the screen's own)
mask: Callable[[str], str] = str


def start(argv: list[str]) -> RunLog | None:
    """Open this run's log (None when off or not writable: a run never fails for its log)."""
    global current
    where = runs_dir()
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
        name = next((a for a in argv[1:] if not a.startswith("-")), "bootstrap")
        name = "".join(c for c in name if c.isascii() and (c.isalnum() or c == "-"))[:24] or "bootstrap"
        current = RunLog(where / f"{stamp}-{name}.log")
        _prune(where, current.path)
    except OSError:
        current = None
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        have = version("bootstrap-vllm")
    except PackageNotFoundError:
        have = "?"
    current.write(f"bootstrap {have}: {' '.join(argv)} (cwd {os.getcwd()}, pid {os.getpid()}, "
                  f"python {sys.version.split()[0]})")
    return current


def _prune(where: Path, keep: Path) -> None:
    """The oldest run logs in `where` beyond KEEP removed: files named as run logs only (OWN), never `keep`."""
    logs = sorted(p for p in where.glob("*.log") if OWN.fullmatch(p.name) and p != keep)
    for old in logs[:max(0, len(logs) - (KEEP - 1))]:
        try:
            old.unlink()
        except OSError:
            pass


def event(line: str) -> None:
    if current is not None:
        current.write(line)


def command(host: str, shown: str, code: int | None, seconds: float) -> str:
    """A remote command finished (remote/ssh.py's trace): its line in the run log, and returned (-v shows it)."""
    line = f"{host}: $ {shown}  -> {'timeout' if code is None else code} in {seconds:.2f}s"
    event(line)
    return mask(line)


def finish(status: int, exc: BaseException | None = None) -> Path | None:
    """Close this run's log; its path (None: none was written)."""
    global current
    log, current = current, None
    if log is None:
        return None
    log.close(status, exc)
    return log.path
