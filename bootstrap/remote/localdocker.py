"""This machine's Docker daemon, through the Docker SDK (docker-py): the one module that talks to it.

`bootstrap up --load-image` reads the image from here (`image_id`, `save`) and the sandbox drives its
networks, containers and images through `client()`. The daemon is the one `docker` would use:
``docker.from_env()`` reads DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH (not the CLI's
`docker context`). Errors: `DockerUnavailable` (a PreflightFailed naming "localhost") when the daemon
does not answer; the SDK's own errors (`ERRORS`) otherwise, which callers turn into theirs with
`explain`. A failed `save` raises CommandFailed naming "localhost", as `docker save` did.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator

import docker
import requests
from docker import types
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.utils import parse_repository_tag

from bootstrap.containers import image_content_key
from bootstrap.containers import image_platform as containers_platform
from bootstrap.errors import CommandFailed, PreflightFailed

__all__ = [
    "APIError", "DockerException", "DockerUnavailable", "ERRORS", "ImageNotFound", "NotFound", "SAVE_CHUNK",
    "client", "explain", "image_id", "image_key", "image_labels", "save", "split_ref", "types",
]

#: What the SDK raises: its own errors, and requests' for a connection that broke or timed out.
ERRORS: tuple[type[BaseException], ...] = (DockerException, requests.exceptions.RequestException)
#: Bytes per chunk of `save` (the daemon sends ~32 KiB HTTP chunks; they are gathered to this).
SAVE_CHUNK = 1 << 20
#: Default seconds one API call may wait for the daemon (a long build or push asks for more).
DEFAULT_TIMEOUT = 60.0
#: Connections kept per client (the sandbox starts and removes up to 16 containers at once).
POOL_SIZE = 16

_clients: dict[float, docker.DockerClient] = {}
_clients_lock = threading.Lock()


@dataclass
class DockerUnavailable(PreflightFailed):
    """This machine's Docker daemon does not answer (not running, no permission on its socket)."""

    prefix = "cannot reach this machine's Docker daemon: "


def _connect(timeout: float) -> docker.DockerClient:
    try:
        cl = docker.from_env(timeout=timeout, max_pool_size=POOL_SIZE)  # asks the daemon its API version
        cl.ping()
        return cl
    except ERRORS as exc:
        why = str(exc).strip() or type(exc).__name__
        hint = "start dockerd (or `systemctl start docker`), or point DOCKER_HOST at a running one"
        if "permission denied" in why.lower():
            hint = "this user may not use the Docker socket: run as root or join the docker group"
        raise DockerUnavailable("localhost", why[:300], hint) from None


def client(timeout: float = DEFAULT_TIMEOUT) -> docker.DockerClient:
    """A client of this machine's daemon whose calls wait at most ``timeout`` s for an answer (one
    per timeout, kept and shared between threads); DockerUnavailable when the daemon does not answer."""
    with _clients_lock:
        cl = _clients.get(timeout)
        if cl is None:
            cl = _clients[timeout] = _connect(timeout)
        return cl


def explain(exc: BaseException) -> str:
    """One line for an SDK error: the daemon's own message when it sent one."""
    if isinstance(exc, APIError) and exc.explanation:
        text = exc.explanation
        return (text.decode(errors="replace") if isinstance(text, bytes) else str(text)).strip()
    if isinstance(exc, requests.exceptions.Timeout):
        return f"the Docker daemon did not answer in time ({exc})"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return f"lost the connection to the Docker daemon ({exc})"
    return str(exc).strip() or type(exc).__name__


def split_ref(ref: str) -> tuple[str, str]:
    """("repository", "tag") of an image reference ("latest" when it has none), registry ports kept."""
    repo, tag = parse_repository_tag(ref)
    return repo, tag or "latest"


def image_id(ref: str) -> str | None:
    """The ID (sha256:...) of a local image, or None when this machine has no image of that name."""
    try:
        return client().api.inspect_image(ref)["Id"]
    except NotFound:
        return None


def image_key(ref: str) -> str | None:
    """A local image's content key (containers.image_content_key), or None when there is no such image."""
    try:
        return image_content_key(client().api.inspect_image(ref))
    except NotFound:
        return None


def image_platform(ref: str) -> str | None:
    """The platform a local image is built for (containers.image_platform), or None when there is no such image."""
    try:
        return containers_platform(client().api.inspect_image(ref))
    except NotFound:
        return None


def image_labels(ref: str) -> dict[str, str] | None:
    """The labels of a local image ({} when it has none), or None when there is no such image."""
    try:
        data = client().api.inspect_image(ref)
    except NotFound:
        return None
    return dict((data.get("Config") or {}).get("Labels") or {})


def save(image: str, chunk_size: int = SAVE_CHUNK) -> Iterator[bytes]:
    """`docker save IMAGE` as a stream: chunks of about ``chunk_size`` bytes straight from the daemon,
    nothing written to disk. The archive names IMAGE (as the CLI's does), so `docker load` tags it.

    A generator: the daemon is asked on the first ``next()``, which raises CommandFailed("localhost",
    "docker save IMAGE") when it has no such image or refuses; a stream that breaks half-way raises
    the same. Closing the generator early closes its connection, which ends the daemon's export."""
    cl = _connect(DEFAULT_TIMEOUT)  # a client of its own: closing it ends the stream
    stream = None
    try:
        try:
            # get_image by name (not Image.save, which saves by ID unless the name is its first tag)
            stream = cl.api.get_image(image, chunk_size=None)
            buf = bytearray()
            for data in stream:
                buf += data
                if len(buf) >= chunk_size:
                    yield bytes(buf)
                    buf.clear()
            if buf:
                yield bytes(buf)
        except ERRORS as exc:
            raise CommandFailed("localhost", f"docker save {image}", 1, explain(exc)) from None
    finally:
        if stream is not None:
            stream.close()
        cl.close()
