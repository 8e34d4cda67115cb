"""Facts: what each host has. Each fact is a command (argv) plus a pure parser.

`gather` runs the commands through an SSHHost; everything else here is pure and unit-tested on
real command output.
"""
from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from bootstrap.containers import ContainerState, parse_container_inspect
from bootstrap.errors import CommandFailed, PreflightFailed

# The container inspect and its parser live in the neutral pure bootstrap/containers.py, which
# remote/docker.py reads too (remote never imports cluster); re-exported here for the facts' readers.
from bootstrap.parallel import outcomes
from bootstrap.remote.argv import container_inspect_cmd

if TYPE_CHECKING:
    from bootstrap.cluster.guard.fence import GuardFacts
    from bootstrap.cluster.rack import RackFacts


class Runner(Protocol):
    name: str

    def run(self, argv: Sequence[str], *, timeout: float | None = None, check: bool = True,
            display: str | None = None, query: bool = False): ...


@dataclass(frozen=True)
class GPU:
    name: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class HostFacts:
    docker_version: str
    runtimes: tuple[str, ...] = ()
    gpus: tuple[GPU, ...] | None = None
    nofile_hard: int | None = None
    container: ContainerState | None = None
    #: ID of the cluster image on the host (None: not present).
    image_id: str | None = None
    #: Markers of image IDs whose `ray` was checked on this host (ray_ok_marker names).
    ray_ok: frozenset[str] = frozenset()
    #: Markers of image IDs found without `ray` on this host (ray_none_marker names).
    ray_none: frozenset[str] = frozenset()
    #: What the rack preflight reads (bootstrap.cluster.rack): clock, links, addresses, /dev/shm, IB ports.
    rack: "RackFacts | None" = None
    #: The newest CUDA the host's driver supports (`nvidia-smi --version`'s "CUDA Version"; None: unknown).
    driver_cuda: str | None = None
    #: The cluster image's CUDA_VERSION and NVIDIA_REQUIRE_CUDA (NVIDIA's CUDA images set them) where
    #: the image is on the host: {} when it is not, or does not say.
    image_cuda: Mapping[str, str] = field(default_factory=dict)
    #: What the fence and Ray's token need (bootstrap.cluster.fence; None: not gathered).
    guard: "GuardFacts | None" = None


# -- commands --------------------------------------------------------------------------------
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
#: The driver's own versions: "CUDA Version        : 13.0" is the newest CUDA it runs (not a --query-gpu
#: field: tests/data/gpu/h200-facts.txt).
NVIDIA_SMI_VERSION = ("nvidia-smi", "--version")
NOFILE_HARD = ("sh", "-c", "ulimit -Hn")
#: The server version and the runtimes in one Docker CLI start (each start costs ~40 ms of a host's CPU).
DOCKER_INFO = ("docker", "info", "--format", "{{.ServerVersion}} {{json .Runtimes}}")
#: Fact commands in flight at once on one host (sshd's MaxSessions is 10 by default; the cluster
#: lock holds one more channel on the head).
FACT_CHANNELS = 3


def inspect_both_cmd(container: str, image: str) -> tuple[str, ...]:
    """The container and the image in one `docker inspect`: one JSON object per line for each
    argument that names something, in argument order (exit 1 when one does not)."""
    return ("docker", "inspect", "--format", "{{json .}}", container, image)


def image_id_cmd(image: str) -> tuple[str, ...]:
    return ("docker", "image", "inspect", "--format", "{{.Id}}", image)


#: ray_in_image_cmd's exit status when the image has no `ray` (0: it has, and `ray --version` ran).
NO_RAY_EXIT = 3


def ray_in_image_cmd(image: str) -> tuple[str, ...]:
    """`ray --version` in a throwaway container of the image: exit 0 with Ray, NO_RAY_EXIT without;
    anything else is Docker or the image failing (125: docker run, 126/127: no sh)."""
    return ("docker", "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
            f"if command -v ray >/dev/null; then ray --version; else echo 'ray: not found'; exit {NO_RAY_EXIT}; fi")


#: Where `up` remembers, per host, the image IDs checked for `ray` (with it: ray-ok-, without: ray-none-).
MARKER_DIR = "$HOME/.cache/bootstrap"
RAY_OK_PREFIX = "ray-ok-"
RAY_NONE_PREFIX = "ray-none-"
LIST_RAY_OK = ("sh", "-c", f'ls -1 "{MARKER_DIR}" 2>/dev/null; exit 0')


def ray_ok_marker(image_id: str) -> str:
    """File name recording that `ray` is in the image with this ID (``sha256:<hex>``); only the
    ID's [0-9a-zA-Z] characters are kept, so it is always a plain file name."""
    return RAY_OK_PREFIX + _id_chars(image_id)


def ray_none_marker(image_id: str) -> str:
    """File name recording that the image with this ID has no `ray` (see ray_ok_marker)."""
    return RAY_NONE_PREFIX + _id_chars(image_id)


def _id_chars(image_id: str) -> str:
    return "".join(c for c in image_id.split(":")[-1] if c.isascii() and c.isalnum())


def write_marker_cmd(marker: str) -> tuple[str, ...]:
    return ("sh", "-c", f'mkdir -p "{MARKER_DIR}" && : > "{MARKER_DIR}/$1"', "sh", marker)


# -- parsers ---------------------------------------------------------------------------------
def parse_docker_info(out: str) -> tuple[str, tuple[str, ...]]:
    """DOCKER_INFO's output -> (server version, runtimes)."""
    version, _, runtimes = out.strip().partition(" ")
    return version, parse_runtimes(runtimes)


def parse_inspect_both(out: str, container: str, image: str) -> tuple[ContainerState | None, str | None] | None:
    """inspect_both_cmd's output -> (the container, the image ID). Only when every object in it
    is plainly our container or the image by its reference; else None (say an image named like
    the container, or a reference written differently from its tag): then ask separately."""
    objs = []
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            return None
        objs.append(obj)
    tagged = image if ("@" in image or ":" in image.rsplit("/", 1)[-1]) else image + ":latest"
    cstate, image_id = None, None
    for o in objs:
        if not isinstance(o, dict):
            return None
        if cstate is None and "State" in o and o.get("Name") == "/" + container:
            cstate = parse_container_inspect(json.dumps([o]))
        elif image_id is None and "State" not in o and str(o.get("Id", "")).startswith("sha256:") and (
                tagged in (o.get("RepoTags") or []) or image in (o.get("RepoDigests") or [])):
            image_id = o["Id"]
        else:
            return None
    return cstate, image_id


#: The image variables the CUDA check reads (bootstrap.cluster.rack, check cuda-driver).
IMAGE_CUDA_VARS = ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA")


def parse_image_cuda(out: str) -> dict[str, str]:
    """IMAGE_CUDA_VARS from the image's Config.Env in inspect_both_cmd's output (the object without a
    State, i.e. not the container); {} when the image is not in it or sets none."""
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if not isinstance(obj, dict) or "State" in obj:
            continue
        env = (obj.get("Config") or {}).get("Env") or []
        pairs = (str(e).split("=", 1) for e in env if "=" in str(e))
        return {k: v for k, v in pairs if k in IMAGE_CUDA_VARS}
    return {}


_CUDA_LINE = re.compile(r"^\s*CUDA Version\s*:\s*(\d+\.\d+)", re.MULTILINE)


def parse_driver_cuda(out: str) -> str | None:
    """"13.0" from `nvidia-smi --version` (or the table's header, or `-q`); None when absent."""
    m = _CUDA_LINE.search(out) or re.search(r"CUDA Version:\s*(\d+\.\d+)", out)
    return m[1] if m else None


def parse_ray_ok(out: str, prefix: str = RAY_OK_PREFIX) -> frozenset[str]:
    """The marker names with this prefix in LIST_RAY_OK's output."""
    return frozenset(ln.strip() for ln in out.splitlines()
                     if ln.strip().startswith(prefix) and len(ln.strip()) > len(prefix))


def parse_nvidia_smi(out: str) -> tuple[GPU, ...]:
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        mem = parts[1].split()[0]
        gpus.append(GPU(parts[0], int(float(mem)) if mem.replace(".", "").isdigit() else 0, parts[2]))
    return tuple(gpus)


def parse_runtimes(out: str) -> tuple[str, ...]:
    try:
        return tuple(sorted(json.loads(out or "{}")))
    except json.JSONDecodeError:
        return ()


def parse_nofile(out: str) -> int | None:
    s = out.strip()
    if s == "unlimited":
        return 1 << 30
    return int(s) if s.isdigit() else None


# -- gathering (I/O through the runner) ------------------------------------------------------
def _in_parallel(jobs: Mapping[str, Callable[[], Any]], width: int) -> dict[str, Any]:
    """Every job's result, at most `width` at once (bootstrap.parallel: daemon threads, waited for in
    short steps, so an interrupt is seen); the first job (in order) that raised raises."""
    got = outcomes(jobs, lambda k: jobs[k](), lambda k: k, width, name="facts")
    for k in jobs:
        if isinstance(got[k], BaseException):
            raise got[k]
    return {k: got[k] for k in jobs}


def gather(ssh: Runner, *, container: str, image: str, want_gpus: bool, cluster: str | None = None) -> HostFacts:
    try:
        version, runtimes = parse_docker_info(ssh.run(DOCKER_INFO, timeout=30, query=True).stdout)
        if not version:
            raise CommandFailed(ssh.name, shlex.join(DOCKER_INFO), 0, "no server version")
    except CommandFailed as exc:
        text = exc.output_tail
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
    from bootstrap.cluster.guard.fence import guard_facts_cmd, parse_guard
    from bootstrap.cluster.rack import RACK_FACTS, parse_rack

    cmds = {"nofile": NOFILE_HARD, "inspect": inspect_both_cmd(container, image), "ray_ok": LIST_RAY_OK,
            "rack": RACK_FACTS}
    if cluster is not None:
        cmds["guard"] = guard_facts_cmd(cluster)
    if want_gpus:
        cmds["gpus"] = NVIDIA_SMI
        cmds["cuda"] = NVIDIA_SMI_VERSION
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
        gpus = parse_nvidia_smi(r.stdout)
    both = parse_inspect_both(got["inspect"].stdout, container, image)
    if both is None:
        # not checked: Docker answered `docker info` above, so a failed inspect here means "no such
        # container" / "no such image"
        ci = ssh.run(container_inspect_cmd(container), timeout=30, check=False, query=True)
        ii = ssh.run(image_id_cmd(image), timeout=30, check=False, query=True)
        both = (parse_container_inspect(ci.stdout) if ci.ok else None, ii.stdout.strip() if ii.ok else None)
    cstate, image_id = both
    driver_cuda = parse_driver_cuda(got["cuda"].stdout) if "cuda" in got and got["cuda"].ok else None
    return HostFacts(docker_version=version, runtimes=runtimes, gpus=gpus,
                     nofile_hard=parse_nofile(got["nofile"].stdout), container=cstate,
                     image_id=image_id or None, ray_ok=parse_ray_ok(got["ray_ok"].stdout),
                     ray_none=parse_ray_ok(got["ray_ok"].stdout, RAY_NONE_PREFIX),
                     # not checked: a host without iproute2 or /sys/class/infiniband prints less; what
                     # is missing is not checked (rack.check_rack skips facts it does not have)
                     rack=parse_rack(got["rack"].stdout, sent=sent.get("rack"), received=received.get("rack")),
                     driver_cuda=driver_cuda,
                     image_cuda=parse_image_cuda(got["inspect"].stdout) if image_id else {},
                     guard=parse_guard(got["guard"].stdout) if "guard" in got else None)


def check_preflight(name: str, facts: HostFacts, *, want_gpus: int | None) -> None:
    """Raise PreflightFailed when the host cannot run the cluster container."""
    if want_gpus:
        if "nvidia" not in facts.runtimes:
            raise PreflightFailed(name, "Docker has no NVIDIA runtime (--gpus would fail)",
                                  "install nvidia-container-toolkit and run "
                                  "`nvidia-ctk runtime configure --runtime=docker`")
        n = len(facts.gpus or ())
        if n != want_gpus:
            raise PreflightFailed(name, f"nvidia-smi shows {n} GPU(s), the inventory expects {want_gpus}",
                                  "fix hosts[].gpus / cluster.gpus_per_node or the host")


# -- addresses (for bootstrap.exposure) ------------------------------------------------------
def addresses_cmd() -> tuple[str, ...]:
    """The host's IP addresses: `ip -o addr show`, or `hostname -I` where iproute2 is missing."""
    return ("sh", "-c", "ip -o addr show 2>/dev/null || hostname -I")


#: The interface an `ip -o addr show` line is about: ``2: eth0    inet ...``, ``3: eth1@if12    inet ...``.
_IP_O_NAME = re.compile(r"^\s*\d+:\s+(?P<name>[^\s@:]+)(?:@\S+)?:?\s")


def parse_ip_addrs(out: str) -> tuple[tuple[str, str], ...]:
    """(interface, address) for each address in `ip -o addr show` lines (``2: eth0    inet 10.0.0.5/24 ...``);
    interface "" for the words of `hostname -I` (``10.0.0.5 2001:db8::5``). Addresses normalised,
    without prefix length or zone, in the order given; anything else is skipped."""
    import ipaddress

    found: list[tuple[str, str]] = []
    for line in out.splitlines():
        words = line.split()
        if "inet" in words or "inet6" in words:
            m = _IP_O_NAME.match(line)
            name = m["name"] if m else ""
            tokens = [words[i + 1] for i, w in enumerate(words[:-1]) if w in ("inet", "inet6")]
        else:
            name, tokens = "", words
        for token in tokens:
            try:
                found.append((name, str(ipaddress.ip_address(token.split("/", 1)[0].split("%", 1)[0]))))
            except ValueError:
                continue
    return tuple(found)


def parse_ip_nets(out: str) -> tuple[str, ...]:
    """Each address of `ip -o addr show` lines with its prefix length, as the kernel holds it
    (``10.0.0.5/24``, normalised, without zone): the network each interface address is on."""
    import ipaddress

    found: list[str] = []
    for line in out.splitlines():
        words = line.split()
        for token in (words[i + 1] for i, w in enumerate(words[:-1]) if w in ("inet", "inet6")):
            address, slash, prefix = token.partition("/")
            if not slash:
                continue
            try:
                found.append(str(ipaddress.ip_interface(f"{address.split('%', 1)[0]}/{prefix}")))
            except ValueError:
                continue
    return tuple(found)


def parse_addresses(out: str) -> tuple[str, ...]:
    """The host's addresses (see parse_ip_addrs), each once, in the order given."""
    return tuple(dict.fromkeys(ip for _, ip in parse_ip_addrs(out)))
