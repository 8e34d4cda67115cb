"""The pure serve plan: parallelism, vllm argv, fit, model manifests, KV capacity from logs."""
import pytest

from bootstrap.errors import BootstrapError, ServePlanError, UsageError
from bootstrap.serve.argv import native_serve_argvs, ray_serve_argv
from bootstrap.serve.kvlog import kv_capacity
from bootstrap.serve.manifest import ManifestDiff, compare_manifests, describe, model_manifest
from bootstrap.serve.sizing import (
    Fit,
    ModelSize,
    dtype_of,
    fit,
    kv_cache_bytes,
    model_size_from_config,
    params_from_name,
)
from bootstrap.serve.split import Parallelism, model_shape, parallelism, split_problems

# ------------------------------------------------------------------------------ parallelism
from tests.support.model_configs import (
    A10,
    GB,
    H100,
    LLAMA_31_8B,
    LLAMA_31_70B,
    LLAMA_31_405B,
    MIXTRAL_8X7B,
)


def test_defaults_tp_per_node_pp_nodes():
    assert parallelism(2, 8, None, None, accelerator="gpu") == Parallelism(8, 2, 16)
    assert parallelism(1, 4, None, None, accelerator="gpu") == Parallelism(4, 1, 4)


def test_one_side_given_derives_the_other():
    assert parallelism(2, 8, 16, None, accelerator="gpu") == Parallelism(16, 1, 16)
    assert parallelism(2, 8, None, 4, accelerator="gpu") == Parallelism(4, 4, 16)


def test_cpu_cluster_defaults_to_tp_across_nodes():
    assert parallelism(3, 0, None, None, accelerator="none") == Parallelism(3, 1, 3)
    assert parallelism(3, 0, 2, None, accelerator="none") == Parallelism(2, 1, 2)


def test_cpu_cluster_cannot_exceed_its_nodes():
    with pytest.raises(ServePlanError) as e:
        parallelism(2, 0, 4, None, accelerator="none")
    assert "TP 4 x PP 1 = 4 workers" in str(e.value) and "TP=2 PP=1" in str(e.value)


def test_mismatch_names_numbers_and_the_alternative():
    with pytest.raises(ServePlanError) as e:
        parallelism(2, 8, 4, 3, accelerator="gpu")
    msg = str(e.value)
    assert msg == ("TP 4 x PP 3 = 12 GPUs, but the cluster has 2 node(s) x 8 GPUs = 16; TP x PP "
                   "must use every GPU: TP=8 PP=2 (TP = GPUs per node, PP = nodes) or TP=16 PP=1 "
                   "(tensor parallel across all GPUs)")
    assert "\n" not in msg
    assert isinstance(e.value, UsageError) and isinstance(e.value, BootstrapError)


def test_tp_that_does_not_divide_the_gpus():
    with pytest.raises(ServePlanError, match="TP 3 does not divide the GPUs"):
        parallelism(2, 8, 3, None, accelerator="gpu")


@pytest.mark.parametrize("args", [(0, 8, None, None), (2, 0, None, None), (2, 8, 0, None), (2, 8, None, -1)])
def test_nonsense_shapes(args):
    with pytest.raises(ServePlanError):
        parallelism(*args, accelerator="gpu")


def test_model_split_checks_heads_and_layers():
    assert split_problems(model_shape(LLAMA_31_70B), 8, 2) == []
    assert "64 attention heads do not divide by TP=3" in split_problems(model_shape(LLAMA_31_70B), 3, 1)
    assert "32 layers cannot fill PP=64 pipeline stages" in split_problems(model_shape(LLAMA_31_8B), 1, 64)


# ------------------------------------------------------------------------------ argv

def test_ray_argv_exact():
    argv = ray_serve_argv("meta-llama/Llama-3.1-405B-Instruct", Parallelism(8, 2, 16), port=8000,
                          host="0.0.0.0", served_name="llama", extra=("--max-model-len", "8192"))
    assert argv == ("vllm", "serve", "meta-llama/Llama-3.1-405B-Instruct",
                    "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2",
                    "--distributed-executor-backend", "ray", "--host", "0.0.0.0", "--port", "8000",
                    "--served-model-name", "llama", "--max-model-len", "8192")
    assert isinstance(argv, tuple)
    assert "--served-model-name" not in ray_serve_argv("m", Parallelism(1, 1, 1), port=1, host="h")


def test_native_argvs_exact():
    argvs = native_serve_argvs("/models/llama", Parallelism(8, 2, 16), ["10.0.0.1", "10.0.0.2"],
                               port=8000, host="0.0.0.0", master_port=29501, extra=("--enforce-eager",))
    common = ("vllm", "serve", "/models/llama", "--tensor-parallel-size", "8",
              "--pipeline-parallel-size", "2", "--distributed-executor-backend", "mp", "--nnodes", "2")
    assert argvs == [
        common + ("--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", "29501",
                  "--host", "0.0.0.0", "--port", "8000", "--enforce-eager"),
        common + ("--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29501",
                  "--headless", "--enforce-eager"),
    ]


def test_native_three_nodes_ranks_and_served_name_on_head_only():
    argvs = native_serve_argvs("m", Parallelism(2, 3, 6), ["a", "b", "c"], port=8000, host="h",
                               master_port=29501, served_name="x")
    assert [a[a.index("--node-rank") + 1] for a in argvs] == ["0", "1", "2"]
    assert ["--headless" in a for a in argvs] == [False, True, True]
    assert ["--served-model-name" in a for a in argvs] == [True, False, False]


def test_native_world_must_split_over_nodes():
    with pytest.raises(ServePlanError, match="do not split evenly over 3 nodes"):
        native_serve_argvs("m", Parallelism(8, 2, 16), ["a", "b", "c"], port=8000, host="h", master_port=29501)
    with pytest.raises(ServePlanError, match="distinct"):
        native_serve_argvs("m", Parallelism(1, 2, 2), ["a", "a"], port=8000, host="h", master_port=29501)


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "-tp", "--port=9000", "--pipeline_parallel_size"])
def test_extra_cannot_override_the_plan(flag):
    with pytest.raises(ServePlanError, match="set by the serve plan"):
        ray_serve_argv("m", Parallelism(1, 1, 1), port=8000, host="h", extra=(flag, "4"))


def test_native_owns_rendezvous_flags():
    with pytest.raises(ServePlanError, match="--headless is set by the serve plan"):
        native_serve_argvs("m", Parallelism(1, 1, 1), ["a"], port=8000, host="h", master_port=1,
                           extra=("--headless",))


def test_bad_port_and_model():
    with pytest.raises(ServePlanError, match="port"):
        ray_serve_argv("m", Parallelism(1, 1, 1), port=70000, host="h")
    with pytest.raises(ServePlanError, match="no model"):
        ray_serve_argv(" ", Parallelism(1, 1, 1), port=8000, host="h")


# ------------------------------------------------------------------------------ model size

@pytest.mark.parametrize("config,expected", [(LLAMA_31_8B, 8.0e9), (LLAMA_31_70B, 70.6e9),
                                             (LLAMA_31_405B, 405.9e9), (MIXTRAL_8X7B, 46.7e9)])
def test_params_from_real_configs_within_2_percent(config, expected):
    size = model_size_from_config(config, None, None)
    assert abs(size.params - expected) / expected < 0.02
    assert size.source == "config" and size.dtype == "bf16" and size.bytes_per_param == 2
    assert size.weight_bytes == int(size.params * 2)


def test_params_from_name():
    assert params_from_name("Llama-3.1-405B-Instruct") == 405e9
    assert params_from_name("meta-llama/Llama-3.3-70B-Instruct") == 70e9
    assert params_from_name("facebook/opt-125m") == 125e6
    assert params_from_name("Qwen/Qwen3-30B-A3B") == 30e9
    assert params_from_name("Qwen2.5-0.5B-Instruct") == 0.5e9
    assert params_from_name("mistralai/Mixtral-8x7B-v0.1") == 56e9
    with pytest.raises(ServePlanError, match="cannot tell the size"):
        params_from_name("gpt2")


def test_size_sources_in_order():
    index = {"metadata": {"total_size": 16060522496}, "weight_map": {}}  # Llama-3.1-8B's index
    files = {"model-00001-of-00002.safetensors": 10 * GB, "model-00002-of-00002.safetensors": 6 * GB,
             "original/consolidated.00.pth": 16 * GB, "config.json": 900}
    s = model_size_from_config(LLAMA_31_8B, index, files)
    assert (s.source, s.weight_bytes) == ("safetensors-index", 16060522496)
    s = model_size_from_config(LLAMA_31_8B, None, files)
    assert (s.source, s.weight_bytes) == ("files", 16 * GB)
    s = model_size_from_config({"torch_dtype": "bfloat16"}, None, {"pytorch_model.bin": 2 * GB})
    assert (s.source, s.weight_bytes, s.params) == ("files", 2 * GB, 1e9)
    s = model_size_from_config({}, None, None, name="Llama-3.1-405B-Instruct")
    assert (s.source, s.params, s.dtype, s.weight_bytes) == ("name", 405e9, "fp16", 810 * GB)
    with pytest.raises(ServePlanError, match="cannot size the model"):
        model_size_from_config({}, None, None)


def test_safetensors_preferred_over_bin():
    files = {"model.safetensors": 5 * GB, "pytorch_model.bin": 5 * GB}
    assert model_size_from_config(LLAMA_31_8B, None, files).weight_bytes == 5 * GB


def test_dtypes_and_quantization():
    assert dtype_of({"torch_dtype": "float32"}) == (2.0, "fp16")  # vLLM serves fp32 in 16 bits
    assert dtype_of({"torch_dtype": "float16"}) == (2.0, "fp16")
    assert dtype_of({"dtype": "bfloat16"}) == (2.0, "bf16")
    assert dtype_of({"torch_dtype": "float8_e4m3fn"}) == (1.0, "fp8")
    assert dtype_of({"torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}}) == (1.0, "fp8")
    assert dtype_of({"torch_dtype": "float16",
                     "quantization_config": {"quant_method": "awq", "bits": 4}}) == (0.5, "int4")
    assert dtype_of({"quantization_config": {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 4}}}}}) == (0.5, "int4")
    assert dtype_of({}) == (2.0, "fp16")
    fp32 = {**LLAMA_31_8B, "torch_dtype": "float32"}
    assert model_size_from_config(fp32, None, {"model.safetensors": 32 * GB}).weight_bytes == 16 * GB


def test_kv_cache_bytes_per_token():
    assert kv_cache_bytes(LLAMA_31_8B, 1) == 128 * 1024
    assert kv_cache_bytes(LLAMA_31_8B, 1, kv_bytes=1) == 64 * 1024


# ------------------------------------------------------------------------------ fit

def test_405b_bf16_does_not_fit_one_h100_node_and_needs_two():
    size = model_size_from_config(LLAMA_31_405B, None, None)
    f = fit(size.weight_bytes, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=1, label=size.label)
    assert not f.fits and f.nodes_needed == 2
    assert f.have_bytes == 576 * GB
    assert f.message.startswith("405.9B bf16 weights 812 GB + 20% = 974 GB do not fit 1 node of 8 x 80 GB")
    assert fit(size.weight_bytes, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=2).fits


def test_fit_message_exact():
    f = fit(810 * GB, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=1, label="405B bf16")
    assert f == Fit(False, 972 * GB, 576 * GB, 2,
                    "405B bf16 weights 810 GB + 20% = 972 GB do not fit 1 node of 8 x 80 GB "
                    "(576 GB usable); this model needs 2 nodes of this shape")


def test_70b_fp16_about_150gb_does_not_fit_one_a10_4_node_and_needs_two():
    # The OCI guide: Llama-3.3-70B-Instruct "requires roughly 150G of GPU memory when serving";
    # BM.GPU.A10.4 has 4 A10 GPUs of 24 GB. Its method: memory needed / memory per node, rounded up.
    size = model_size_from_config({**LLAMA_31_70B, "torch_dtype": "float16"}, None, None)
    assert size.dtype == "fp16"
    one = fit(size.weight_bytes, gpu_mem_bytes_per_gpu=A10, gpus_per_node=4, nodes=1)
    assert 140 * GB <= one.need_bytes <= 170 * GB  # "roughly 150G"
    assert not one.fits and one.nodes_needed == 2
    assert fit(size.weight_bytes, gpu_mem_bytes_per_gpu=A10, gpus_per_node=4, nodes=2).fits
    # The guide's own figure gives the same answer.
    assert fit(150 * GB, gpu_mem_bytes_per_gpu=A10, gpus_per_node=4, nodes=1, overhead_fraction=0).nodes_needed == 2


def test_8b_fits_one_h100_node():
    size = model_size_from_config(LLAMA_31_8B, None, None)
    f = fit(size.weight_bytes, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=1, label=size.label)
    assert f.fits and f.nodes_needed == 1
    assert f.message == "8B bf16 weights 16.1 GB + 20% = 19.3 GB fit 1 node of 8 x 80 GB (576 GB usable)"


def test_kv_minimum_is_added_and_shown():
    f = fit(16 * GB, gpu_mem_bytes_per_gpu=A10, gpus_per_node=1, nodes=1,
            kv_min_bytes=kv_cache_bytes(LLAMA_31_8B, 131072))
    assert not f.fits and "+ KV 17.2 GB" in f.message and f.nodes_needed == 2


def test_fit_rejects_nonsense():
    with pytest.raises(ServePlanError):
        fit(0, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=1)
    with pytest.raises(ServePlanError):
        fit(GB, gpu_mem_bytes_per_gpu=H100, gpus_per_node=0, nodes=1)
    with pytest.raises(ServePlanError):
        fit(GB, gpu_mem_bytes_per_gpu=H100, gpus_per_node=8, nodes=1, gpu_memory_utilization=1.5)


# ------------------------------------------------------------------------------ model sync

FIND = ("config.json\t877\n"
        "model-00001-of-00004.safetensors\t4976698672\n"
        "model-00002-of-00004.safetensors\t4999802720\n"
        "model-00003-of-00004.safetensors\t4915916176\n"
        "model-00004-of-00004.safetensors\t1168138808\n"
        "original/params.json\t199\n"
        "\n")


def test_manifest_parses_find_printf():
    m = model_manifest(FIND)
    assert m["model-00004-of-00004.safetensors"] == 1168138808
    assert m["original/params.json"] == 199 and len(m) == 6
    assert model_manifest("dir with\ttab/x\t5\n") == {"dir with\ttab/x": 5}
    assert model_manifest("") == {}
    with pytest.raises(ServePlanError, match="line 2"):
        model_manifest("a\t1\nbroken line\n")


def test_identical_manifests_have_no_diffs():
    m = model_manifest(FIND)
    assert compare_manifests({"node1": m, "node2": dict(m)}, "node1") == []
    assert describe([]) == "every host has the same model files"


def test_diffs_name_hosts_and_files():
    ref = model_manifest(FIND)
    node2 = {k: v for k, v in ref.items() if not k.startswith(("model-00002", "model-00003", "model-00004"))}
    node2["config.json"] = 12
    node3 = {**ref, "model.safetensors.incomplete": 5}
    diffs = compare_manifests({"node1": ref, "node2": node2, "node3": node3}, "node1")
    assert diffs == [
        ManifestDiff("node2", ("model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                               "model-00004-of-00004.safetensors"), (), (("config.json", 877, 12),)),
        ManifestDiff("node3", (), ("model.safetensors.incomplete",), ()),
    ]
    assert diffs[0].incomplete and not diffs[1].incomplete
    assert describe(diffs) == (
        "node2: 3 files missing (model-00002-of-00004.safetensors, model-00003-of-00004.safetensors, "
        "model-00004-of-00004.safetensors), 1 size differs (config.json); "
        "node3: 1 extra file (model.safetensors.incomplete)")


def test_describe_truncates_long_lists():
    d = ManifestDiff("n", tuple(f"f{i}" for i in range(5)), (), ())
    assert describe([d]) == "n: 5 files missing (f0, f1, f2, ...)"


def test_unknown_reference_host():
    with pytest.raises(ServePlanError, match="reference host x"):
        compare_manifests({"a": {}}, "x")


# ------------------------------------------------------------------------------ KV capacity

# vLLM docs/serving/distributed_serving.md (V1, vllm/v1/core/kv_cache_utils.py), verbatim.
V1_LOG = ("INFO 07-23 13:56:04 [kv_cache_utils.py:775] GPU KV cache size: 643,232 tokens\n"
          "INFO 07-23 13:56:04 [kv_cache_utils.py:779] Maximum concurrency for 40,960 tokens per request: 15.70x\n")
# vLLM PR #12569 ("[V1][Log] Add max request concurrency log to V1"), its log, verbatim: early V1
# logged blocks ("# GPU blocks: %d") rather than tokens.
EARLY_V1_LOG = ("INFO 01-30 03:18:12 gpu_model_runner.py:848] Loading model weights took 67.7229 GB\n"
                "INFO 01-30 03:19:14 kv_cache_utils.py:395] # GPU blocks: 1381\n"
                "INFO 01-30 03:19:14 kv_cache_utils.py:398] Maximum concurrency for 2048 tokens per request: 10.79x\n")
# V0, vllm/executor/gpu_executor.py: logger.info("# GPU blocks: %d, # CPU blocks: %d", ...); this
# line is from a real vLLM 0.5 startup log quoted in public GitHub text (the code index holding it
# gives no repository), and the seed doc's "# GPU blocks: 790" is the same format.
V0_LOG = ("INFO 06-24 14:24:15 model_runner.py:160] Loading model weights took 7.9378 GB\n"
          "INFO 06-24 14:24:19 gpu_executor.py:83] # GPU blocks: 19000, # CPU blocks: 2730\n")
# V0 CPU backend, vllm/executor/cpu_executor.py: logger.info("# CPU blocks: %d", num_gpu_blocks)
# (on CPU the KV cache blocks live in host memory; this is its only KV line). Line built from
# that format string.
V0_CPU_LOG = "INFO 11-22 04:58:01 cpu_executor.py:186] # CPU blocks: 2730\n"


def test_kv_v1_tokens_and_concurrency():
    kv = kv_capacity(V1_LOG)
    assert (kv.tokens, kv.blocks, kv.block_size) == (643232, None, None)
    assert (kv.concurrency, kv.request_tokens) == (15.70, 40960)
    assert kv.source_line.endswith("GPU KV cache size: 643,232 tokens")


def test_kv_early_v1_blocks():
    kv = kv_capacity(EARLY_V1_LOG)
    assert (kv.tokens, kv.blocks, kv.block_size) == (1381 * 16, 1381, 16)
    assert (kv.concurrency, kv.request_tokens) == (10.79, 2048)
    # the two lines agree: 1381 blocks x 16 / 2048 tokens = 10.79x
    assert round(kv.tokens / kv.request_tokens, 2) == kv.concurrency


def test_kv_v0_gpu_blocks_not_swap_blocks():
    kv = kv_capacity(V0_LOG)
    assert (kv.tokens, kv.blocks) == (19000 * 16, 19000)
    assert kv_capacity(V0_LOG, block_size=32).tokens == 19000 * 32
    assert kv_capacity("INFO gpu_executor.py] # GPU blocks: 790, # CPU blocks: 512").tokens == 790 * 16
    assert kv_capacity("INFO executor_base.py] # cuda blocks: 7416, # CPU blocks: 2048").blocks == 7416


def test_kv_v0_cpu_backend():
    kv = kv_capacity(V0_CPU_LOG)
    assert (kv.tokens, kv.blocks) == (2730 * 16, 2730)


def test_kv_last_start_wins_and_prefixes_are_ignored():
    log = V0_LOG + "(EngineCore_DP0 pid=81) " + V1_LOG.splitlines()[0] + "\n"
    assert kv_capacity(log).tokens == 643232


def test_kv_absent():
    assert kv_capacity("INFO starting\nINFO Loading model weights took 1 GB\n") is None
    assert kv_capacity("") is None


def test_kv_concurrency_only():
    kv = kv_capacity("INFO x] Maximum concurrency for 8,192 tokens per request: 4.00x")
    assert (kv.tokens, kv.concurrency, kv.request_tokens) == (32768, 4.0, 8192)


def test_model_size_label():
    assert ModelSize(8.03e9, "bf16", 2, 1, "config").label == "8B bf16"
    assert ModelSize(1.5e9, "fp16", 2, 1, "config").label == "1.5B fp16"
    assert ModelSize(405.85e9, "bf16", 2, 1, "config").label == "405.9B bf16"
    assert ModelSize(405e9, "bf16", 2, 1, "name").label == "405B bf16"
    assert ModelSize(125e6, "fp16", 2, 1, "name").label == "125M fp16"
