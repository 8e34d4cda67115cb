"""The `docker run`/`docker create` argv of every container bootstrap starts, built from one spec (pure).

Pure: it imports nothing but the standard library (no SSH, no Docker, no files), so the pure plan
modules import it too (the one module of bootstrap.remote they may: tests/test_architecture.py). Every
kind of container is a RunSpec, and `docker_argv` is the one place its argv is written:

    docker run|create [--rm] [-i] [-d] [--name NAME] OPTIONS... [--entrypoint ENTRYPOINT] IMAGE COMMAND...

OPTIONS keep the order the plan gives them (the plans' tests pin each kind's argv word for word, and
a container's spec hash is taken over it): the helpers below write the common ones once (labels,
environment, mounts, the capabilities, no-new-privileges). The kinds: the node container
(cluster/plan.py), a replica's serve and standby containers, the router, keepalived and the keeper
(fleet/plan.py), Prometheus and its exporters (monitor/plan.py), the image mirror (cluster/imagedist/plan.py)
and the throw-away containers that look into an image (cluster/facts.py, remote/docker.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

#: `--security-opt no-new-privileges`: nothing in the container gains privileges it was not started with.
NO_NEW_PRIVILEGES = ("--security-opt", "no-new-privileges")


@dataclass(frozen=True)
class RunSpec:
    """One container as `docker run` or `docker create` starts it."""
    image: str
    name: str | None = None
    #: `docker create` (started later, e.g. once its files are copied in) instead of `docker run`
    create: bool = False
    #: -d: run in the background
    detach: bool = False
    #: --rm: removed when it ends (a throw-away container)
    rm: bool = False
    #: -i: its stdin open (a script piped in)
    interactive: bool = False
    #: every other option, in the order given (see the helpers below)
    options: tuple[str, ...] = ()
    entrypoint: str | None = None
    #: the command's arguments after the image
    command: tuple[str, ...] = ()


def docker_argv(spec: RunSpec) -> tuple[str, ...]:
    """The spec's `docker run` / `docker create` argv (the one builder)."""
    return ("docker", "create" if spec.create else "run", *(("--rm",) if spec.rm else ()),
            *(("-i",) if spec.interactive else ()), *(("-d",) if spec.detach else ()),
            *(("--name", spec.name) if spec.name else ()), *spec.options,
            *(("--entrypoint", spec.entrypoint) if spec.entrypoint else ()), spec.image, *spec.command)


# -- options -------------------------------------------------------------------------------------
def labels(pairs: Iterable[tuple[str, str]] | Mapping[str, str]) -> tuple[str, ...]:
    """`--label K=V` for each pair, in order."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(x for k, v in items for x in ("--label", f"{k}={v}"))


def env(pairs: Iterable[tuple[str, str]] | Mapping[str, str]) -> tuple[str, ...]:
    """`-e K=V` for each pair, in order (never a secret's value: secrets are mounted files)."""
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    return tuple(x for k, v in items for x in ("-e", f"{k}={v}"))


def volumes(*mounts: str) -> tuple[str, ...]:
    """`-v SRC:DST[:MODE]` for each mount, in order."""
    return tuple(x for m in mounts for x in ("-v", m))


def caps(*add: str) -> tuple[str, ...]:
    """`--cap-drop ALL`, then `--cap-add` each capability the container needs back."""
    return ("--cap-drop", "ALL", *(x for c in add for x in ("--cap-add", c)))


def hardened(*add: str) -> tuple[str, ...]:
    """caps(ADD...) and no-new-privileges: what a container that runs no workload of the user's gets."""
    return (*caps(*add), *NO_NEW_PRIVILEGES)


def sh_in_image_argv(image: str, script: str) -> tuple[str, ...]:
    """sh -c SCRIPT in a throw-away container of IMAGE without a network: a look at what the image holds."""
    return docker_argv(RunSpec(image, rm=True, options=("--network", "none"), entrypoint="sh", command=("-c", script)))


# -- other docker argv ---------------------------------------------------------------------------
def container_inspect_cmd(name: str) -> tuple[str, ...]:
    """`docker container inspect NAME` (parsed by containers.parse_container_inspect)."""
    return ("docker", "container", "inspect", name)


def info_argv(fmt: str) -> tuple[str, ...]:
    """`docker info --format FMT` (one field or a JSON of the daemon's settings)."""
    return ("docker", "info", "--format", fmt)


def inspect_argv(*names: str, fmt: str) -> tuple[str, ...]:
    """`docker inspect --format FMT NAMES...` (containers or images, one line per name it finds)."""
    return ("docker", "inspect", "--format", fmt, *names)


def image_inspect_argv(image: str, fmt: str) -> tuple[str, ...]:
    """`docker image inspect --format FMT IMAGE`."""
    return ("docker", "image", "inspect", "--format", fmt, image)


def pull_argv(ref: str) -> tuple[str, ...]:
    """`docker pull --quiet REF` (only the image's ID on stdout)."""
    return ("docker", "pull", "--quiet", ref)


def load_argv() -> tuple[str, ...]:
    """`docker load --quiet`: an image archive from stdin."""
    return ("docker", "load", "--quiet")


def image_rm_argv(image: str) -> tuple[str, ...]:
    """`docker image rm IMAGE`."""
    return ("docker", "image", "rm", image)

