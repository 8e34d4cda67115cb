"""Expert parallel (bootstrap/serve/experts.py): the layout, the all-to-all backend from the image's
vLLM and the hardware, the refusals, and each node's argv. Pure; the sandbox shows the plan on its
GPU-shaped nodes (tests/sandbox/test_sandbox_checks.py)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.errors import ModelSplitError, ServePlanError
from bootstrap.serve import experts as EX
from bootstrap.serve.argv import native_serve_argvs
from bootstrap.serve.flags import check_extra
from bootstrap.serve.sizing import expert_fraction
from bootstrap.serve.split import model_shape
from tests.support.model_configs import LLAMA_31_8B, MIXTRAL_8X7B, QWEN3_30B_A3B

QWEN = model_shape(QWEN3_30B_A3B)
#: vLLM 0.32's list (vllm/config/parallel.py), an image with DeepEP
FULL = EX.EngineCaps("0.32.0", ("naive", "pplx", "deepep_high_throughput", "deepep_low_latency", "mori",
                                "allgather_reducescatter", "flashinfer_all2allv"),
                     frozenset({"deep_ep", "flashinfer"}), True)
PLAIN = EX.EngineCaps("0.32.0", FULL.all2all, frozenset(), True)
H100 = 80 * (1 << 30)


def ep(shape=QWEN, nodes=2, gpus=8, caps=FULL, rdma=True, forced=False, **kw):
    return EX.plan_experts(shape, nodes, gpus, accelerator=kw.pop("accelerator", "gpu"), caps=caps, rdma=rdma,
                           forced=forced, **kw)


def test_a_moe_model_on_two_8_gpu_nodes_with_rdma_and_deepep_is_dp16_tp1_ep16_over_deepep_low_latency():
    split, fit, why = ep(weight_bytes=61_000_000_000, expert_fraction=expert_fraction(QWEN3_30B_A3B),
                         gpu_mem_bytes=H100)
    assert why is None and fit is not None and fit.fits
    p = split.par
    assert (p.dp, p.tp, p.pp, p.ep, p.ep_size) == (16, 1, 1, True, 16)
    assert split.all2all == "deepep_low_latency"
    assert split.reason.startswith("DP=16 x TP=1, EP=16: a mixture-of-experts model (128 experts): 16 engines "
                                   "(8 per node) share the experts over all 16 GPUs; all-to-all deepep_low_latency")
    argvs = native_serve_argvs("/m", p, ["10.0.0.1", "10.0.0.2"], port=8000, host="10.0.0.1", master_port=29555,
                               all2all=split.all2all, extra=("--max-model-len", "4096"))
    for a in argvs:
        s = " ".join(a)
        assert "--data-parallel-size 16 --data-parallel-size-local 8 --data-parallel-address 10.0.0.1" in s
        assert "--enable-expert-parallel --all2all-backend deepep_low_latency --max-model-len 4096" in s
        assert "--tensor-parallel-size 1" in s
    assert "--headless" not in argvs[0]
    assert " ".join(argvs[1]).count("--headless --data-parallel-start-rank 8") == 1


def test_without_rdma_or_deepep_the_experts_go_over_nccl_and_the_plan_says_why():
    split, _, _ = ep(rdma=False)
    assert split.all2all == "allgather_reducescatter" and "cluster.infiniband: true" in split.reason
    split, _, _ = ep(caps=PLAIN)
    assert split.all2all == "allgather_reducescatter" and "needs the deep_ep module" in split.reason
    split, _, _ = ep(nodes=1)  # within one node: vLLM's default
    assert (split.par.dp, split.all2all) == (8, "allgather_reducescatter") and "within one node" in split.reason


def test_a_requested_backend_is_checked_against_the_image_and_the_hardware():
    assert ep(all2all="deepep_high_throughput")[0].all2all == "deepep_high_throughput"
    for name, rdma, caps, why in [
        ("deepep_low_latency", False, FULL, "needs RDMA between them"),
        ("deepep_low_latency", True, PLAIN, "needs the deep_ep module"),
        ("nixl_ep", True, FULL, "has no all-to-all backend 'nixl_ep' (it has: naive, pplx,"),
        ("mori", True, FULL, "MoRI is AMD ROCm's"),
        ("flashinfer_all2allv", True, FULL, "needs NVLink between the nodes"),
    ]:
        with pytest.raises(ModelSplitError, match=f"^--all2all {name}: .*{re.escape(why)}"):
            ep(all2all=name, rdma=rdma, caps=caps, forced=True)
    assert ep(nodes=1, all2all="flashinfer_all2allv", forced=True)[0].all2all == "flashinfer_all2allv"


def test_when_the_images_list_cannot_be_read_vllms_default_is_left_alone():
    unknown = EX.EngineCaps()
    split, _, _ = ep(caps=unknown)
    assert split.all2all is None and "could not be read" in split.reason
    argv = native_serve_argvs("/m", split.par, ["10.0.0.1", "10.0.0.2"], port=8000, host="10.0.0.1",
                              master_port=29555, all2all=None)[0]
    assert "--enable-expert-parallel" in argv and "--all2all-backend" not in argv
    with pytest.raises(ModelSplitError, match="could not read which all-to-all backends"):
        ep(caps=unknown, all2all="allgather_reducescatter", forced=True)


def test_the_smallest_tp_whose_ranks_hold_their_share_is_taken():
    frac = expert_fraction(QWEN3_30B_A3B)
    assert 0.9 < frac < 0.97  # attention and embeddings are the rest
    assert expert_fraction(LLAMA_31_8B) is None
    # 8 GB GPUs: TP=1 needs 3 GB of attention + 3.6 GB of experts + 20% > 7.2 GB usable; TP=2 halves the attention
    split, fit, _ = ep(weight_bytes=61_000_000_000, expert_fraction=frac, gpu_mem_bytes=8 * 10**9)
    assert (split.par.tp, split.par.dp) == (2, 8) and fit.fits
    with pytest.raises(ModelSplitError, match="^--ep: no expert parallel layout fits: TP=1: .*do not fit"):
        ep(weight_bytes=61_000_000_000, expert_fraction=frac, gpu_mem_bytes=2 * 10**9, forced=True)
    assert ep(tp=4)[0].par.dp == 4


@pytest.mark.parametrize("kw, why", [
    ({"accelerator": "none", "gpus": 1}, "vLLM-CPU runs no expert parallel"),
    ({"shape": model_shape(LLAMA_31_8B)}, "the model has no experts"),
    ({"shape": model_shape(None)}, "config.json could not be read"),
    ({"shape": model_shape(MIXTRAL_8X7B)}, "8 experts cannot spread over EP=16 ranks"),
    ({"nodes": 1, "gpus": 1}, "one GPU"),
    ({"tp": 3}, "TP=3 does not divide the 8 GPUs"),
    ({"dp": 4, "tp": 2}, "must use all 16 GPUs"),
])
def test_what_stops_expert_parallel_is_refused_with_ep_and_said_without(kw, why):
    with pytest.raises(ModelSplitError, match=f"^--ep: .*{re.escape(why)}"):
        ep(forced=True, **kw)
    split, _, reason = ep(forced=False, **kw)
    assert split is None and why in reason


def test_the_ep_flags_belong_to_the_plan():
    for flag, use in [("--enable-expert-parallel", "--ep"), ("-ep", "--ep"), ("--all2all-backend=naive", "--all2all")]:
        with pytest.raises(ServePlanError, match=f"use {use}"):
            check_extra((flag,))


def test_engine_caps_tolerate_any_document():
    assert EX.EngineCaps.from_doc(None) == EX.EngineCaps()
    got = EX.EngineCaps.from_doc({"version": 3, "all2all": ["naive", 1], "modules": ["deep_ep", "evil"],
                                  "nixl_connector": "yes"})
    assert got == EX.EngineCaps(None, ("naive",), frozenset({"deep_ep"}), None)


def test_the_image_probe_reads_the_backends_without_importing_vllm(tmp_path):
    """checks/model_info.py on a fake vLLM tree: the Literal parsed, the connector's registration found, the
    version from the dist-info, and vLLM never imported (its __init__ raises)."""
    pkg = tmp_path / "vllm"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    (pkg / "config" / "parallel.py").write_text(
        "from typing import Literal\nAll2AllBackend = Literal[\n    'naive',\n    'deepep_low_latency',\n]\n")
    conn = pkg / "distributed" / "kv_transfer" / "kv_connector"
    conn.mkdir(parents=True)
    (conn / "factory.py").write_text('KVConnectorFactory.register_connector(\n    "NixlConnector",\n    '
                                     '"vllm.distributed.kv_transfer.kv_connector.v1.nixl",\n    "NixlConnector",\n)\n')
    dist = tmp_path / "vllm-0.32.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0\n")
    probe = Path(__file__).resolve().parents[2] / "checks" / "model_info.py"
    r = subprocess.run([sys.executable, "-", "/nonexistent"], input=probe.read_text(), capture_output=True,
                       text=True, timeout=30, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])["engine"]
    assert got["version"] == "0.32.0" and got["all2all"] == ["naive", "deepep_low_latency"], got
    assert got["nixl_connector"] is True
