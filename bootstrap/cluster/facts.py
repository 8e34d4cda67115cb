"""Facts: what each host has, pure: each fact is a command (argv) plus a parser of its output.

Nothing here runs a command: bootstrap.cluster.probe.gather runs them through a host's runner. The
parsers are unit-tested on real command output.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Mapping, Sequence

from bootstrap.cluster import fabric as FB
from bootstrap.cluster.gids import Gid, link_local_only, parse_gid_line, pick
from bootstrap.containers import ContainerState, image_content_key, image_platform, parse_container_inspect
from bootstrap.remote import argv as RA

# The container inspect and its parser live in the neutral pure bootstrap/containers.py, which
# remote/docker.py reads too (remote never imports cluster); re-exported here for the facts' readers.
if TYPE_CHECKING:
    from bootstrap.cluster.gpuaccess import GpuAccessFacts
    from bootstrap.cluster.guard.fence import GuardFacts


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
    #: ID of the cluster image on the host (None: not present): the host's own name for it (each image
    #: store names an image its own way), for what runs there.
    image_id: str | None = None
    #: The image by its content (containers.image_content_key): the same image on every host, whatever
    #: its image store; what the image check and the image's distribution compare across hosts.
    image_key: str | None = None
    #: Markers of image IDs whose `ray` was checked on this host (ray_ok_marker names).
    ray_ok: frozenset[str] = frozenset()
    #: Markers of image IDs found without `ray` on this host (ray_none_marker names).
    ray_none: frozenset[str] = frozenset()
    #: What the preflight's node checks read (RACK_FACTS): clock, links, addresses, /dev/shm, IB ports.
    rack: "RackFacts | None" = None
    #: The newest CUDA the host's driver supports (`nvidia-smi --version`'s "CUDA Version"; None: unknown).
    driver_cuda: str | None = None
    #: The cluster image's CUDA_VERSION and NVIDIA_REQUIRE_CUDA (NVIDIA's CUDA images set them) where
    #: the image is on the host: {} when it is not, or does not say.
    image_cuda: Mapping[str, str] = field(default_factory=dict)
    #: What the fence and Ray's token need (bootstrap.cluster.guard.fence; None: not gathered).
    guard: "GuardFacts | None" = None
    #: How Docker can give a container the GPUs (bootstrap.cluster.gpuaccess; None: not gathered).
    gpu_access: "GpuAccessFacts | None" = None
    #: The platform the cluster image on the host is built for ("linux/amd64", "linux/arm64/v8"; None:
    #: the image is not there, or does not say).
    image_platform: str | None = None


# -- commands --------------------------------------------------------------------------------
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits")
#: The driver's own versions: "CUDA Version        : 13.0" is the newest CUDA it runs (not a --query-gpu
#: field: tests/data/gpu/h200-facts.txt).
NVIDIA_SMI_VERSION = ("nvidia-smi", "--version")
NOFILE_HARD = ("sh", "-c", "ulimit -Hn")
#: The server version and the runtimes in one Docker CLI start (each start costs ~40 ms of a host's CPU).
DOCKER_INFO = RA.info_argv("{{.ServerVersion}} {{json .Runtimes}}")


#: What `docker` is: Docker's CLI, or Podman's emulation of it (podman-docker).
DOCKER_VERSION = ("sh", "-c", "docker --version 2>&1")
#: Podman's docker (the podman-docker package, or an alias), named for what it is: (what, fix).
PODMAN = ("`docker` here is Podman (its Docker emulation: podman-docker), not Docker Engine: bootstrap needs "
          "dockerd (`docker info`'s server version, --gpus through the NVIDIA toolkit, restart policies, "
          "`docker save | docker load` between hosts)",
          "install Docker Engine (docs.docker.com/engine/install) and remove podman-docker, or leave this host "
          "out of the inventory")


def is_podman(text: str) -> bool:
    """Podman's docker said it: its banner ("Emulate Docker CLI using podman"), its version line
    ("podman version 4.3.1"), or a template error on its own info type (system.infoReport, define.Info):
    tests/data/hosts/podman-docker-*.txt."""
    low = text.lower()
    return "using podman" in low or "podman version" in low or "system.inforeport" in low or "define.info" in low


def inspect_both_cmd(container: str, image: str) -> tuple[str, ...]:
    """The container and the image in one `docker inspect`: one JSON object per line for each
    argument that names something, in argument order (exit 1 when one does not)."""
    return RA.inspect_argv(container, image, fmt="{{json .}}")


def image_id_cmd(image: str) -> tuple[str, ...]:
    return RA.image_inspect_argv(image, "{{.Id}}")


def image_cmd(image: str) -> tuple[str, ...]:
    """The image's inspect as JSON: its ID and its content key (parse_image)."""
    return RA.image_inspect_argv(image, "{{json .}}")


def parse_image(out: str) -> tuple[str | None, str | None]:
    """image_cmd's output -> (the host's ID of the image, its content key); (None, None) when absent."""
    try:
        obj = json.loads(out.strip() or "null")
    except json.JSONDecodeError:
        return None, None
    if not isinstance(obj, dict) or not str(obj.get("Id", "")).startswith("sha256:"):
        return None, None
    return obj["Id"], image_content_key(obj)


def parse_image_key(out: str) -> str | None:
    """The image's content key from inspect_both_cmd's output (the object without a State); None when
    the image is not in it."""
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "State" not in obj:
            return image_content_key(obj)
    return None


#: ray_in_image_cmd's exit status when the image has no `ray` (0: it has, and `ray --version` ran).
NO_RAY_EXIT = 3


def ray_in_image_cmd(image: str) -> tuple[str, ...]:
    """`ray --version` in a throwaway container of the image: exit 0 with Ray, NO_RAY_EXIT without;
    anything else is Docker or the image failing (125: docker run, 126/127: no sh)."""
    return RA.sh_in_image_argv(image, "if command -v ray >/dev/null; then ray --version; "
                                      f"else echo 'ray: not found'; exit {NO_RAY_EXIT}; fi")


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


#: `uname -m` -> the architecture's name in image platforms (Go's GOARCH, as Docker and OCI write it).
ARCH_OF_UNAME = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
                 "s390x": "s390x", "riscv64": "riscv64", "armv7l": "arm", "i686": "386", "i386": "386"}


def host_arch(uname: str | None) -> str | None:
    """The image platform's architecture for a host's `uname -m` (its own word where unknown); None: not read."""
    word = (uname or "").strip()
    return ARCH_OF_UNAME.get(word, word) or None


def platform_arch(platform: str | None) -> str | None:
    """"arm64" of "linux/arm64/v8"; None when there is none."""
    parts = (platform or "").split("/")
    return parts[1] if len(parts) > 1 and parts[1] else None


def parse_image_platform(out: str) -> str | None:
    """"OS/ARCH[/VARIANT]" of the image (the object without a State) in inspect_both_cmd's or image_cmd's
    output; None when the image is not in it or does not say its architecture."""
    for line in out.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "State" not in obj and obj.get("Architecture"):
            return image_platform(obj)
    return None


#: The image variables the CUDA check reads (bootstrap.cluster.preflight.checks, check cuda-driver).
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


# -- the rack facts (what the preflight's node checks read) ------------------------------------
#: One shell run on the host (not in a container): sections the parser splits on "== NAME".
_SCRIPT = r"""
echo "== clock"; date +%s.%N
echo "== link"; ip -o link show 2>/dev/null
echo "== addr"; ip -o addr show 2>/dev/null
echo "== shm"; df -P -B1 /dev/shm 2>/dev/null | tail -n 1
echo "== cpus"; nproc 2>/dev/null
echo "== arch"; uname -m 2>/dev/null
echo "== ib"
[ -d /sys/class/infiniband ] && echo present
""" + FB.HCA_LINES.strip("\n") + r"""
for p in /sys/class/infiniband/*/ports/*; do
  [ -d "$p" ] || continue
  hca=${p#/sys/class/infiniband/}; hca=${hca%%/*}
  echo "$hca ${p##*/} $(tr -d ' ' < "$p/link_layer" 2>/dev/null) - $(cat "$p/state" 2>/dev/null)"
  for t in "$p"/gid_attrs/types/*; do
    ty=$(cat "$t" 2>/dev/null) && [ -n "$ty" ] || continue
    i=${t##*/}; n=$(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null); [ -n "$n" ] || n=-
    echo "gid $hca ${p##*/} $i $(cat "$p/gids/$i" 2>/dev/null) $n $ty"
  done
done
""" + FB.GDR_LINES.strip("\n") + r"""
echo "== dockerd"
d=$(pgrep -o -x dockerd 2>/dev/null || pidof -s dockerd 2>/dev/null)
if [ -n "$d" ]; then
  grep -e "^Max locked memory" /proc/$d/limits 2>/dev/null; grep -e "^CapEff:" /proc/$d/status 2>/dev/null
fi
"""
RACK_FACTS: tuple[str, ...] = ("sh", "-c", _SCRIPT)


@dataclass(frozen=True)
class Link:
    name: str
    #: the interface is administratively up and has a carrier (flags UP and LOWER_UP)
    up: bool
    mtu: int | None


@dataclass(frozen=True)
class IBPort:
    hca: str
    port: int
    #: "InfiniBand" or "Ethernet" (RoCE)
    link_layer: str
    #: the port has a RoCE v2 GID with a routable address (gids.pick)
    rocev2: bool
    #: the state word: ACTIVE, DOWN, INIT, ARMED
    state: str
    #: the index of the RoCE v2 GID NCCL should use (gids.pick), where known
    rocev2_index: int | None = None
    #: its GID table (the entries in use), where read
    gids: tuple[Gid, ...] = ()
    #: the HCA's PCI driver ("mlx5_core", "efa"; None: not read)
    driver: str | None = None

    @property
    def efa(self) -> bool:
        """An AWS EFA device (fabric.is_efa): NCCL reaches it through its EFA plugin only."""
        return FB.is_efa(self.driver)

    @property
    def link_local_only(self) -> bool:
        """RoCE v2 GIDs, every one link-local (fe80::): its network device has no routable address."""
        return link_local_only(self.gids)


@dataclass(frozen=True)
class RackFacts:
    #: the host's clock minus this machine's at the moment it was read (SSH latency halved out)
    clock_offset: float | None = None
    links: tuple[Link, ...] = ()
    #: (interface, address) pairs
    addrs: tuple[tuple[str, str], ...] = ()
    shm_bytes: int | None = None
    #: None: no /sys/class/infiniband on the host
    ib: tuple[IBPort, ...] | None = None
    #: dockerd's hard limit of locked memory in bytes (-1: unlimited; None: not read)
    dockerd_memlock: int | None = None
    #: dockerd may raise a container's limits past its own (CAP_SYS_RESOURCE; None: not read)
    dockerd_sys_resource: bool | None = None
    #: the CPUs the host's processes may run on (`nproc`; None: not read)
    cpus: int | None = None
    #: each address with its prefix length (``10.0.0.5/24``): the networks the host is on
    nets: tuple[str, ...] = ()
    #: `uname -m` ("x86_64", "aarch64"; None: not read); host_arch() names it as image platforms do
    machine: str | None = None
    #: what GPUDirect RDMA could use (fabric.GpuDirect; None: not read)
    gdr: FB.GpuDirect | None = None

    @property
    def arch(self) -> str | None:
        return host_arch(self.machine)


def parse_rack(out: str, *, sent: float | None = None, received: float | None = None) -> RackFacts:
    """RACK_FACTS' output; sent/received: this machine's time.time() around the command, to turn the
    host's clock into an offset."""
    sections: dict[str, list[str]] = {}
    cur = None
    for line in out.splitlines():
        if line.startswith("== "):
            cur = line[3:].strip()
            sections[cur] = []
        elif cur is not None and line.strip():
            sections[cur].append(line)
    offset = None
    try:
        remote = float(sections.get("clock", [""])[0])
        if sent is not None and received is not None:
            offset = remote - (sent + received) / 2
    except (ValueError, IndexError):
        pass
    links = tuple(lk for lk in (parse_link(ln) for ln in sections.get("link", [])) if lk is not None)
    addrs = parse_ip_addrs("\n".join(sections.get("addr", [])))
    shm = None
    parts = (sections.get("shm") or [""])[0].split()
    if len(parts) >= 2 and parts[1].isdigit():
        shm = int(parts[1])
    ib_lines = sections.get("ib", [])
    ib = None
    if ib_lines and ib_lines[0] == "present":
        drivers = FB.parse_hca_lines(ib_lines[1:])
        ports = [p for p in (parse_ib_port(ln) for ln in ib_lines[1:] if not ln.startswith(("gid ", "hca ")))
                 if p is not None]
        ib = _with_gids([replace(p, driver=drivers.get(p.hca)) if p.hca in drivers else p for p in ports],
                        [g for g in (parse_gid_line(ln) for ln in ib_lines[1:]) if g])
    memlock, sys_resource = parse_dockerd(sections.get("dockerd", []))
    nproc = (sections.get("cpus") or [""])[0].strip()
    return RackFacts(offset, links, addrs, shm, ib, memlock, sys_resource,
                     int(nproc) if nproc.isdigit() and int(nproc) > 0 else None,
                     parse_ip_nets("\n".join(sections.get("addr", []))),
                     (sections.get("arch") or [""])[0].strip() or None, FB.parse_gdr(sections.get("gdr", [])))


#: CAP_SYS_RESOURCE's bit in /proc/PID/status CapEff
CAP_SYS_RESOURCE = 24


def parse_dockerd(lines: Sequence[str]) -> tuple[int | None, bool | None]:
    """(hard memlock limit, has CAP_SYS_RESOURCE) from dockerd's /proc limits and status lines."""
    memlock = caps = None
    for ln in lines:
        if ln.startswith("Max locked memory"):
            hard = ln.split()[4:5]
            if hard == ["unlimited"]:
                memlock = -1
            elif hard and hard[0].isdigit():
                memlock = int(hard[0])
        elif ln.startswith("CapEff:"):
            try:
                caps = bool(int(ln.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
            except (IndexError, ValueError):
                caps = None
    return memlock, caps


_LINK = re.compile(r"^\d+:\s+([^:@\s]+)(?:@\S+)?:\s+<([^>]*)>.*?\bmtu (\d+)")


def parse_link(line: str) -> Link | None:
    """One line of `ip -o link show`: `2: eth0@if5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 ...`."""
    m = _LINK.match(line.strip())
    if not m:
        return None
    flags = set(m[2].split(","))
    return Link(m[1], "UP" in flags and "LOWER_UP" in flags, int(m[3]))


def _with_gids(ports: list[IBPort], gids: list[tuple[str, int, Gid]]) -> tuple[IBPort, ...]:
    """Each port with its GID table and the RoCE v2 GID picked from it (ports without GID lines: as printed)."""
    out = []
    for p in ports:
        table = tuple(g for hca, port, g in gids if (hca, port) == (p.hca, p.port))
        if table:
            chosen = pick(table)
            p = replace(p, gids=table, rocev2=chosen is not None, rocev2_index=chosen.index if chosen else None)
        out.append(p)
    return tuple(out)


def parse_ib_port(line: str) -> IBPort | None:
    """`HCA PORT LINK_LAYER ROCEV2 STATE...` as RACK_FACTS prints it (state: `4: ACTIVE`; ROCEV2: 0, or
    1@N with N the GID index, or a bare 1)."""
    parts = line.split(None, 4)
    if len(parts) < 5 or not parts[1].isdigit():
        return None
    state = parts[4].split(":")[-1].strip().upper()
    flag, _, index = parts[3].partition("@")
    return IBPort(parts[0], int(parts[1]), parts[2], flag == "1", state, int(index) if index.isdigit() else None)
