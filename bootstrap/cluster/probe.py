"""Read-only looks at the hosts over a Session, shared by every command: each host's facts (`gather`
runs the fact commands of bootstrap.cluster.facts), what a public address would reach on the head,
and whether the workers reach the head.

The network as each node sees it (interfaces, *_SOCKET_IFNAME) is doctor's look, in
nccl/network.py: it fills doctor's NodeNet, and the cluster layer never imports doctor."""
from __future__ import annotations

import json
import shlex
import time
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

from bootstrap import exposure
from bootstrap.cluster import cuda as CU
from bootstrap.cluster import facts as F
from bootstrap.cluster import gpuaccess as GA
from bootstrap.cluster import runtime as RT
from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import run as GR
from bootstrap.cluster.plan import gpu_flags
from bootstrap.containers import parse_container_inspect
from bootstrap.errors import CommandFailed, PreflightFailed
from bootstrap.model import Host
from bootstrap.parallel import outcomes
from bootstrap.remote import node as N
from bootstrap.remote.argv import container_inspect_cmd
from bootstrap.remote.session import Session


def host_facts(sess: Session, h: Host) -> F.HostFacts:
    c = sess.inv.cluster
    return gather(sess.ssh[h.name], container=c.container_name, image=c.image,
                  want_gpus=c.accelerator == "gpu", cluster=c.name)


def _in_parallel(jobs: Mapping[str, Callable[[], Any]], width: int) -> dict[str, Any]:
    """Every job's result, at most `width` at once (bootstrap.parallel: daemon threads, waited for in
    short steps, so an interrupt is seen); the first job (in order) that raised raises."""
    got = outcomes(jobs, lambda k: jobs[k](), lambda k: k, width, name="facts")
    for k in jobs:
        if isinstance(got[k], BaseException):
            raise got[k]
    return {k: got[k] for k in jobs}


class Runner(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True,
            display: str | None = None, query: bool = False): ...


#: Fact commands in flight at once on one host (sshd's MaxSessions is 10 by default; the cluster
#: lock holds one more channel on the head).
FACT_CHANNELS = 3


def gather(ssh: Runner, *, container: str, image: str, want_gpus: bool, cluster: str | None = None) -> F.HostFacts:
    try:
        version, runtimes = F.parse_docker_info(ssh.run(F.DOCKER_INFO, timeout=30, query=True).stdout)
        if not version:
            raise CommandFailed(ssh.name, shlex.join(F.DOCKER_INFO), 0, "no server version")
    except CommandFailed as exc:
        text = exc.output_tail
        if F.is_podman(text) or F.is_podman(ssh.run(F.DOCKER_VERSION, timeout=30, check=False, query=True).stdout):
            raise PreflightFailed(ssh.name, *F.PODMAN) from None
        if "permission denied" in text.lower():
            hint = "add the SSH user to the docker group (or log in as a user that may use Docker)"
        elif "not found" in text:
            hint = "install Docker Engine on the host"
        else:
            hint = "start the Docker daemon (systemctl start docker)"
        last = text.strip().splitlines()[-1] if text.strip() else exc
        raise PreflightFailed(ssh.name, f"Docker daemon does not answer: {last}", hint) from None
    # The other facts are independent: read them a few at a time (one SSH channel each, far
    # below sshd's MaxSessions). Docker CLI starts are what a host spends most CPU on here, so
    # the container and the image are asked for in one.
    cmds = {"nofile": F.NOFILE_HARD, "inspect": F.inspect_both_cmd(container, image), "ray_ok": F.LIST_RAY_OK,
            "rack": F.RACK_FACTS}
    if cluster is not None:
        cmds["guard"] = FN.guard_facts_cmd(cluster)
    if want_gpus:
        cmds["gpus"] = F.NVIDIA_SMI
        cmds["cuda"] = F.NVIDIA_SMI_VERSION
        cmds["gpu_access"] = GA.FACTS
    sent: dict[str, float] = {}
    received: dict[str, float] = {}

    def timed(k: str, argv: Sequence[str]):
        sent[k] = time.time()
        try:
            return ssh.run(argv, timeout=60 if k == "gpus" else 30, check=False, query=True)
        finally:
            received[k] = time.time()

    got = _in_parallel({k: (lambda k=k, argv=argv: timed(k, argv)) for k, argv in cmds.items()}, FACT_CHANNELS)
    gpus = None
    if want_gpus:
        r = got["gpus"]
        if not r.ok:
            raise PreflightFailed(ssh.name, "nvidia-smi failed: " + (r.stderr or r.stdout).strip()[-200:],
                                  "install the NVIDIA driver, or set accelerator: none for a CPU cluster")
        gpus = F.parse_nvidia_smi(r.stdout)
    both = F.parse_inspect_both(got["inspect"].stdout, container, image)
    if both is None:
        # not checked: Docker answered `docker info` above, so a failed inspect here means "no such
        # container" / "no such image"
        ci = ssh.run(container_inspect_cmd(container), timeout=30, check=False, query=True)
        ii = ssh.run(F.image_cmd(image), timeout=30, check=False, query=True)
        image_id, image_key = F.parse_image(ii.stdout) if ii.ok else (None, None)
        both = (parse_container_inspect(ci.stdout) if ci.ok else None, image_id)
        image_out = ii.stdout if ii.ok else ""
    else:
        image_key = F.parse_image_key(got["inspect"].stdout)
        image_out = got["inspect"].stdout
    cstate, image_id = both
    driver_cuda = F.parse_driver_cuda(got["cuda"].stdout) if "cuda" in got and got["cuda"].ok else None
    return F.HostFacts(docker_version=version, runtimes=runtimes, gpus=gpus,
                     nofile_hard=F.parse_nofile(got["nofile"].stdout), container=cstate,
                     image_id=image_id or None, image_key=image_key if image_id else None,
                     ray_ok=F.parse_ray_ok(got["ray_ok"].stdout),
                     ray_none=F.parse_ray_ok(got["ray_ok"].stdout, F.RAY_NONE_PREFIX),
                     # not checked: a host without iproute2 or /sys/class/infiniband prints less; what
                     # is missing is not checked (the preflight's checks skip facts they do not have)
                     rack=F.parse_rack(got["rack"].stdout, sent=sent.get("rack"), received=received.get("rack")),
                     driver_cuda=driver_cuda,
                     image_cuda=F.parse_image_cuda(got["inspect"].stdout) if image_id else {},
                     image_platform=F.parse_image_platform(image_out) if image_id else None,
                     guard=GR.become_checked(ssh, FN.parse_guard(got["guard"].stdout)) if "guard" in got else None,
                     gpu_access=GA.parse(got["gpu_access"].stdout) if "gpu_access" in got else None)


def cuda_init(sess: Session, h: Host, facts: F.HostFacts | None) -> str | None:
    """Does CUDA initialise with the host's GPUs in the cluster image: checks/cuda_probe.py in a throw-away
    container of it, given the GPUs as the node container will be (plan.gpu_flags). PreflightFailed where it
    sees fewer than the inventory's GPUs per node (the cause named: 802 without Fabric Manager, 803, 804, a
    driver too old) or cannot tell; a warning (returned) where the image's torch has no CUDA to ask."""
    inv = sess.inv
    r = N.of(sess, h).ask_image(inv.cluster.image, "cuda_probe.py", options=gpu_flags(facts)).result
    doc = CU.parse_probe(r.stdout)
    if doc is None:
        raise PreflightFailed(h.name, "a container of the image given the GPUs answered no CUDA probe: "
                                      + ((r.stderr or r.stdout).strip()[-300:] or f"exit {r.exit_code}"),
                              "start one by hand (`docker run --rm --gpus all IMAGE nvidia-smi`) and read its error")
    if CU.cpu_build(doc):
        return (f"the image's torch ({doc.get('torch') or 'none'}) has no CUDA: whether CUDA initialises on "
                "the GPUs was not probed")
    bad = CU.short(doc, inv.gpus_per_node)
    if bad is not None:
        raise PreflightFailed(h.name, f"{bad[0]} ({bad[1]})", bad[2])
    return None


def gather_hosts(sess: Session, hosts: Iterable[Host] | None = None) -> dict[str, F.HostFacts]:
    return sess.stage("facts", hosts or sess.inv.hosts, lambda h: host_facts(sess, h))


def runtime_from_containers(sess: Session) -> None:
    """cluster.runtime unset: set sess.inv's from what the node containers run (the head's, else a
    worker's; see bootstrap.cluster.runtime). Left unset when no host has one."""
    if sess.inv.cluster.runtime is not None:
        return
    name = sess.inv.cluster.container_name
    for h in sess.inv.hosts:
        if h.name not in sess.ssh:
            continue
        inv = RT.from_containers(sess.inv, {h.name: N.of(sess, h, name).inspect(timeout=20)})
        if inv.cluster.runtime is not None:
            sess.inv = inv
            return


def exposure_warnings(sess: Session, *, vllm_listen: str | None = None) -> list[str]:
    """Services on the head a public address would reach (the dashboard; vLLM when given)."""
    head = sess.inv.head
    r = N.of(sess, head).run(F.addresses_cmd(), timeout=30, check=False)
    found = exposure.warnings(sess.inv, {head.name: F.parse_addresses(r.stdout)}, vllm_listen=vllm_listen)
    if not r.ok and not F.parse_addresses(r.stdout):  # no addresses read: "no warning" would mean nothing
        why = (r.stderr or r.stdout).strip()[-200:] or f"exit {r.exit_code}"
        found.append(f"{head.name}: could not list its addresses ({why}): what a public address would reach "
                     "was not checked")
    for w in found:
        sess.reporter.event(head.name, "exposure", "warning", w)
    return found


def workers_cut_off(sess, port: int, *, timeout: float = 3.0) -> dict[str, str]:
    """Workers whose container cannot open a TCP connection to the head's data-plane IP:PORT
    (checks/reach.py inside each worker container), with the reason; {} when all can."""
    inv = sess.inv
    name = inv.cluster.container_name
    # the raw result: its exit status and a stopped container say why (_reach_error)
    reach = sess.stage("reach-head", inv.workers, lambda h: N.of(sess, h, name).ask(
        "reach.py", inv.head.ip, str(port), f"{timeout:g}", timeout=30 + timeout).result, strict=False)
    failed = reach.failed
    return {n: str(failed[n]) if n in failed else _reach_error(r, inv.head.ip, port) for n, r in reach.items()
            if n in failed or not r.ok}


def _reach_error(r, head_ip: str, port: int) -> str:
    if "is not running" in r.stderr:
        return (f"its container has stopped, so the check could not run there (a Ray worker exits when it "
                f"loses the head: likely cut off from {head_ip}:{port}; `bootstrap logs` shows why)")
    try:
        detail = json.loads(r.stdout.strip().splitlines()[-1]).get("error")
    except (ValueError, IndexError):
        detail = (r.stderr or r.stdout).strip()[-200:]
    return f"cannot reach the head {head_ip}:{port} from this node over the data network ({detail})"
