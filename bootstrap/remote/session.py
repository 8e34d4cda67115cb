"""The session every command runs in: SSH connections to the inventory's hosts, opened once and
reused; stages fanned out over hosts with events and timings; the cluster lock; cancellation; and
the scripts (`checks/`) piped into node containers (with docker.exec_python_argv).
"""
from __future__ import annotations

import getpass
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Protocol

from bootstrap.errors import add_note, mark_shown
from bootstrap.model import Host, Inventory, SSHSettings
from bootstrap.remote.fanout import DEFAULT_PARALLEL, GroupResult, fan_out, run_all
from bootstrap.remote.ssh import HeldLock, SSHHost


class Reporter(Protocol):
    def event(self, host: str, stage: str, status: str, detail: str = "") -> bool | None:
        """Report an event; True when `detail` was shown whole (the summary need not repeat it)."""


class NullReporter:
    def event(self, host: str, stage: str, status: str, detail: str = "") -> None:
        pass


def check_script(name: str) -> bytes:
    """The source of a check from `checks/` (installed as bootstrap.checks)."""
    try:
        return (resources.files("bootstrap.checks") / name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        return (Path(__file__).resolve().parents[2] / "checks" / name).read_bytes()


@dataclass
class Timings:
    stages: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0.0) + seconds


def lock_path(inv: Inventory) -> str:
    """The cluster lock on the head host (cluster names are [a-z0-9-])."""
    return f"/tmp/bootstrap-{inv.cluster.name}.lock"


class Session:
    """SSH sessions to every host of an inventory, opened once and reused across stages."""

    def __init__(self, inv: Inventory, *, parallel: int = DEFAULT_PARALLEL,
                 reporter: Reporter | None = None, clock: Callable[[], float] = time.monotonic,
                 accept_new_host_keys: bool | None = None, settings: SSHSettings | None = None):
        self.inv = inv
        self.parallel = parallel
        self.reporter = reporter or NullReporter()
        self.clock = clock
        settings = settings or inv.cluster.ssh
        if accept_new_host_keys is not None:
            from dataclasses import replace
            settings = replace(settings, accept_new_host_keys=accept_new_host_keys)
        self.settings = settings
        self.ssh = {h.name: SSHHost(h, settings) for h in inv.hosts}
        self.timings = Timings()
        #: Set on Ctrl-C / SIGTERM: no new per-host work starts.
        self.cancel = threading.Event()
        self.current_stage = ""
        self._lock: HeldLock | None = None
        #: set by abandon(): the connections were given up on, close() does nothing
        self._abandoned = False
        #: host name -> (start, end) of its `docker run`, time.time() here.
        self.run_times: dict[str, tuple[float, float]] = {}
        #: node IP -> earliest time.time() (head clock) a Ray poll saw it alive.
        self.ray_seen: dict[str, float] = {}
        self.head_clock_offset: float | None = None
        #: time.time() here when the head's GCS first accepted a connection (`up`'s head-gcs stage).
        self.gcs_open: float | None = None

    # -- helpers ----------------------------------------------------------------------------
    def narrowed(self, inv: Inventory) -> "Session":
        """A session over a part of this one's inventory (a replica group as an inventory of its own)
        that shares this session's connections, reporter and cancel flag; closing it closes nothing."""
        sub = Session.__new__(Session)
        sub.__dict__.update(self.__dict__)
        sub.inv = inv
        sub.ssh = {h.name: self.ssh[h.name] for h in inv.hosts}
        sub._lock = None
        sub._abandoned = True  # close() is this session's to do
        return sub

    def stage(self, stage: str, hosts: Iterable[Host], fn: Callable[[Host], object], *,
              strict: bool = True, said: Callable[[object, float], str] | None = None) -> GroupResult:
        """Run fn on every host (events and timing under `stage`): host name -> result. strict: one
        GroupError when any host failed; else the failures are in the result (`.failed`). said(result,
        seconds): what the host's `done` line adds after its time (a pull's bytes and rate)."""
        hosts = list(hosts)
        t0 = self.clock()
        self.current_stage = stage

        def wrapped(h: Host):
            if self.cancel.is_set():
                raise KeyboardInterrupt
            self.reporter.event(h.name, stage, "start")
            t = self.clock()
            try:
                r = fn(h)
            except BaseException as exc:
                # strict: the GroupError that ends the stage carries the reason (its `error:` line), so the
                # progress line names the host and the stage only; else it is said here, as it happens.
                if strict:
                    self.reporter.event(h.name, stage, "failed")
                elif self.reporter.event(h.name, stage, "failed", str(exc)):
                    mark_shown(exc)  # printed once, as it happened: a summary names the host only
                raise
            secs = self.clock() - t
            extra = said(r, secs) if said is not None else ""
            self.reporter.event(h.name, stage, "done", f"{secs:.1f}s" + (f": {extra}" if extra else ""))
            return r

        try:
            if strict:
                return run_all(stage, hosts, wrapped, key=lambda h: h.name, parallel=self.parallel)
            return fan_out(hosts, wrapped, key=lambda h: h.name, parallel=self.parallel)
        finally:
            self.timings.add(stage, self.clock() - t0)

    def close(self) -> None:
        """Release the cluster lock and close every connection. The connections are closed even
        when releasing the lock fails: closing the one that holds it releases it too."""
        if self._abandoned:
            return
        held, self._lock = self._lock, None
        try:
            if held is not None:
                held.release()
        finally:
            for s in self.ssh.values():
                s.close()

    def abandon(self, within: float = 10.0) -> None:
        """Close every connection after Ctrl-C / SIGTERM, giving up after ``within`` seconds; later
        close() calls do nothing. The interrupt is raised wherever the main thread is, which can be
        inside paramiko between a lock's acquire and the try that releases it (seen once in CI: a
        SIGTERM 0.6 s into head-gcs, then `up` hung past 60 s with no further output): closing that
        transport then waits forever. Its socket closes when the process exits in any case."""
        closing = threading.Thread(target=self.close, name="close-interrupted", daemon=True)
        closing.start()
        closing.join(within)
        self._abandoned = True

    def lock(self, command: str, *, wait: float = 0.0) -> None:
        """Take the cluster lock on the head host for this session (see SSHHost.acquire_lock)."""
        head = self.inv.head
        holder = (f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()} "
                  f"`bootstrap {command}` since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
        t0 = self.clock()
        self.current_stage = "lock"
        self.reporter.event(head.name, "lock", "start")
        self._lock = self.ssh[head.name].acquire_lock(
            lock_path(self.inv), holder, wait=wait,
            on_wait=lambda who: self.reporter.event(head.name, "lock", "waiting", f"held by {who}"))
        self.reporter.event(head.name, "lock", "done", f"{self.clock() - t0:.1f}s")
        self.timings.add("lock", self.clock() - t0)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001 - the context manager protocol
        """On an interrupt (Ctrl-C, SIGTERM) the connections are closed within a bound (abandon), so
        the command exits; otherwise close."""
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            self.cancel.set()
            self.abandon()
        else:
            self.close()

    def cleanup(self, stage: str, hosts: Iterable[Host], fn: Callable[[Host], object],
                error: BaseException) -> None:
        """A clean-up stage on the way to raising ``error`` (e.g. stop what a failed `serve` started).
        A host where it fails must neither replace ``error`` (what the user acts on first, with its exit
        status) nor go unsaid (what it left may still hold GPUs or ports): each failure is attached to
        ``error`` as a note, which the CLI prints under its line."""
        res = self.stage(stage, hosts, fn, strict=False)
        for _, exc in sorted(res.failed.items()):
            add_note(error, f"{stage}: {exc}")

    def connect(self, hosts: Iterable[Host] | None = None, *, strict: bool = True) -> GroupResult:
        return self.stage("connect", hosts or self.inv.hosts, lambda h: self.ssh[h.name].connect(),
                          strict=strict)


def last_json(text: str) -> dict | None:
    """The last line of a command's output that is a JSON object (what the checks print)."""
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    return None


def last_json_or_error(text: str) -> dict:
    """last_json, or ``{"ready": False, "error": <the output's tail>}`` when there is none."""
    return last_json(text) or {"ready": False, "error": text.strip()[-300:]}
