"""A container as `docker container inspect` shows it: the command and its pure parser. No I/O.

Both layers read containers: remote/docker.py runs the inspect on a host (`docker.inspect`) and
cluster/facts.py gathers it with a host's other facts. It lives here, below both, so that
bootstrap.remote never imports bootstrap.cluster; cluster/facts.py re-exports the names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ContainerState:
    status: str  # running, exited, created, ...
    image_id: str
    labels: dict = field(default_factory=dict)
    started_at: str = ""
    #: Config.Env as a dict (it can hold secrets: never shown) and the command's Args.
    env: dict = field(default_factory=dict, repr=False, compare=False)
    args: tuple[str, ...] = field(default=(), compare=False)
    #: The command's Path: the entrypoint (`ray` or `sleep` for a node container).
    path: str = field(default="", compare=False)

    @property
    def running(self) -> bool:
        return self.status == "running"


def container_inspect_cmd(name: str) -> tuple[str, ...]:
    return ("docker", "container", "inspect", name)


def parse_container_inspect(out: str) -> ContainerState | None:
    """container_inspect_cmd's output -> the container's state (None: no such container, or not JSON)."""
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        return None
    if not data:
        return None
    d = data[0]
    state = d.get("State") or {}
    config = d.get("Config") or {}
    return ContainerState(status=state.get("Status", "unknown"), image_id=d.get("Image", ""),
                          labels=dict(config.get("Labels") or {}), started_at=state.get("StartedAt", ""),
                          env=dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e),
                          args=tuple(d.get("Args") or ()), path=str(d.get("Path") or ""))
