"""A container as `docker container inspect` shows it: its pure parser (the command is in remote/argv.py). No I/O.

Both layers read containers: remote/docker.py runs the inspect on a host (`docker.inspect`) and
cluster/facts.py gathers it with a host's other facts. It lives here, below both, so that
bootstrap.remote never imports bootstrap.cluster; cluster/facts.py re-exports the names.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class ContainerState:
    status: str  # running, exited, created, ...
    image_id: str
    labels: dict = field(default_factory=dict)
    started_at: str = ""
    #: Config.Env as a dict (it can hold secrets: never shown) and the command's Args.
    env: dict = field(default_factory=dict, repr=False, compare=False)
    args: tuple[str, ...] = field(default=(), compare=False)
    #: The command's Path: the entrypoint (`ray` or `sleep` for a node container; behind the
    #: secrets' entrypoint, what it execs).
    path: str = field(default="", compare=False)

    @property
    def running(self) -> bool:
        return self.status == "running"


#: Where a container finds the secrets bootstrap mounts into it (cluster/guard/secretstore.py), and a shell
#: line exporting each (none: nothing): `docker exec` gets the container's configured environment,
#: not what its entrypoint exported, so what bootstrap runs there reads them the same way first.
SECRETS_IN_CONTAINER = "/run/bootstrap/secrets"
LOAD_SECRETS = f'for f in {SECRETS_IN_CONTAINER}/*; do [ -f "$f" ] && export "${{f##*/}}=$(cat "$f")"; done; :'

#: `$0` of the entrypoint that exports a container's secrets before it execs the real command
#: (`sh -c ENTRY bootstrap-secrets NAME... -- PATH ARGS...`, cluster/guard/secretstore.py).
SECRETS_ENTRY = "bootstrap-secrets"


def _command(path: str, args: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """(Path, Args) of what the container runs: behind the secrets' entrypoint, the command it execs."""
    if path == "sh" and args[:1] == ("-c",) and args[2:3] == (SECRETS_ENTRY,) and "--" in args[3:]:
        i = args.index("--", 3)
        if i + 1 < len(args):
            return args[i + 1], args[i + 2:]
    return path, args


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
    path, args = _command(str(d.get("Path") or ""), tuple(str(a) for a in d.get("Args") or ()))
    return ContainerState(status=state.get("Status", "unknown"), image_id=d.get("Image", ""),
                          labels=dict(config.get("Labels") or {}), started_at=state.get("StartedAt", ""),
                          env=dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e),
                          args=args, path=path)


#: What an image runs as, from its config: the fields both image stores report alike (Docker 26's containerd
#: store leaves out what `docker commit` put in the classic store's Config: Hostname, AttachStdout, Image).
_IMAGE_CONFIG_KEYS = ("User", "Env", "Cmd", "Entrypoint", "WorkingDir", "Labels", "Volumes", "ExposedPorts",
                      "StopSignal")


def image_platform(inspect: Mapping[str, Any]) -> str | None:
    """"OS/ARCH[/VARIANT]" an image is built for, from `docker image inspect` ("linux/arm64/v8"); None when
    it does not say its architecture."""
    if not inspect.get("Architecture"):
        return None
    return "/".join(str(x) for x in (inspect.get("Os") or "linux", inspect["Architecture"], inspect.get("Variant"))
                    if x)


def image_content_key(inspect: Mapping[str, Any]) -> str | None:
    """One image's identity by its content, from `docker image inspect`: its layers (RootFS.Layers, the
    uncompressed layers' digests) and what it runs as (_IMAGE_CONFIG_KEYS). The same on Docker's classic
    store, whose Id is the config's digest, and its containerd store, whose Id is the manifest's (pulled) or
    one of its own (loaded): tests/data/hosts/images. None without layers."""
    layers = (inspect.get("RootFS") or {}).get("Layers") or []
    if not layers:
        return None
    config = inspect.get("Config") or {}
    doc = {"layers": list(layers), "config": {k: config.get(k) or None for k in _IMAGE_CONFIG_KEYS}}
    return "content:" + hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
