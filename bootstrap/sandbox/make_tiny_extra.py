"""Make the sandbox's second tiny model (another architecture) and a LoRA adapter of the first.

Runs INSIDE the vLLM CPU image at build time, after make_tiny_model.py (whose tokenizer it reuses;
both files are in /recipe); nothing is downloaded:

    python make_tiny_extra.py qwen2 DIR          # a tiny Qwen2 model
    python make_tiny_extra.py lora BASE_DIR DIR  # a LoRA adapter of the Llama model in BASE_DIR

The Qwen2 model has 4 attention heads of 64 (2 key/value heads), 3 layers and another seed than
tiny-llama: another architecture, other weights, the same 512-token tokenizer. The adapter is rank
8 on q_proj and v_proj with random (seeded) A and B matrices, so that it changes the base model's
greedy output; it is written in PEFT's format without peft (vLLM reads the format itself).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from make_tiny_model import SEED, VOCAB_SIZE, build_tokenizer

#: the adapter's rank, scale and the projections it changes
LORA_RANK = 8
LORA_ALPHA = 16
LORA_TARGETS = ("q_proj", "v_proj")


def build_qwen2(out: Path) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(SEED + 1)
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, use_sliding_window=False, torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    print(f"tiny-qwen2: {sum(p.numel() for p in model.parameters())} parameters, saved to {out}")
    return 0


def build_lora(base: Path, out: Path) -> int:
    import torch
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    out_dim = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    gen = torch.Generator().manual_seed(SEED + 2)
    tensors = {}
    for i in range(layers):
        for t in LORA_TARGETS:
            key = f"base_model.model.model.layers.{i}.self_attn.{t}"
            tensors[f"{key}.lora_A.weight"] = (torch.randn(LORA_RANK, hidden, generator=gen) * 0.2).to(torch.bfloat16)
            tensors[f"{key}.lora_B.weight"] = (torch.randn(out_dim[t], LORA_RANK, generator=gen) * 0.2).to(
                torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base),
        "r": LORA_RANK, "lora_alpha": LORA_ALPHA, "lora_dropout": 0.0, "bias": "none",
        "target_modules": list(LORA_TARGETS), "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None}, indent=2))
    print(f"tiny-lora: rank {LORA_RANK} on {', '.join(LORA_TARGETS)} of {layers} layers, saved to {out}")
    return 0


def main(argv: list[str]) -> int:
    if argv[1:2] == ["qwen2"] and len(argv) == 3:
        return build_qwen2(Path(argv[2]))
    if argv[1:2] == ["lora"] and len(argv) == 4:
        return build_lora(Path(argv[2]), Path(argv[3]))
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
