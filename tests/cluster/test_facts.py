"""Fact parsers on real command output (captured from Docker 20.10 and nvidia-smi's CSV format)."""
from pathlib import Path

import pytest

from bootstrap.cluster.facts import (
    GPU,
    HostFacts,
    parse_container_inspect,
    parse_nofile,
    parse_nvidia_smi,
    parse_runtimes,
)
from bootstrap.cluster.preflight.checks import check_preflight
from bootstrap.errors import PreflightFailed

DATA = Path(__file__).resolve().parents[1] / "data"


def test_container_inspect():
    st = parse_container_inspect((DATA / "docker_container_inspect.json").read_text())
    assert st.status == "running" and st.running
    assert st.labels["x"] == "y" and st.labels["bootstrap.sandbox"] == "1"  # container + image labels
    assert st.image_id.startswith("sha256:")
    assert parse_container_inspect("[]") is None
    assert parse_container_inspect("Error: No such container: x") is None


def test_runtimes_and_nofile():
    assert parse_runtimes((DATA / "docker_runtimes.json").read_text()) == (
        "io.containerd.runc.v2", "io.containerd.runtime.v1.linux", "runc")
    assert parse_nofile("20000\n") == 20000
    assert parse_nofile("unlimited") > 1 << 20
    assert parse_nofile("") is None


def test_nvidia_smi_csv():
    gpus = parse_nvidia_smi((DATA / "nvidia_smi_h100x8.csv").read_text())
    assert len(gpus) == 8
    assert gpus[0] == GPU("NVIDIA H100 80GB HBM3", 81559, "550.54.15")


def test_preflight_gpu_count_and_runtime():
    gpus = parse_nvidia_smi((DATA / "nvidia_smi_h100x8.csv").read_text())
    ok = HostFacts("24.0", runtimes=("nvidia", "runc"), gpus=gpus)
    check_preflight("gpu-a", ok, want_gpus=8)
    with pytest.raises(PreflightFailed, match="gpu-a: nvidia-smi shows 8 GPU\\(s\\), the inventory expects 4"):
        check_preflight("gpu-a", ok, want_gpus=4)
    with pytest.raises(PreflightFailed, match="no NVIDIA runtime.*nvidia-ctk"):
        check_preflight("gpu-a", HostFacts("24.0", runtimes=("runc",), gpus=gpus), want_gpus=8)
    check_preflight("cpu", HostFacts("20.10"), want_gpus=None)


def test_docker_info_and_inspect_both():
    from bootstrap.cluster.facts import parse_docker_info, parse_inspect_both
    info = '20.10.24 {"nvidia":{"path":"x"},"runc":{"path":"runc"}}\n'
    assert parse_docker_info(info) == ("20.10.24", ("nvidia", "runc"))
    assert parse_docker_info("") == ("", ())
    img = "reg:5000/vllm:v1"
    c = ('{"Name": "/bootstrap-vllm", "Image": "sha256:aa", "State": {"Status": "running"}, '
         '"Config": {"Labels": {"k": "v"}}}')
    i = '{"Id": "sha256:bb", "RepoTags": ["reg:5000/vllm:v1"], "RepoDigests": []}'
    got = parse_inspect_both(c + "\n" + i + "\n", "bootstrap-vllm", img)
    assert got[0].status == "running" and got[0].labels == {"k": "v"} and got[1] == "sha256:bb"
    assert parse_inspect_both(i + "\n", "bootstrap-vllm", img) == (None, "sha256:bb")
    assert parse_inspect_both(c + "\n", "bootstrap-vllm", img)[1] is None
    assert parse_inspect_both("", "bootstrap-vllm", img) == (None, None)
    # an image named like the container, or a reference the tags do not show: ask separately
    other = '{"Id": "sha256:cc", "RepoTags": ["bootstrap-vllm:latest"]}'
    assert parse_inspect_both(other + "\n" + i + "\n", "bootstrap-vllm", img) is None
    assert parse_inspect_both(i + "\n", "bootstrap-vllm", "docker.io/reg:5000/vllm:v1") is None
    assert parse_inspect_both('{"Id": "sha256:dd", "RepoTags": ["vllm:latest"]}', "c", "vllm") == (None, "sha256:dd")
