"""Shared by several test modules (moved from tests/test_serveplan.py)."""


GB = 10**9


# The config.json of meta-llama/Llama-3.1-{8B,70B,405B} as published on Hugging Face
# (https://huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json and the 70B/405B
# siblings). The 8B dict is the file verbatim, as NVIDIA/TensorRT-LLM's unit tests also copy it
# (LLAMA_3_1_8B_CONFIG); the 70B and 405B files differ from it only in the size fields below,
# whose values match every public copy found (e.g. oumi's configs/recipes/llama3_1/README.md).
_LLAMA_31_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "model_type": "llama",
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0",
    "use_cache": True,
    "vocab_size": 128256,
}


LLAMA_31_8B = {**_LLAMA_31_COMMON, "hidden_size": 4096, "intermediate_size": 14336,
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8}


LLAMA_31_70B = {**_LLAMA_31_COMMON, "hidden_size": 8192, "intermediate_size": 28672,
                "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8}


LLAMA_31_405B = {**_LLAMA_31_COMMON, "hidden_size": 16384, "intermediate_size": 53248,
                 "num_attention_heads": 128, "num_hidden_layers": 126, "num_key_value_heads": 8}


# mistralai/Mixtral-8x7B-v0.1 config.json size fields (46.7B parameters per its model card).
MIXTRAL_8X7B = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
                "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": False,
                "torch_dtype": "bfloat16"}


H100 = 80 * GB


A10 = 24 * GB
#: Qwen/Qwen3-30B-A3B's config.json (the fields the planner reads): 128 routed experts, no shared one.
QWEN3_30B_A3B = {"hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48,
                 "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16"}
