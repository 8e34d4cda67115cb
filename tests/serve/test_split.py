"""The parallelism planner that knows the model: config.json in, TP x PP and the reason out.

Configs are the size fields of the models' published config.json files (Hugging Face): the ones
that limit a split. Each case states the exact split and the exact one-line reason.
"""
import pytest

from bootstrap.errors import ModelSplitError, UsageError
from bootstrap.serve.split import ModelShape, Parallelism, choose_split, model_shape, split_problems
from tests.support.model_configs import LLAMA_31_8B, LLAMA_31_70B, LLAMA_31_405B, MIXTRAL_8X7B

# Qwen/Qwen2.5-14B config.json (40 query heads, 8 KV heads: GQA, per its model card).
QWEN25_14B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120, "intermediate_size": 13824,
              "num_attention_heads": 40, "num_hidden_layers": 48, "num_key_value_heads": 8,
              "vocab_size": 152064, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
# Qwen/Qwen2.5-0.5B config.json: 14 heads, the common real case that 8 GPUs cannot split.
QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
              "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
              "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": True}
# deepseek-ai/DeepSeek-V3 config.json: MLA (128 KV heads), 256 routed experts, 61 layers.
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
               "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
               "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "vocab_size": 129280}
# The sandbox's tiny model (bootstrap/sandbox/make_tiny_model.py).
TINY = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 512}
# A multimodal config: the language model's shape is under text_config.
LLAVA_LIKE = {"architectures": ["LlavaForConditionalGeneration"], "vision_config": {"num_attention_heads": 16},
              "text_config": {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                              "num_hidden_layers": 32, "num_key_value_heads": 32, "vocab_size": 32064}}

DEFAULT_GPU = "TP = GPUs per node, PP = nodes (vLLM's default layout)"

# (model, nodes, gpus per node, accelerator) -> (TP, PP, reason)
CASES = [
    # 1 x 8 GPUs
    (LLAMA_31_8B, 1, 8, "gpu", 8, 1, f"TP=8 PP=1: {DEFAULT_GPU}"),
    (LLAMA_31_70B, 1, 8, "gpu", 8, 1, f"TP=8 PP=1: {DEFAULT_GPU}"),
    (QWEN25_14B, 1, 8, "gpu", 8, 1, f"TP=8 PP=1: {DEFAULT_GPU}"),
    (MIXTRAL_8X7B, 1, 8, "gpu", 8, 1, f"TP=8 PP=1: {DEFAULT_GPU}"),
    (DEEPSEEK_V3, 1, 8, "gpu", 8, 1, f"TP=8 PP=1: {DEFAULT_GPU}"),
    (QWEN25_05B, 1, 8, "gpu", 2, 4, "TP=2 PP=4: 14 attention heads do not divide by 8 GPUs per node"),
    (TINY, 1, 8, "gpu", 4, 2, "TP=4 PP=2: 4 attention heads do not divide by 8 GPUs per node"),
    # 2 x 8
    (LLAMA_31_405B, 2, 8, "gpu", 8, 2, f"TP=8 PP=2: {DEFAULT_GPU}"),
    (LLAMA_31_70B, 2, 8, "gpu", 8, 2, f"TP=8 PP=2: {DEFAULT_GPU}"),
    (DEEPSEEK_V3, 2, 8, "gpu", 8, 2, f"TP=8 PP=2: {DEFAULT_GPU}"),
    (QWEN25_05B, 2, 8, "gpu", 2, 8, "TP=2 PP=8: 14 attention heads do not divide by 8 GPUs per node"),
    # 3 x 8
    (LLAMA_31_405B, 3, 8, "gpu", 8, 3, f"TP=8 PP=3: {DEFAULT_GPU}"),
    (QWEN25_14B, 3, 8, "gpu", 8, 3, f"TP=8 PP=3: {DEFAULT_GPU}"),
    (MIXTRAL_8X7B, 3, 8, "gpu", 8, 3, f"TP=8 PP=3: {DEFAULT_GPU}"),
    (QWEN25_05B, 3, 8, "gpu", 2, 12, "TP=2 PP=12: 14 attention heads do not divide by 8 GPUs per node"),
    # 4 x 4
    (LLAMA_31_70B, 4, 4, "gpu", 4, 4, f"TP=4 PP=4: {DEFAULT_GPU}"),
    (QWEN25_14B, 4, 4, "gpu", 4, 4, f"TP=4 PP=4: {DEFAULT_GPU}"),
    (DEEPSEEK_V3, 4, 4, "gpu", 4, 4, f"TP=4 PP=4: {DEFAULT_GPU}"),
    (QWEN25_05B, 4, 4, "gpu", 2, 8, "TP=2 PP=8: 14 attention heads do not divide by 4 GPUs per node"),
    # CPU clusters: one worker per node, TP across the nodes first
    (TINY, 3, 0, "none", 1, 3, "TP=1 PP=3: 4 attention heads do not divide by 3 nodes"),
    (LLAMA_31_8B, 3, 0, "none", 1, 3, "TP=1 PP=3: 32 attention heads do not divide by 3 nodes"),
    (QWEN25_14B, 3, 0, "none", 1, 3, "TP=1 PP=3: 40 attention heads do not divide by 3 nodes"),
    (DEEPSEEK_V3, 3, 0, "none", 1, 3, "TP=1 PP=3: 128 attention heads do not divide by 3 nodes"),
    (TINY, 4, 0, "none", 4, 1, "TP=4 PP=1: tensor parallel across the 4 nodes (one CPU worker each)"),
    (LLAMA_31_8B, 4, 0, "none", 4, 1, "TP=4 PP=1: tensor parallel across the 4 nodes (one CPU worker each)"),
    (MIXTRAL_8X7B, 4, 0, "none", 4, 1, "TP=4 PP=1: tensor parallel across the 4 nodes (one CPU worker each)"),
    (QWEN25_05B, 4, 0, "none", 2, 2, "TP=2 PP=2: 14 attention heads do not divide by 4 nodes"),
    (TINY, 8, 0, "none", 4, 2, "TP=4 PP=2: 4 attention heads do not divide by 8 nodes"),
    (TINY, 1, 0, "none", 1, 1, "TP=1 PP=1: one node, one CPU worker"),
    (LLAVA_LIKE, 3, 0, "none", 1, 3, "TP=1 PP=3: 32 attention heads do not divide by 3 nodes"),
]


@pytest.mark.parametrize("config,nodes,gpus,acc,tp,pp,reason", CASES)
def test_default_split_and_reason(config, nodes, gpus, acc, tp, pp, reason):
    got = choose_split(model_shape(config), nodes, gpus, accelerator=acc)
    assert got.par == Parallelism(tp, pp, tp * pp)
    assert got.reason == reason
    assert got.default == ("default layout" in reason or "across the" in reason or "one CPU worker" in reason)
    assert not split_problems(model_shape(config), tp, pp)


def test_shape_reads_heads_kv_layers_hidden_vocab_experts():
    s = model_shape(DEEPSEEK_V3)
    assert s == ModelShape(heads=128, kv_heads=128, layers=61, hidden=7168, vocab=129280, intermediate=18432,
                           experts=256, moe_intermediate=2048)
    assert s.describe() == "128 attention heads, 61 layers, 256 experts"
    assert model_shape(MIXTRAL_8X7B).describe() == "32 attention heads, 8 KV heads, 32 layers, 8 experts"
    assert model_shape(LLAVA_LIKE).heads == 32  # text_config of a multimodal model
    assert model_shape({}) == ModelShape() and not ModelShape().known
    # junk values limit nothing instead of crashing
    assert model_shape({"num_attention_heads": "32", "num_hidden_layers": True}) == ModelShape()


def test_kv_heads_fewer_than_tp_are_replicated_but_must_divide_it():
    gqa2 = model_shape(QWEN25_05B)  # 14 heads, 2 KV heads
    assert split_problems(gqa2, 2, 1) == []
    odd = ModelShape(heads=12, kv_heads=4, layers=8)
    assert split_problems(odd, 12, 1) == []  # 12 % 4 == 0: each KV head replicated 3 times
    assert split_problems(odd, 6, 1) == ["4 KV heads and TP=6 do not divide one another"]


def test_no_config_takes_the_cluster_default():
    got = choose_split(None, 3, 0, accelerator="none")
    assert got.par == Parallelism(3, 1, 3) and got.default
    assert choose_split(None, 2, 8, accelerator="gpu").par == Parallelism(8, 2, 16)


def test_explicit_split_the_model_cannot_take_is_refused_with_its_numbers():
    with pytest.raises(ModelSplitError) as e:
        choose_split(model_shape(TINY), 3, 0, accelerator="none", tp=3, pp=1)
    assert str(e.value) == ("TP=3 PP=1 does not fit the model (4 attention heads, 4 layers): 4 attention heads "
                            "do not divide by TP=3; this cluster can serve it with TP=1 PP=3 (drop --tp/--pp to "
                            "take it)")
    assert isinstance(e.value, UsageError)  # exit 2
    with pytest.raises(ModelSplitError, match="4 layers cannot fill PP=8 pipeline stages"):
        choose_split(model_shape(TINY), 8, 0, accelerator="none", tp=1, pp=8)
    with pytest.raises(ModelSplitError, match="14 attention heads do not divide by TP=8.*TP=2 PP=4"):
        choose_split(model_shape(QWEN25_05B), 1, 8, accelerator="gpu", tp=8)


def test_explicit_split_the_model_takes_is_kept():
    got = choose_split(model_shape(LLAMA_31_70B), 2, 8, accelerator="gpu", tp=16)
    assert got.par == Parallelism(16, 1, 16) and got.reason == "TP=16 PP=1: as given by --tp/--pp"
    got = choose_split(model_shape(TINY), 3, 0, accelerator="none", pp=3)
    assert got.par == Parallelism(1, 3, 3)


def test_nothing_fits():
    prime = ModelShape(heads=7, kv_heads=7, layers=2)
    with pytest.raises(ModelSplitError) as e:
        choose_split(prime, 4, 0, accelerator="none")
    assert str(e.value) == ("no split of 4 CPU workers fits the model (7 attention heads, 2 layers): "
                            "7 attention heads do not divide by 4 nodes")


@pytest.mark.parametrize("extra", [["--enforce-eager"], ["--max-model-len", "256", "-O0"], ["-O", "0"]])
def test_eager_mode_with_pipeline_stages_on_cpu_is_refused(extra):
    from bootstrap.serve.flags import check_engine_flags

    with pytest.raises(ModelSplitError) as e:
        check_engine_flags("none", Parallelism(1, 3, 3), extra)
    assert "with PP=3 on a CPU cluster" in str(e.value) and "pick a split with PP=1" in str(e.value)
    check_engine_flags("none", Parallelism(3, 1, 3), extra)  # TP only: fine
    check_engine_flags("gpu", Parallelism(8, 2, 16), extra)  # GPU workers warm up regardless
    check_engine_flags("none", Parallelism(1, 3, 3), ["--max-model-len", "256", "-O", "3"])
