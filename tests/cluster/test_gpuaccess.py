"""How a host's Docker gives containers the GPUs (issue 63, point 4): the facts script run for real on
files recorded from real hosts (tests/data/hosts: a CDI spec from `nvidia-ctk cdi generate`, the
toolkit's shipped config.toml; SOURCES.md says where each came from), the choice, the preflight check
and the plan's per-host flags. And Podman's docker named for what it is (point 6)."""
import json
import subprocess
from pathlib import Path

import pytest

from bootstrap.cluster import facts as F
from bootstrap.cluster import gpuaccess as GA
from bootstrap.cluster import plan as PL
from bootstrap.cluster import probe
from bootstrap.cluster.preflight.checks import check_preflight
from bootstrap.errors import PreflightFailed
from tests.support.fake_hosts import FakeHost
from tests.support.plan_fixtures import gpu_inventory

HOSTS = Path(__file__).resolve().parents[1] / "data" / "hosts"
#: what Docker 28.2+ says its CDI spec directories are (docker/cli's golden `docker info` JSON; the same
#: two directories as Docker 29.7's text output in docker-info-29.7-cdi-nvidia-gpu.txt)
CDI_DIRS = json.dumps(json.loads((HOSTS / "docker-info-golden-with-devices.json").read_text())["CDISpecDirs"])


def host_facts(tmp_path, *, hook=False, spec=False, mode=None, docker_cdi="null"):
    """GA.FACTS run here, its fixed paths moved under tmp_path: the toolkit's hook as a program on PATH,
    the recorded CDI spec in the spec directory, the shipped config.toml (its mode changed where asked),
    and a `docker` that answers `docker info --format '{{json .CDISpecDirs}}'` with `docker_cdi`."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (root / "etc/cdi").mkdir(parents=True)
    (root / "var/run/cdi").mkdir(parents=True)
    (root / "etc/nvidia-container-runtime").mkdir(parents=True)
    (root / "bin/docker").write_text(f"#!/bin/sh\necho '{docker_cdi}'\n")
    (root / "bin/docker").chmod(0o755)
    if hook:
        (root / "bin/nvidia-container-runtime-hook").write_text("#!/bin/sh\n")
        (root / "bin/nvidia-container-runtime-hook").chmod(0o755)
    if spec:
        (root / "etc/cdi/nvidia.yaml").write_text((HOSTS / "cdi-nvidia.yaml").read_text())
    config = (HOSTS / "nvidia-config-toml.txt").read_text()
    assert 'mode = "auto"' in config
    if mode is not None:
        (root / GA.TOOLKIT_CONFIG.lstrip("/")).write_text(config.replace('mode = "auto"', f'mode = "{mode}"'))
    script = GA.FACTS[2].replace("/etc/", f"{root}/etc/").replace("/var/run/", f"{root}/var/run/")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                         env={"PATH": f"{root}/bin:/usr/bin:/bin"}).stdout
    return GA.parse(out.replace(str(root), "")), out


def test_the_toolkits_hook_is_what_gpus_needs_without_a_registered_nvidia_runtime(tmp_path):
    f, out = host_facts(tmp_path, hook=True, mode="auto")
    assert (f.hook, f.mode, f.cdi_specs, f.docker_cdi) == (True, "auto", (), ())
    c = GA.choose(f, runtimes=("io.containerd.runc.v2", "runc"), docker_version="27.5.1")
    assert (c.way, c.flags) == ("gpus", ("--gpus", "all")), c


def test_a_cdi_only_host_gets_the_cdi_device(tmp_path):
    f, _ = host_facts(tmp_path, spec=True, docker_cdi=CDI_DIRS)
    assert f.cdi_specs == (("nvidia.com/gpu", "/etc/cdi/nvidia.yaml"),) and f.docker_cdi == ("/etc/cdi", "/var/run/cdi")
    c = GA.choose(f, runtimes=("runc",), docker_version="28.3.0")
    assert (c.way, c.flags) == ("cdi", ("--device", "nvidia.com/gpu=all")), c


@pytest.mark.parametrize("docker_cdi, version, says, fix", [
    ("", "20.10.24", "Docker 20.10.24 has no CDI (Docker 25+ has it)", "upgrade Docker to 25+"),
    ("null", "26.1.5", "Docker's CDI is off", '"features": {"cdi": true}'),
    (CDI_DIRS, "28.3.0", 'no CDI spec for nvidia.com/gpu', GA.GENERATE),
])
def test_the_cdi_mode_trap_is_refused_naming_the_config_and_a_fix_that_works(tmp_path, docker_cdi, version, says,
                                                                            fix):
    """The toolkit set to mode = "cdi" makes `docker run --gpus` fail (tests/data/hosts/docker-gpus-error-cdi-mode.txt:
    "invoking the NVIDIA Container Runtime Hook directly (e.g. specifying the docker --gpus flag) is not
    supported"), though the hook is on PATH: refused unless CDI itself works."""
    f, _ = host_facts(tmp_path, hook=True, mode="cdi", docker_cdi=docker_cdi)
    c = GA.choose(f, docker_version=version)
    assert c.way is None, c
    assert c.why.startswith('the NVIDIA Container Toolkit is in mode "cdi" (/etc/nvidia-container-runtime/config.toml)')
    assert says in c.why and fix in c.fix and 'set mode = "auto"' in c.fix, c
    recorded = (HOSTS / "docker-gpus-error-cdi-mode.txt").read_text()
    assert "Using requested mode 'cdi'" in recorded and "--gpus flag) is not supported" in recorded


def test_in_cdi_mode_with_cdi_working_the_device_is_used(tmp_path):
    f, _ = host_facts(tmp_path, hook=True, spec=True, mode="cdi", docker_cdi=CDI_DIRS)
    assert GA.choose(f, docker_version="28.3.0").way == "cdi"


def test_neither_hook_nor_spec_is_refused_by_the_preflight_with_the_host_named(tmp_path):
    bare, _ = host_facts(tmp_path / "a")
    c = GA.choose(bare, runtimes=("nvidia", "runc"), docker_version="24.0.7")
    assert c.way is None and "install nvidia-container-toolkit" in c.fix and GA.GENERATE in c.fix
    spec_off, _ = host_facts(tmp_path / "b", spec=True, docker_cdi="null")
    c = GA.choose(spec_off, docker_version="26.1.5")
    assert c.way is None and "Docker's CDI is off" in c.why and '"features": {"cdi": true}' in c.fix
    gpus = F.parse_nvidia_smi((HOSTS.parent / "nvidia_smi_h100x8.csv").read_text())
    with pytest.raises(PreflightFailed, match="gpu-a: neither the NVIDIA Container Toolkit's "
                                              "nvidia-container-runtime-hook") as e:
        check_preflight("gpu-a", F.HostFacts("24.0.7", runtimes=("nvidia", "runc"), gpus=gpus, gpu_access=bare),
                        want_gpus=8)
    assert GA.GENERATE in str(e.value)


def test_a_mixed_rack_gets_each_hosts_own_way_to_its_gpus(tmp_path):
    """One host with the toolkit's hook, one with CDI only: each node container asks its own Docker the
    way that host has (the plan is per host)."""
    inv = gpu_inventory()
    hook, _ = host_facts(tmp_path / "a", hook=True)
    cdi, _ = host_facts(tmp_path / "b", spec=True, docker_cdi=CDI_DIRS)
    facts = {inv.hosts[0].name: F.HostFacts("20.10.24", gpu_access=hook),
             inv.hosts[1].name: F.HostFacts("28.3.0", gpu_access=cdi)}
    opts = {a.host: a.spec.options for a in PL.plan_up(inv, facts)}
    assert "--gpus" in opts[inv.hosts[0].name] and "nvidia.com/gpu=all" not in opts[inv.hosts[0].name]
    i = opts[inv.hosts[1].name].index("--device")
    assert opts[inv.hosts[1].name][i:i + 2] == ("--device", "nvidia.com/gpu=all")
    assert "--gpus" not in opts[inv.hosts[1].name]


@pytest.mark.parametrize("name", ["podman-docker-version.txt", "podman-docker-version-full.txt",
                                  "podman-docker-info-template-error.txt"])
def test_podmans_docker_is_named_for_what_it_is(name):
    assert F.is_podman((HOSTS / name).read_text())


def test_docker_engine_is_not_taken_for_podman():
    for name in ("docker-info-28.2-cdi-discovered-devices.txt", "docker-info-29.7-cdi-nvidia-gpu.txt",
                 "docker-gpus-no-driver-cli28-local.txt"):
        assert not F.is_podman((HOSTS / name).read_text()), name


def test_a_podman_host_is_refused_before_anything_with_what_bootstrap_needs():
    """`docker info --format '{{.ServerVersion}} ...'` fails under Podman (its info type has no such field);
    the host is named, Podman said, and the fix is Docker Engine, not "start the Docker daemon"."""
    err = (HOSTS / "podman-docker-info-template-error.txt").read_text().replace(".MemTotal", ".ServerVersion")
    host = FakeHost("gpu-a", [("docker info", (125, "", err))])
    with pytest.raises(PreflightFailed) as e:
        probe.gather(host, container="c", image="i", want_gpus=False)
    assert "gpu-a: `docker` here is Podman" in str(e.value) and "install Docker Engine" in str(e.value)
    assert "start the Docker daemon" not in str(e.value)
    # the banner suppressed (/etc/containers/nodocker) and another error: `docker --version` says it
    quiet = FakeHost("gpu-b", [("docker info", (125, "", "Error: cannot clone: Operation not permitted")),
                               ("docker --version", (0, "podman version 4.3.1\n", ""))])
    with pytest.raises(PreflightFailed, match="gpu-b: `docker` here is Podman"):
        probe.gather(quiet, container="c", image="i", want_gpus=False)
