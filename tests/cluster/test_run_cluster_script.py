"""scripts/run_cluster.sh and the plan start the same container for the same inputs."""
import subprocess
from pathlib import Path

import pytest

from bootstrap.cluster.plan import container_spec
from bootstrap.model import Ports
from tests.support.plan_fixtures import cpu_inventory, gpu_inventory

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run_cluster.sh"


def script_argv(*args):
    out = subprocess.run(["bash", str(SCRIPT), "--dry-run", *args], check=True, capture_output=True).stdout
    return tuple(x.decode() for x in out.split(b"\0")[:-1])


def without_labels(argv):
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--label":
            skip = True
            continue
        out.append(a)
    return tuple(out)


def script_args_for(inv, h, nofile):
    c = inv.cluster
    args = ["--node-ip", h.ip, "--name", c.container_name, "--cluster", c.name,
            "--gpus", "all" if c.accelerator == "gpu" else "none", "--nofile", str(nofile),
            "--gcs-port", str(c.ports.ray_gcs), "--dashboard-port", str(c.ports.dashboard),
            "--metrics-port", str(c.ports.ray_metrics)]
    if c.accelerator == "gpu" and h.gpus:
        args += ["--num-gpus", str(h.gpus)]
    if not c.ipc_host:
        args += ["--shm-size", c.shm_size]
    if c.infiniband:
        args += ["--infiniband"]
    if c.privileged:
        args += ["--privileged"]
    if c.runtime == "none":
        args += ["--no-ray"]
    if c.dashboard_host != "localhost":
        args += ["--dashboard-host", c.dashboard_host]
    for m in c.mounts:
        args += ["-v", m]
    for k, v in h.env:
        args += ["-e", f"{k}={v}"]
    args += [c.image, inv.head.ip, "--head" if h.is_head else "--worker"]
    if c.hf_cache:
        args += [c.hf_cache]
    return args


CASES = {
    "gpu": gpu_inventory(),
    "gpu-ib-privileged-mounts": gpu_inventory(infiniband=True, privileged=True, mounts=("/models:/models:ro",),
                                              ports=Ports(7000, 8266, 8001)),
    "cpu-shm": cpu_inventory(3),
    "no-ray": cpu_inventory(2, runtime="none"),
    "env-with-shell-metachars": cpu_inventory(2, env=()),
    "dashboard-data-plane": gpu_inventory(dashboard_host="data-plane"),
    "dashboard-all": cpu_inventory(2, dashboard_host="all"),
    "dashboard-literal-ipv6": gpu_inventory(dashboard_host="fd00::11"),
    "dashboard-localhost-literal": gpu_inventory(dashboard_host="127.0.0.1"),
    "dashboard-ignored-without-ray": cpu_inventory(2, runtime="none", dashboard_host="all"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_script_matches_plan(case):
    inv = CASES[case]
    if case == "env-with-shell-metachars":
        from dataclasses import replace
        hosts = tuple(replace(h, env=(("A", "it's \"quoted\" $(touch /tmp/pwned) `x`"), ("B", "two words")))
                      for h in inv.hosts)
        inv = replace(inv, hosts=hosts)
    for h in inv.hosts:
        plan = container_spec(inv, h, nofile=20000).run_argv()
        assert without_labels(script_argv(*script_args_for(inv, h, 20000))) == without_labels(plan), h.name
    assert not Path("/tmp/pwned").exists()


def test_script_rejects_bad_role():
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "img", "10.0.0.1", "--boss"], capture_output=True, text=True)
    assert r.returncode == 2 and "--head or --worker" in r.stderr


def test_script_dashboard_host_localhost_is_rays_default():
    base = ["--nofile", "1024", "img", "10.0.0.1", "--head"]
    assert script_argv(*base) == script_argv("--dashboard-host", "localhost", *base)
    assert "--dashboard-host=10.0.0.1" in script_argv("--dashboard-host", "data-plane", *base)
    assert not any(a.startswith("--dashboard-host") for a in
                   script_argv("--dashboard-host", "all", "--nofile", "1024", "img", "10.0.0.1", "--worker",
                               "--node-ip", "10.0.0.2"))
