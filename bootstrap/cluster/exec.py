"""Run one command on every host (or in every host's cluster container), in parallel.

The argv is passed as argv: quoted once by the transport, never interpreted by a shell on this
machine or on the host. Shell features (pipes, `$VAR`, `&&`) need an explicit `sh -c '...'`.
A failing or unreachable host never stops the others: every host gets an :class:`ExecResult`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from bootstrap.errors import CommandFailed, PreflightFailed, UsageError
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Session


@dataclass(frozen=True)
class ExecResult:
    host: str
    #: The command's exit status; None when the host was unreachable or the command timed out.
    exit_code: int | None
    stdout: str
    stderr: str
    seconds: float
    #: Why there is no exit status (unreachable, host key, timeout); "" otherwise.
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def unreachable(self) -> bool:
        return self.exit_code is None and not self.error.startswith("timed out")

    def as_dict(self) -> dict:
        return {"host": self.host, "exit_code": self.exit_code, "stdout": self.stdout,
                "stderr": self.stderr, "seconds": round(self.seconds, 3), "error": self.error}


def remote_argv(inv: Inventory, argv: Sequence[str], *, container: bool = False) -> tuple[str, ...]:
    """What runs on each host: the argv itself, or `docker exec <container_name> argv...`."""
    if not argv:
        raise UsageError("no command given: put it after `--`, e.g. bootstrap exec -i hosts.yaml -- uptime")
    argv = tuple(argv)
    if not argv[0].strip():
        raise UsageError(f"the command word is empty ({argv[0]!r}): the program to run comes first")
    return DK.exec_argv(inv.cluster.container_name, *argv) if container else argv


def select_hosts(inv: Inventory, names: Sequence[str] | None) -> list[Host]:
    """The inventory's hosts (names None), or the named ones (inventory order); an unknown name or
    an empty selection is a UsageError (no name never means every host)."""
    if names is None:
        return list(inv.hosts)
    known = {h.name for h in inv.hosts}
    if not names:
        raise UsageError(f"no host selected (hosts: {', '.join(sorted(known))})")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown host(s) {', '.join(unknown)} (hosts: {', '.join(sorted(known))})")
    wanted = set(names)
    return [h for h in inv.hosts if h.name in wanted]


def exec_all(inv: Inventory, argv: Sequence[str], *, container: bool = False,
             hosts: Sequence[str] | None = None, parallel: int = DEFAULT_PARALLEL,
             timeout: float | None = None, accept_new_host_keys: bool | None = None,
             on_result: Callable[[ExecResult], None] | None = None,
             clock: Callable[[], float] = time.monotonic) -> list[ExecResult]:
    """Run argv on every selected host, at most ``parallel`` at once; one result per host, in
    inventory order. ``on_result`` is called (from a worker thread) as each host finishes.
    ``timeout`` bounds the command on each host (default: the inventory's command_timeout)."""
    cmd = remote_argv(inv, argv, container=container)
    targets = select_hosts(inv, hosts)

    with Session(inv, parallel=parallel, clock=clock, accept_new_host_keys=accept_new_host_keys) as sess:
        def one(h: Host) -> ExecResult:
            t0 = clock()
            try:
                r = sess.ssh[h.name].connect().run(cmd, timeout=timeout, check=False)
                res = ExecResult(h.name, r.exit_code, r.stdout, r.stderr, clock() - t0)
            except CommandFailed as exc:  # only a timeout: check=False
                limit = timeout if timeout is not None else inv.cluster.ssh.command_timeout
                res = ExecResult(h.name, exc.exit_code, exc.output_tail, "", clock() - t0,
                                 f"timed out after {limit:g}s")
            except PreflightFailed as exc:  # unreachable, authentication, host key
                res = ExecResult(h.name, None, "", "", clock() - t0, str(exc))
            if on_result is not None:
                on_result(res)
            return res

        got = sess.stage("exec", targets, one, strict=False)
    failed = got.failed
    return [ExecResult(n, None, "", "", 0.0, f"{type(r).__name__}: {r}") if n in failed else r
            for n, r in got.items()]
