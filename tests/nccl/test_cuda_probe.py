"""check-nccl's CUDA probe (checks/cuda_probe.py) and what the controller makes of it
(bootstrap.cluster.cuda.parse_probe, bootstrap.nccl.run.cuda_findings), on lines recorded on a real H200
(tests/data/gpu/h200-cuda-probe.txt) and on the probe run here."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bootstrap.cluster.cuda import parse_probe as parse_cuda_probe
from bootstrap.nccl.run import cuda_findings

ROOT = Path(__file__).resolve().parents[2]
H200 = (ROOT / "tests" / "data" / "gpu" / "h200-cuda-probe.txt").read_text()


def _probe_lines() -> list[str]:
    return [ln for ln in H200.splitlines() if ln.startswith("{")]


def test_the_recorded_h200_lines_parse_to_one_device_then_none_with_torchs_reason():
    docs = [parse_cuda_probe(ln) for ln in _probe_lines()]
    assert [d["devices"] for d in docs] == [1, 0, 1, 0]
    assert docs[1]["error"] == "RuntimeError: No CUDA GPUs are available"
    assert docs[0]["cuda"] == "13.0" and docs[0]["error"] is None


def test_a_node_whose_cuda_sees_fewer_gpus_than_listed_is_named_with_torchs_words():
    visible, hidden = (parse_cuda_probe(ln) for ln in _probe_lines()[:2])
    found = cuda_findings({"gpu-a": visible, "gpu-b": hidden}, 1)
    assert [f.host for f in found] == ["gpu-b"]
    f = found[0]
    assert f.severity == "error" and f.id == "cuda-unusable"
    assert "sees 0 of the 1 GPU(s) nvidia-smi lists" in f.title
    assert "No CUDA GPUs are available" in f.evidence and "CUDA 13.0" in f.evidence
    assert "--backend gloo" in f.fix


def test_a_cluster_of_eight_gpu_nodes_with_one_gpu_each_is_short_everywhere():
    visible = parse_cuda_probe(_probe_lines()[0])
    assert [f.host for f in cuda_findings({"a": visible, "b": visible}, 8)] == ["a", "b"]
    assert cuda_findings({"a": visible}, 1) == []


def test_no_answer_from_the_probe_is_a_finding_not_a_pass():
    assert parse_cuda_probe("bash: python3: not found\n") is None
    (f,) = cuda_findings({"a": None}, 8)
    assert f.host == "a" and f.severity == "error"


def test_the_probe_on_this_machine_prints_one_line_naming_a_cpu_build_or_its_devices():
    r = subprocess.run([sys.executable, "-"], input=(ROOT / "checks" / "cuda_probe.py").read_text(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(doc) == {"torch", "cuda", "devices", "visible", "error"}
    # this machine has no GPU: torch is absent (an error names it) or a CPU build that says so
    assert doc["devices"] == 0 and doc["error"]
    (f,) = cuda_findings({"here": parse_cuda_probe(r.stdout)}, 2)
    assert "sees 0 of the 2 GPU(s)" in f.title


def test_cuda_errors_802_803_804_name_their_cause_and_fix():
    """What torch says when CUDA cannot initialise (its words, as issues on real hosts quote them: 802 on
    H200s whose Fabric Manager never completed, github.com/huggingface/huggingface_hub/issues/4134)."""
    said = {
        "802": "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
               "calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized",
        "803": "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
               "calling NumCudaDevices() that might have already set an error? Error 803: system has unsupported "
               "display driver / cuda driver combination",
        "804": "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
               "calling NumCudaDevices() that might have already set an error? Error 804: forward compatibility "
               "was attempted on non supported HW",
    }
    want = {"802": ("Fabric Manager", "nvidia-fabricmanager"), "803": ("kernel module", "reboot"),
            "804": ("newer than the driver", "upgrade the host's driver")}
    for code, error in said.items():
        doc = {"torch": "2.11.0+cu130", "cuda": "13.0", "devices": 0, "visible": "all", "error": error}
        (f,) = cuda_findings({"gpu-a": doc}, 8)
        assert f"CUDA error {code}" in f.title and want[code][0] in f.title, f.title
        assert want[code][1] in f.fix and "--backend gloo" not in f.fix, f.fix
        assert error in f.evidence
