"""The per-node runner: one host's steps: run in the host, in its container, a check payload, its logs.

A Node wraps a host's connection (an SSHHost, or any docker.Runner) and the name of the container the
steps mean by default (the cluster's node container; another one per call: the serve container, a
monitor exporter). What runs is written once in bootstrap.remote.docker (the `docker` argv) and
bootstrap.remote.session (the scripts of `checks/` and how their answer is read); this module only
puts them together per host.

A check payload (a script from `checks/`) is piped into a Python: `docker exec -i CONTAINER ... python -`
(ask), the host's python3 (ask_host) or a throw-away container of an image (ask_image). Its answer is
the last line of its output that is a JSON object, whatever its exit status (the payload reports its
own failures in that object). The one error rule (Reply.answer): a payload that printed no such line
(docker exec failed, no Python there, it crashed) raises PayloadFailed, a CommandFailed naming the
host, `docker exec CONTAINER SCRIPT`, the exit status and the output's tail. Reply.answer_or_error
gives that failure as an answer instead (`{"ready": False, "error": ...}`), for probes that report
a host down rather than stop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from bootstrap.containers import ContainerState
from bootstrap.errors import CommandFailed
from bootstrap.model import Host
from bootstrap.remote import docker as DK
from bootstrap.remote.session import Session, check_script, last_json, last_json_or_error


@dataclass
class PayloadFailed(CommandFailed):
    """A check payload gave no answer (no JSON object line in its output): the one error of a payload."""

    #: the payload's whole stdout (answer_or_error's error is its tail)
    stdout: str = field(default="", repr=False)

    def as_answer(self) -> dict:
        """The failure as a payload's answer: ``{"ready": False, "error": <the output's tail>}``."""
        return last_json_or_error(self.stdout)


@dataclass(frozen=True)
class Reply:
    """What a payload run gave: the command's result and its answer (None: it printed none)."""
    host: str
    #: how errors name what ran: `docker exec CONTAINER SCRIPT`
    command: str
    result: object  # ssh.Result: exit_code, stdout, stderr
    doc: dict | None

    def answer(self) -> dict:
        """The payload's answer; PayloadFailed when it printed none (the one error rule)."""
        if self.doc is None:
            r = self.result
            raise PayloadFailed(self.host, self.command, r.exit_code, (r.stderr or r.stdout)[-2000:],
                                stdout=r.stdout)
        return self.doc

    def answer_or_error(self) -> dict:
        """answer, or the failure as an answer (PayloadFailed.as_answer) instead of raising: always
        session.last_json_or_error of the output (an empty object too gives the failure)."""
        return self.doc or last_json_or_error(self.result.stdout)


def reply(host: str, command: str, result) -> Reply:
    return Reply(host, command, result, last_json(result.stdout))


@dataclass(frozen=True)
class Node:
    """One host's connection and the container its steps run in unless told another."""
    ssh: DK.Runner
    container: str

    @property
    def name(self) -> str:
        return getattr(self.ssh, "name", "?")

    # -- commands --------------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True, **kw):
        """ARGV in the host (ssh.run's keywords: display, hangup, query)."""
        return self.ssh.run(argv, timeout=timeout, check=check, **kw)

    def run_in(self, *argv: str, container: str | None = None, interactive: bool = False, detach: bool = False,
               env: Iterable[tuple[str, str]] = (), timeout: float | None = None, check: bool = True, **kw):
        """ARGV in the container (`docker exec`, see docker.exec_argv)."""
        cmd = DK.exec_argv(container or self.container, *argv, interactive=interactive, detach=detach, env=env)
        return self.ssh.run(cmd, timeout=timeout, check=check, **kw)

    def http_get(self, ip: str, port: int, path: str, *, timeout: float = 10.0) -> tuple[int, bytes]:
        """GET http://IP:PORT/PATH as seen from the host (ssh.SSHHost.http_get: an SSH channel)."""
        return self.ssh.http_get(ip, port, path, timeout=timeout)

    # -- check payloads --------------------------------------------------------------------------
    def ask(self, script: str, *args: str, container: str | None = None, timeout: float = 60) -> Reply:
        """checks/SCRIPT with ARGS in the container (docker.exec_python_argv)."""
        c = container or self.container
        r = self.ssh.run_with_input(DK.exec_python_argv(c, list(args)), [check_script(script)], timeout=timeout,
                                    check=False)
        return reply(self.name, f"docker exec {c} {script}", r)

    def ask_host(self, script: str, *args: str, timeout: float = 60) -> Reply:
        """checks/SCRIPT with ARGS in the host's python3 (no container needed)."""
        r = self.ssh.run_with_input(("python3", "-", *args), [check_script(script)], timeout=timeout, check=False)
        return reply(self.name, f"python3 {script}", r)

    def ask_image(self, image: str, script: str, *args: str, timeout: float = 240,
                  options: Sequence[str] = ()) -> Reply:
        """checks/SCRIPT with ARGS in a throw-away container of IMAGE (docker.run_python_argv, with docker run's
        `options`: the GPUs)."""
        r = self.ssh.run_with_input(DK.run_python_argv(image, list(args), options), [check_script(script)],
                                    timeout=timeout, check=False)
        return reply(self.name, f"docker run {image} {script}", r)

    def payload(self, script: str, *args: str, container: str | None = None, timeout: float = 60) -> dict:
        """ask's answer; PayloadFailed when there is none."""
        return self.ask(script, *args, container=container, timeout=timeout).answer()

    def payload_or_error(self, script: str, *args: str, container: str | None = None,
                         timeout: float = 60) -> dict:
        """ask's answer, or its failure as an answer (Reply.answer_or_error)."""
        return self.ask(script, *args, container=container, timeout=timeout).answer_or_error()

    # -- containers ------------------------------------------------------------------------------
    def logs(self, tail: int, *, container: str | None = None, timeout: float = 60) -> str:
        """The last TAIL lines of the container's log (docker.logs: a failure's message is the text)."""
        return DK.logs(self.ssh, container or self.container, tail, timeout=timeout)

    def inspect(self, *, container: str | None = None, timeout: float = 30,
                check: bool = False) -> ContainerState | None:
        """The container's state; None when there is none (docker.inspect)."""
        return DK.inspect(self.ssh, container or self.container, timeout=timeout, check=check)

    def start(self, *, container: str | None = None, timeout: float = 60):
        return DK.start(self.ssh, container or self.container, timeout=timeout)

    def rm(self, *names: str, timeout: float = 60, check: bool = False):
        """`docker rm -f` NAMES (none: the container): absent is fine unless check (docker.rm)."""
        return DK.rm(self.ssh, *(names or (self.container,)), timeout=timeout, check=check)

    def volume_rm(self, *names: str, timeout: float = 120):
        """`docker volume rm -f NAMES`: absent is fine (docker.volume_rm)."""
        return DK.volume_rm(self.ssh, *names, timeout=timeout)

    def signal(self, signal: str, *, container: str | None = None, timeout: float = 60):
        """Send SIGNAL (e.g. HUP) to the container's main process."""
        return DK.kill_signal(self.ssh, container or self.container, signal, timeout=timeout)

    def copy_in(self, path: str, data: bytes, *, container: str | None = None, timeout: float = 60):
        """Put one file (DATA at PATH) into the container, running or not (docker.copy_file_in)."""
        return DK.copy_file_in(self.ssh, container or self.container, path, data, timeout=timeout)


def of(sess: Session, host: Host | str, container: str | None = None) -> Node:
    """The session's Node for HOST (a Host or its name); its container is the cluster's node
    container unless CONTAINER is given."""
    name = host if isinstance(host, str) else host.name
    return Node(sess.ssh[name], container or sess.inv.cluster.container_name)
