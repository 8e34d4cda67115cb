"""Small helpers shared by the sandbox modules: running docker, hashing recipes, timing, locking."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from bootstrap.errors import BootstrapError

Log = Callable[[str], None]

#: Every container, network and image the sandbox creates carries this label.
LABEL = "bootstrap.sandbox"
LABEL_KV = f"{LABEL}=1"
#: What a labelled object is: node, registry, build.
ROLE_LABEL = "bootstrap.sandbox.role"
#: Short hash of the recipe an image was built from.
RECIPE_LABEL = "bootstrap.sandbox.recipe"


class SandboxError(BootstrapError):
    """The sandbox could not be built, started or stopped; the message says what and why."""


def nolog(_line: str) -> None:
    """The default progress sink: drop the line."""


def tail(text: str | bytes | None, lines: int = 15) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


def run(
    argv: Sequence[str],
    *,
    check: bool = True,
    timeout: float | None = 600,
    input: bytes | None = None,
    what: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv (never through a shell), capture output as text; raise SandboxError on failure."""
    try:
        proc = subprocess.run(
            list(argv),
            input=input.decode() if input is not None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        raise SandboxError(f"{argv[0]} not found: install it (needed for the sandbox)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"{what or ' '.join(argv)}: timed out after {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        out = tail(proc.stderr) or tail(proc.stdout)
        raise SandboxError(f"{what or ' '.join(argv[:4])} failed (exit {proc.returncode}): {out}")
    return proc


def docker(*args: str, check: bool = True, timeout: float | None = 600, what: str | None = None):
    return run(["docker", *args], check=check, timeout=timeout, what=what or f"docker {' '.join(args[:3])}")


def run_logged(argv: Sequence[str], logfile: Path, *, what: str, timeout: float | None = None) -> None:
    """Run argv with its output appended to logfile; on failure raise with the log's tail."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    with open(logfile, "ab") as fh:
        fh.write(f"\n$ {' '.join(argv)}\n".encode())
        fh.flush()
        try:
            rc = subprocess.run(list(argv), stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except FileNotFoundError as exc:
            raise SandboxError(f"{argv[0]} not found: install it (needed for the sandbox)") from exc
        except subprocess.TimeoutExpired as exc:
            raise SandboxError(f"{what}: timed out after {timeout:.0f}s (log: {logfile})") from exc
    if rc != 0:
        text = logfile.read_text(errors="replace")
        raise SandboxError(f"{what} failed (exit {rc}); log: {logfile}\n{tail(text, 20)}")


def digest(*parts: str | bytes, length: int = 12) -> str:
    """A short, stable hash of the parts (length-prefixed so boundaries matter)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(f"{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:length]


@contextlib.contextmanager
def timed(log: Log, what: str) -> Iterator[None]:
    log(f"{what} ...")
    start = time.monotonic()
    yield
    log(f"{what}: done in {time.monotonic() - start:.1f}s")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two sandbox commands do not race on one workdir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def image_exists(ref: str) -> bool:
    return docker("image", "inspect", "--format", "{{.Id}}", ref, check=False).returncode == 0


def image_label(ref: str, label: str) -> str | None:
    proc = docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', ref, check=False)
    if proc.returncode != 0:
        return None
    value = proc.stdout.strip()
    return value if value and value != "<no value>" else None


def require_docker() -> None:
    proc = run(["docker", "version", "--format", "{{.Server.Version}}"], check=False, timeout=30)
    if proc.returncode != 0:
        raise SandboxError(
            "the Docker engine is not reachable (`docker version` failed): start dockerd "
            f"(e.g. `nohup dockerd >/tmp/dockerd.log 2>&1 &`): {tail(proc.stderr, 3)}"
        )
