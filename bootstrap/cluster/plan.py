"""Plan: what each host gets. Pure functions of the inventory and the facts; no I/O.

The container a host gets is an argv tuple (`ContainerSpec.run_argv`), identical to what
`scripts/run_cluster.sh` builds for the same inputs (tests/test_run_cluster_script.py holds them
together). Its hash goes into a label, so a later `up` can tell an unchanged container from one
whose spec changed.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Literal, Mapping

from bootstrap.exposure import RAY_DASHBOARD_DEFAULT, dashboard_address
from bootstrap.cluster.facts import HostFacts
from bootstrap.model import HF_CACHE_IN_CONTAINER, NOFILE_MAX, Host, Inventory

#: nofile limit used when neither the inventory nor the host says otherwise.
NOFILE_CAP = NOFILE_MAX
NOFILE_UNKNOWN = "<host hard limit>"

LABEL_CLUSTER = "bootstrap.cluster"
LABEL_HOST = "bootstrap.host"
LABEL_ROLE = "bootstrap.role"
LABEL_SPEC = "bootstrap.spec"

Action = Literal["create", "recreate", "keep"]


@dataclass(frozen=True)
class ContainerSpec:
    host: str
    role: str
    name: str
    image: str
    #: docker run options, in the fixed order run_cluster.sh uses (no labels, no env file).
    options: tuple[str, ...]
    #: the `ray start ...` arguments (the entrypoint is `ray`).
    command: tuple[str, ...]
    #: names of secret variables handed over in a 0600 env file, never on the command line.
    secret_names: tuple[str, ...]
    cluster: str
    #: `ray` (the node runs `ray start ...`) or `sleep` (runtime none: `sleep infinity`).
    entrypoint: str = "ray"

    @property
    def spec_hash(self) -> str:
        doc = json.dumps([self.name, self.image, self.options, self.entrypoint, self.command, self.secret_names])
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    @property
    def labels(self) -> tuple[tuple[str, str], ...]:
        return ((LABEL_CLUSTER, self.cluster), (LABEL_HOST, self.host), (LABEL_ROLE, self.role),
                (LABEL_SPEC, self.spec_hash))

    def run_argv(self, env_file: str | None = None) -> tuple[str, ...]:
        argv = ["docker", "run", "-d", "--name", self.name, *self.options]
        if self.secret_names:
            argv += ["--env-file", env_file or "<0600 file with " + ",".join(self.secret_names) + ">"]
        for k, v in self.labels:
            argv += ["--label", f"{k}={v}"]
        argv += ["--entrypoint", self.entrypoint, self.image, *self.command]
        return tuple(argv)


@dataclass(frozen=True)
class HostAction:
    host: str
    action: Action
    reason: str
    spec: ContainerSpec


def nofile_for(inv: Inventory, facts: HostFacts | None) -> int | None:
    if inv.cluster.nofile is not None:
        return inv.cluster.nofile
    if facts is not None and facts.nofile_hard is not None:
        return min(facts.nofile_hard, NOFILE_CAP)
    return None


def container_spec(inv: Inventory, host: Host, nofile: int | None) -> ContainerSpec:
    c = inv.cluster
    head = inv.head
    opts: list[str] = ["--network", "host"]
    opts += ["--ipc", "host"] if c.ipc_host else ["--shm-size", c.shm_size]
    if c.accelerator == "gpu":
        opts += ["--gpus", "all"]
    n = str(nofile) if nofile is not None else NOFILE_UNKNOWN
    opts += ["--ulimit", f"nofile={n}:{n}"]
    if c.infiniband:
        opts += ["--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1:-1"]
    if c.privileged:
        opts += ["--privileged"]
    if c.hf_cache:
        opts += ["-v", f"{c.hf_cache}:{HF_CACHE_IN_CONTAINER}"]
    for m in c.mounts:
        opts += ["-v", m]
    env = dict(host.env)
    env["VLLM_HOST_IP"] = host.ip
    for k in sorted(env):
        opts += ["-e", f"{k}={env[k]}"]

    if c.runtime == "none":
        return ContainerSpec(host=host.name, role=host.role, name=c.container_name, image=c.image,
                             options=tuple(opts), command=("infinity",),
                             secret_names=tuple(s.name for s in c.secrets), cluster=c.name,
                             entrypoint="sleep")
    gcs = c.ports.ray_gcs
    cmd = ["start", "--block"]
    if host.is_head:
        cmd += ["--head", f"--node-ip-address={host.ip}", f"--port={gcs}",
                f"--dashboard-port={c.ports.dashboard}"]
        dash = dashboard_address(c, host)
        if dash != RAY_DASHBOARD_DEFAULT:
            cmd += [f"--dashboard-host={dash}"]
    else:
        cmd += [f"--address={hostport(head.ip, gcs)}", f"--node-ip-address={host.ip}"]
    cmd += [f"--metrics-export-port={c.ports.ray_metrics}", "--disable-usage-stats", *c.ray_args]
    return ContainerSpec(host=host.name, role=host.role, name=c.container_name, image=c.image,
                         options=tuple(opts), command=tuple(cmd),
                         secret_names=tuple(s.name for s in c.secrets), cluster=c.name)


def hostport(ip: str, port: int) -> str:
    """ip:port, an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def plan_up(inv: Inventory, facts: Mapping[str, HostFacts]) -> tuple[HostAction, ...]:
    """Decide create / recreate / keep for every host. The head first, then the workers.

    A head that is (re)created takes every worker with it: workers joined to the old head's GCS
    would not rejoin the new one.
    """
    actions: list[HostAction] = []
    for host in (inv.head, *inv.workers):
        f = facts.get(host.name)
        spec = container_spec(inv, host, nofile_for(inv, f))
        action, reason = _decide(spec, f)
        actions.append(HostAction(host.name, action, reason, spec))
    head = actions[0]
    if head.action != "keep":
        actions = [head] + [
            a if a.action != "keep" else HostAction(a.host, "recreate", "the head is (re)started", a.spec)
            for a in actions[1:]
        ]
    return tuple(actions)


def _decide(spec: ContainerSpec, f: HostFacts | None) -> tuple[Action, str]:
    cur = f.container if f else None
    if cur is None:
        return "create", "no container"
    if cur.labels.get(LABEL_SPEC) != spec.spec_hash:
        return "recreate", "spec changed" if LABEL_SPEC in cur.labels else "not created by bootstrap"
    if not cur.running:
        return "recreate", f"container is {cur.status}"
    if f is not None and f.image_id and cur.image_id and f.image_id != cur.image_id:
        return "recreate", "image updated"
    return "keep", "up to date"


def expected_gpus(inv: Inventory) -> int:
    return inv.gpus_per_node
