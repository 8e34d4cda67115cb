"""Docker on the hosts: the `docker` steps run over SSH on a node, each written once.

The argv builders (`exec_argv`, `exec_python_argv`, `kill_tagged_argv`, `logs_argv`) and the shell
snippets run inside the node containers (`PYTHON`, `kill_matching`) are pure; the helpers below them
(`inspect`, `logs`, `rm`, `start`, ...) run one step through a host's connection (an SSHHost) and
read its output. The container inspect command and its parser live in the pure bootstrap/containers.py,
below both this module and cluster/facts.py, which gathers facts with them too (remote never imports
cluster); the `docker run/create` argv of the containers bootstrap starts are built by the pure
bootstrap/remote/argv.py from the specs the pure plan modules decide.
"""
from __future__ import annotations

import io
import re
import shlex
import tarfile
import time
from typing import Iterable, Protocol, Sequence

from bootstrap.containers import LOAD_SECRETS, ContainerState, parse_container_inspect
from bootstrap.errors import CommandFailed
from bootstrap.remote import argv as RA
from bootstrap.remote.argv import container_inspect_cmd


class Runner(Protocol):
    """What the helpers need of a host connection (SSHHost)."""

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True): ...

    def run_with_input(self, argv: Sequence[str], chunks: Iterable[bytes], *, timeout: float | None = None,
                       check: bool = True): ...


# -- argv ----------------------------------------------------------------------------------------
def exec_argv(container: str, *argv: str, interactive: bool = False, detach: bool = False,
              env: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    """`docker exec [-d] [-i] [-e K=V ...] CONTAINER ARGV...`: ARGV passed whole (no shell here)."""
    flags = (("-d",) if detach else ()) + (("-i",) if interactive else ())
    envs = tuple(x for k, v in env for x in ("-e", f"{k}={v}"))
    return ("docker", "exec", *flags, *envs, container, *argv)


# Run a piped script with the interpreter that runs `ray` in the image (its shebang), so a check
# needs nothing but Ray itself; python3 in images without Ray.
PYTHON = ('R=$(command -v ray); if [ -n "$R" ]; then PY=$(head -n1 "$R" | sed "s/^#!//"); '
          'else PY=python3; fi')
# What bootstrap runs with `docker exec` reads the container's secrets first (containers.LOAD_SECRETS).
_PY_OF_RAY = LOAD_SECRETS + '; ' + PYTHON + '; exec $PY - "$@"'


def run_python_argv(image: str, args: Sequence[str], options: Sequence[str] = ()) -> tuple[str, ...]:
    """Run the Python script on stdin in a throw-away container of the image: no network, no
    capabilities, removed when it ends (what the image offers, read before anything uses it); `options`:
    docker run's own beside those (the GPUs: `--gpus all`)."""
    return RA.docker_argv(RA.RunSpec(image, rm=True, interactive=True,
                                     options=("--network", "none", *RA.hardened(), *options),
                                     entrypoint="sh", command=("-c", _PY_OF_RAY, "sh", *args)))


def exec_python_argv(container: str, args: Sequence[str]) -> tuple[str, ...]:
    """Run the Python script on stdin inside the container (see PYTHON) with these arguments."""
    return exec_argv(container, "sh", "-c", _PY_OF_RAY, "sh", *args, interactive=True)


def logs_argv(name: str, tail: int, *, follow: bool = False, since: float | None = None) -> tuple[str, ...]:
    """`docker logs` of a container: the last TAIL lines, those since a UTC epoch, then new ones."""
    return ("docker", "logs", "--tail", str(tail), *(("--since", f"{since:.3f}") if since is not None else ()),
            *(("--follow",) if follow else ()), name)


def file_log_argv(container: str, path: str, tail: int, *, follow: bool = False) -> tuple[str, ...]:
    """The last TAIL lines of a log file inside a container, then (follow) the lines added to it,
    across a rotation or a new file of the same name (tail -F)."""
    return exec_argv(container, "tail", "-n", str(tail), *(("-F",) if follow else ()), path)


def names(ssh: Runner, *, timeout: float = 30) -> list[str]:
    """The names of every container on the host, running or not. A failure raises CommandFailed."""
    return ssh.run(("docker", "ps", "-a", "--format", "{{.Names}}"), timeout=timeout).stdout.split()


def has_file(ssh: Runner, container: str, path: str, *, timeout: float = 30) -> bool:
    """Whether the file exists in the (running) container."""
    return ssh.run(exec_argv(container, "test", "-f", path), timeout=timeout, check=False).exit_code == 0


def kill_matching(patterns: str) -> str:
    """sh: kill -9 every process but this shell whose command line matches the `case` PATTERNS
    (e.g. ``*"$1"*``); nothing but sh and /proc, images need not have pkill."""
    return ('for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
            f'case "$(tr "\\0" " " < "$p/cmdline" 2>/dev/null)" in {patterns}) '
            'kill -9 "${p#/proc/}" 2>/dev/null;; esac; done')


def kill_tagged_argv(container: str, tag: str, *, then: str = "exit 0") -> tuple[str, ...]:
    """In the container: kill every process whose command line contains TAG, then run THEN."""
    return exec_argv(container, "sh", "-c", kill_matching('*"$1"*') + "; " + then, "sh", tag)


def tar_one(path: str, data: bytes) -> bytes:
    """A tar stream holding one file (mode 0644) at PATH, for `docker cp - NAME:/`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# -- steps on a host -------------------------------------------------------------------------------
#: How the Docker CLI (and podman's) says that what it was asked about does not exist: `Error: No such
#: container: x`, `Error response from daemon: No such container: x`, `Error: no such volume x`.
_ABSENT = re.compile(r"no such (container|object|volume)", re.IGNORECASE)


def absent_only(r) -> bool:
    """Whether a failed `docker` step failed only because its container (or volume) does not exist:
    every line it printed says so. Anything else (the daemon does not answer, permission denied on
    its socket, docker not installed) is a failure the caller must not read as "absent"."""
    lines = [ln for ln in (r.stderr + "\n" + r.stdout).splitlines() if ln.strip() and ln.strip() != "[]"]
    return bool(lines) and all(_ABSENT.search(ln) for ln in lines)


#: How `docker exec` says the container exists but is not running: `Error response from daemon:
#: container 3f2a... is not running`.
_NOT_RUNNING = re.compile(r"is not running|no such (container|object)", re.IGNORECASE)


def not_running_only(r) -> bool:
    """Whether a failed `docker exec` failed only because its container is absent or stopped (then
    nothing runs in it: e.g. nothing to stop). Any other failure must be reported."""
    lines = [ln for ln in (r.stderr + "\n" + r.stdout).splitlines() if ln.strip()]
    return bool(lines) and all(_NOT_RUNNING.search(ln) for ln in lines)


def _run_unless_absent(ssh: Runner, argv: Sequence[str], *, timeout: float, check: bool):
    """Run a `docker` step: its result when it succeeded, or failed only because the container is
    absent (unless check); else CommandFailed naming the host and the command (a `docker` that does
    not answer is never taken for "no container")."""
    r = ssh.run(argv, timeout=timeout, check=check)
    if not r.ok and not absent_only(r):
        raise CommandFailed(getattr(ssh, "name", "?"), shlex.join(argv), r.exit_code, (r.stderr or r.stdout)[-2000:])
    return r


def inspect(ssh: Runner, name: str, *, timeout: float = 30, check: bool = False) -> ContainerState | None:
    """`docker container inspect NAME`: the container's state; None when there is none (with check,
    CommandFailed instead). Any other failure raises CommandFailed: a daemon that does not answer
    must not read as "no container" (`monitor status` said "Prometheus is not running" then)."""
    r = _run_unless_absent(ssh, container_inspect_cmd(name), timeout=timeout, check=check)
    return parse_container_inspect(r.stdout) if r.ok else None


#: Docker's restart count of $1, the count in file $2 inside it (when it runs and has one), and the
#: state of container $3 ("absent" when there is none): one command per host for `status`.
_RESTARTS = ('docker inspect --format "{{.RestartCount}}" "$1" 2>/dev/null || echo 0; '
             '{ [ -n "$2" ] && docker exec "$1" cat "$2" 2>/dev/null; } | head -n 1 | grep . || echo -; '
             '[ -n "$3" ] && { docker inspect --format "{{.State.Status}}" "$3" 2>/dev/null || echo absent; }; true')


def supervised_restarts(ssh: Runner, name: str, starts_file: str = "", twin: str = "",
                        *, timeout: float = 30) -> tuple[int, int | None, str | None]:
    """(Docker's restart count of the container, the number in STARTS_FILE inside it: how many
    times its supervisor started its process (None: no such file, or it is not running), the state
    of the container TWIN (None: none asked; "absent")). Unreadable parts read as 0 / None."""
    r = ssh.run(("sh", "-c", _RESTARTS, "sh", name, starts_file, twin), timeout=timeout, check=False)
    lines = [ln.strip() for ln in r.stdout.splitlines()]
    def num(i: int) -> int | None:
        try:
            return int(lines[i])
        except (IndexError, ValueError):
            return None
    return num(0) or 0, num(1), (lines[2] or None) if twin and len(lines) > 2 else None


def logs(ssh: Runner, name: str, tail: int, *, timeout: float = 60) -> str:
    """The last TAIL lines of the container's log (its stdout and stderr). Not checked on purpose:
    a failure's own message (`No such container`, the daemon's error) is returned as the text, so
    whoever shows the log shows why there is none."""
    r = ssh.run(logs_argv(name, tail), timeout=timeout, check=False)
    return r.stdout + r.stderr


def rm(ssh: Runner, *names: str, timeout: float = 60, check: bool = False):
    """`docker rm -f NAMES`: gone whether running or not. Absent is fine unless check; any other
    failure raises CommandFailed (a `down` that could not remove must not say "removed")."""
    return _run_unless_absent(ssh, ("docker", "rm", "-f", *names), timeout=timeout, check=check)


def start(ssh: Runner, name: str, *, timeout: float = 60):
    return ssh.run(("docker", "start", name), timeout=timeout)


def stop(ssh: Runner, name: str, grace: int, *, timeout: float):
    """SIGTERM, then SIGKILL after GRACE seconds. Absent is fine; any other failure raises
    CommandFailed (a container we could not stop still holds its GPUs)."""
    return _run_unless_absent(ssh, ("docker", "stop", "-t", str(grace), name), timeout=timeout, check=False)


def rename(ssh: Runner, old: str, new: str, *, timeout: float = 60):
    return ssh.run(("docker", "rename", old, new), timeout=timeout)


def rename_if_present(ssh: Runner, old: str, new: str, *, timeout: float = 60):
    """`docker rename OLD NEW` where OLD exists; absent is fine, any other failure raises CommandFailed."""
    return _run_unless_absent(ssh, ("docker", "rename", old, new), timeout=timeout, check=False)


def kill_signal(ssh: Runner, name: str, signal: str, *, timeout: float = 60):
    """Send SIGNAL (e.g. HUP) to the container's main process."""
    return ssh.run(("docker", "kill", "--signal", signal, name), timeout=timeout)


def volume_rm(ssh: Runner, *names: str, timeout: float = 120):
    """`docker volume rm -f NAMES`: absent is fine; any other failure (the volume is in use, the
    daemon does not answer) raises CommandFailed: `monitor down --purge` must not say "data purged"."""
    return _run_unless_absent(ssh, ("docker", "volume", "rm", "-f", *names), timeout=timeout, check=False)


def root_dir(ssh: Runner, *, timeout: float = 20) -> str:
    """Where the Docker daemon keeps images and containers (/var/lib/docker when it does not say).
    The default is safe: the only caller (doctor's free-space look) has already reported a Docker
    daemon that does not answer (its preflight finding), and df then reads the usual place."""
    r = ssh.run(("docker", "info", "--format", "{{.DockerRootDir}}"), timeout=timeout, check=False)
    return r.stdout.strip() or "/var/lib/docker"


def image_size(ssh: Runner, image: str, *, timeout: float = 20) -> int | None:
    """The image's size in bytes; None when it is not there (or Docker cannot say: the only caller,
    doctor's disk rule, then skips the image-size comparison; doctor reports Docker itself)."""
    sz = ssh.run(("docker", "image", "inspect", "--format", "{{.Size}}", image), timeout=timeout,
                 check=False).stdout.strip()
    return int(sz) if sz.isdigit() else None


def copy_file_in(ssh: Runner, name: str, path: str, data: bytes, *, timeout: float = 60):
    """Put one file (DATA at PATH) into the container, running or not (`docker cp -`)."""
    return ssh.run_with_input(("docker", "cp", "-", f"{name}:/"), [tar_one(path, data)], timeout=timeout)
