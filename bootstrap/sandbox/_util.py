"""Small helpers shared by the sandbox modules: this machine's Docker (through the Docker SDK, see
bootstrap/remote/localdocker.py), running commands, hashing recipes, timing, locking."""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import hashlib
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from bootstrap.errors import BootstrapError, ExitStatus
from bootstrap.remote import localdocker as LD

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


class SandboxBadInput(SandboxError):
    """A bad setting (an environment variable such as BOOTSTRAP_SANDBOX_SUBNET): nothing was started.
    Exit 2, like any bad input."""

    exit_status = ExitStatus.BAD_INPUT


def nolog(_line: str) -> None:
    """The default progress sink: drop the line."""


def tail(text: str | bytes | None, lines: int = 15) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])


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


# --- this machine's Docker daemon, through the SDK -----------------------------------------------

UNREACHABLE = (
    "the Docker engine is not reachable (the Docker SDK could not connect): start dockerd "
    "(e.g. `nohup dockerd >/tmp/dockerd.log 2>&1 &`): {why}"
)


def client(timeout: float = LD.DEFAULT_TIMEOUT):
    """The Docker SDK's client of this machine's daemon (calls wait at most ``timeout`` s)."""
    try:
        return LD.client(timeout)
    except LD.DockerUnavailable as exc:
        raise SandboxError(UNREACHABLE.format(why=exc.reason)) from None


@contextlib.contextmanager
def sdk(what: str) -> Iterator[None]:
    """The Docker SDK's errors inside the block become SandboxError("{what} failed: {why}")."""
    try:
        yield
    except LD.DockerUnavailable as exc:
        raise SandboxError(UNREACHABLE.format(why=exc.reason)) from None
    except LD.ERRORS as exc:
        raise SandboxError(f"{what} failed: {LD.explain(exc)}") from None


def require_docker() -> None:
    client()


def image_exists(ref: str) -> bool:
    with sdk(f"docker image inspect {ref}"):
        return LD.image_id(ref) is not None


def image_label(ref: str, label: str) -> str | None:
    with sdk(f"docker image inspect {ref}"):
        labels = LD.image_labels(ref)
    return (labels or {}).get(label) or None


def tag_image(src: str, ref: str) -> None:
    """`docker tag src ref`."""
    repo, tag = LD.split_ref(ref)
    with sdk(f"docker tag {src} {ref}"):
        if not client().api.tag(src, repo, tag, force=True):
            raise SandboxError(f"docker tag {src} {ref} failed")


def inspect(kind: str, name: str) -> dict | None:
    """`docker {container,network} inspect name` (the object's JSON), None when there is none."""
    cl = client()
    with sdk(f"docker {kind} inspect {name}"):
        try:
            return cl.api.inspect_network(name) if kind == "network" else cl.api.inspect_container(name)
        except LD.NotFound:
            return None


def labelled(kind: str, *labels: str, running_only: bool = False) -> list[str]:
    """Names of the containers (all, or running only) or networks that carry every one of ``labels``."""
    cl = client()
    filters = {"label": list(labels)}
    with sdk(f"docker {'network ls' if kind == 'network' else 'ps'} --filter label={','.join(labels)}"):
        if kind == "network":
            return [n["Name"] for n in cl.api.networks(filters=filters)]
        found = cl.api.containers(all=not running_only, filters=filters)
    return [c["Names"][0].lstrip("/") for c in found if c.get("Names")]


def container_logs(name: str, lines: int = 20) -> str:
    """The last lines a container wrote (stdout and stderr), "" when there are none to read."""
    try:
        return client().api.logs(name, tail=lines).decode(errors="replace")
    except (SandboxError, *LD.ERRORS):
        return ""


def remove_containers(names: Sequence[str], *, check: bool = True, timeout: float = 600) -> None:
    """`docker rm -f -v` of every name (at most 16 at once); a container already gone is fine."""
    if not names:
        return
    cl = client(timeout)
    errors: list[str] = []

    def rm(name: str) -> None:
        try:
            cl.api.remove_container(name, v=True, force=True)
        except LD.NotFound:
            pass
        except LD.ERRORS as exc:
            errors.append(f"{name}: {LD.explain(exc)}")

    with cf.ThreadPoolExecutor(max_workers=min(LD.POOL_SIZE, len(names))) as pool:
        list(pool.map(rm, names))
    if errors and check:
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise SandboxError(f"docker rm -f failed: {'; '.join(errors[:3])}{more}")


def _write_log(logfile: Path, text: str) -> None:
    with open(logfile, "ab") as fh:
        fh.write(text.encode())


def _fail_from_log(what: str, why: str, logfile: Path) -> SandboxError:
    text = logfile.read_text(errors="replace")
    return SandboxError(f"{what} failed ({why}); log: {logfile}\n{tail(text, 20)}")


def run_container_logged(image: str, command: Sequence[str], logfile: Path, *, what: str, timeout: float,
                         name: str, labels: dict[str, str], volumes: Sequence[str]) -> None:
    """`docker run --name NAME IMAGE COMMAND` with its output appended to logfile, as it comes; on a
    non-zero exit raise with the log's tail; after ``timeout`` s the container is killed. The
    container is left for the caller (to commit, then remove)."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    vols = " ".join(f"-v {v}" for v in volumes)
    _write_log(logfile, f"\n$ docker run --name {name} {vols} {image} {' '.join(command[:2])} ...  (Docker SDK)\n")
    cl = client()
    with sdk(what):
        cid = cl.api.create_container(image, list(command), name=name, labels=labels,
                                      host_config=cl.api.create_host_config(binds=list(volumes)))["Id"]
        cl.api.start(cid)
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        with contextlib.suppress(*LD.ERRORS):
            cl.api.kill(cid)

    timer = threading.Timer(timeout, kill)
    timer.daemon = True
    timer.start()
    try:
        with sdk(what), open(logfile, "ab") as fh:
            # follows until the container exits (the socket waits without a read timeout)
            for data in cl.api.logs(cid, stream=True, follow=True):
                fh.write(data)
                fh.flush()
            rc = cl.api.wait(cid)["StatusCode"]
    finally:
        timer.cancel()
    if expired.is_set():
        raise SandboxError(f"{what}: timed out after {timeout:.0f}s (log: {logfile})")
    if rc != 0:
        raise _fail_from_log(what, f"exit {rc}", logfile)


def commit_logged(container: str, ref: str, changes: Sequence[str], logfile: Path, *, what: str,
                  timeout: float) -> None:
    """`docker commit --change C... container ref`, noted in logfile."""
    repo, tag = LD.split_ref(ref)
    _write_log(logfile, f"\n$ docker commit {' '.join(f'--change {c!r}' for c in changes)} {container} {ref}"
                        "  (Docker SDK)\n")
    with sdk(what):
        got = client(timeout).api.commit(container, repository=repo, tag=tag, changes=list(changes))
    _write_log(logfile, f"{got.get('Id', got)}\n")


def push_logged(ref: str, logfile: Path, *, what: str, timeout: float) -> None:
    """`docker push ref` with the daemon's progress (one line per layer and status) in logfile."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    repo, tag = LD.split_ref(ref)
    deadline = time.monotonic() + timeout
    _write_log(logfile, f"\n$ docker push {ref}  (Docker SDK)\n")
    seen: set[tuple[str, str]] = set()
    with sdk(what), open(logfile, "ab") as fh:
        # the read timeout applies between two progress messages; the deadline to the whole push
        for ev in client(min(timeout, 600)).api.push(repo, tag, stream=True, decode=True):
            if ev.get("error"):
                fh.write(f"error: {ev['error']}\n".encode())
                fh.flush()
                raise _fail_from_log(what, ev["error"].strip().splitlines()[-1][:300], logfile)
            key = (str(ev.get("id", "")), str(ev.get("status", "")))
            if key[1] and key not in seen:  # progress bars repeat a status: one line each
                seen.add(key)
                fh.write((f"{key[0]}: {key[1]}" if key[0] else key[1]).encode() + b"\n")
                fh.flush()
            if time.monotonic() > deadline:
                raise SandboxError(f"{what}: timed out after {timeout:.0f}s (log: {logfile})")
