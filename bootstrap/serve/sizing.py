"""Will the model fit: its weight bytes from config.json, the index or the files, and the nodes it needs; pure, no I/O.

* `model_size_from_config`: weight bytes as served, from the best source at hand.
* `fit`: the OCI multi-node guide's method (memory needed / memory per node, rounded up).
* `dtype_of`, `params_from_config`, `params_from_name`, `expert_fraction`, `kv_cache_bytes`.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from bootstrap.errors import ServePlanError

#: Fraction added to the weights for activations, CUDA graphs and KV cache headroom. 20% is the
#: 1.2 factor of the formula the OCI multi-node guide points to (substratus.ai: M = P x 4B /
#: (32 / Q) x 1.2), which gives 168 GB for a 70B model in 16 bits: the guide's "roughly 150G".
OVERHEAD_FRACTION = 0.2
#: vLLM's default `--gpu-memory-utilization` (EngineArgs / CacheConfig): the share of each GPU's
#: memory vLLM lets itself use; the rest is left to the CUDA context, NCCL and other processes.
GPU_MEMORY_UTILIZATION = 0.9
#: Extra KV cache bytes required beyond the overhead (default none: the 20% is the headroom, as in
#: the guide's formula). Pass kv_cache_bytes(config, max_model_len) to demand room for one
#: full-length request.
KV_MIN_BYTES = 0

#: Bytes per parameter by dtype name (config.json `torch_dtype`, or `dtype` in newer transformers).
_DTYPE_BYTES = {
    "float32": (4.0, "fp32"), "float": (4.0, "fp32"), "fp32": (4.0, "fp32"),
    "float16": (2.0, "fp16"), "half": (2.0, "fp16"), "fp16": (2.0, "fp16"),
    "bfloat16": (2.0, "bf16"), "bf16": (2.0, "bf16"),
    "float8": (1.0, "fp8"), "float8_e4m3fn": (1.0, "fp8"), "float8_e5m2": (1.0, "fp8"),
    "fp8": (1.0, "fp8"), "int8": (1.0, "int8"), "uint8": (1.0, "int8"), "int4": (0.5, "int4"),
}
#: When config.json says nothing: the OCI guide's assumption (trained in FP32, served in FP16).
_DEFAULT_DTYPE = (2.0, "fp16")


@dataclass(frozen=True)
class ModelSize:
    params: float
    #: short dtype name as served: bf16, fp16, fp8, int4 ...
    dtype: str
    bytes_per_param: float
    weight_bytes: int
    #: where the size came from: "safetensors-index", "files", "config" or "name".
    source: str

    @property
    def label(self) -> str:
        """'405.9B bf16', '8B bf16', '1.5B fp16', '125M fp16'."""
        return f"{_params_label(self.params)} {self.dtype}"


def _params_label(params: float) -> str:
    b = params / 1e9
    if b >= 1:
        return f"{b:.1f}".rstrip("0").rstrip(".") + "B"
    return f"{params / 1e6:.0f}M"

def _text_config(config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Multimodal configs keep the language model's shape under text_config."""
    config = config or {}
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        merged = dict(config["text_config"])
        for k in ("torch_dtype", "dtype", "quantization_config"):
            merged.setdefault(k, config.get(k))
        return merged
    return config


def dtype_of(config: Mapping[str, Any] | None) -> tuple[float, str]:
    """(bytes per parameter as served, short dtype name) from config.json.

    `quantization_config` wins over `torch_dtype` (a quantized checkpoint's torch_dtype is the
    dtype of its activations). FP32 checkpoints are served in 16 bits: vLLM's `--dtype auto`
    "will use FP16 precision for FP32 and FP16 models" (arg_utils.py).
    """
    cfg = _text_config(config)
    q = cfg.get("quantization_config")
    if isinstance(q, Mapping):
        got = _quant_bytes(q)
        if got is not None:
            return got
    raw = cfg.get("torch_dtype") or cfg.get("dtype")
    if isinstance(raw, str):
        name = raw.lower().removeprefix("torch.")
        if name in _DTYPE_BYTES:
            nbytes, short = _DTYPE_BYTES[name]
            return (2.0, "fp16") if nbytes == 4.0 else (nbytes, short)
    return _DEFAULT_DTYPE


def _quant_bytes(q: Mapping[str, Any]) -> tuple[float, str] | None:
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits", q.get("w_bit", q.get("weight_bits")))
    if q.get("load_in_4bit"):
        bits = 4
    elif q.get("load_in_8bit"):
        bits = 8
    if bits is None and method == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and weights.get("num_bits"):
                bits = weights["num_bits"]
                break
    if bits is None and method in ("mxfp4", "nvfp4", "modelopt_fp4"):
        bits = 4
    if "fp8" in method:  # fp8, fbgemm_fp8
        return (1.0, "fp8")
    if isinstance(bits, (int, float)) and bits > 0:
        return (bits / 8, f"int{int(bits)}")
    return None


def params_from_config(config: Mapping[str, Any]) -> float:
    """Parameter count of a decoder-only transformer from its config.json (Llama layout).

    Per layer: q and o projections h x h, k and v h x (kv_heads x head_dim), MLP 3 x h x
    intermediate (gate, up, down; times the experts for a mixture of experts, plus a router),
    two norms. Plus the embedding and, unless tied, the LM head. Raises if a dimension is missing.
    """
    cfg = _text_config(config)
    try:
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
        heads = int(cfg["num_attention_heads"])
    except (KeyError, TypeError, ValueError) as e:
        raise ServePlanError(f"config.json lacks {e} needed to count the parameters") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or h // heads)
    attn = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    if experts:
        expert_inter = int(cfg.get("moe_intermediate_size") or inter)
        shared = int(cfg.get("n_shared_experts") or 0)
        dense_layers = int(cfg.get("first_k_dense_replace") or 0)
        moe_layer = (experts + shared) * 3 * h * expert_inter + h * experts
        mlp_total = dense_layers * 3 * h * inter + (layers - dense_layers) * moe_layer
    else:
        mlp_total = layers * 3 * h * inter
    norms = layers * 2 * h + h
    embed = vocab * h * (1 if cfg.get("tie_word_embeddings") else 2)
    return float(layers * attn + mlp_total + norms + embed)


def expert_fraction(config: Mapping[str, Any] | None) -> float | None:
    """The share of a mixture-of-experts model's parameters in its routed experts (what expert
    parallel spreads over the ranks; attention, embeddings and shared experts stay whole on each
    engine); None for a dense model or a config that cannot be counted."""
    cfg = _text_config(config)
    experts = _pos_int(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    try:
        total = params_from_config(cfg)
        h = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        width = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
    except (ServePlanError, KeyError, TypeError, ValueError):
        return None
    if not experts or total <= 0:
        return None
    moe_layers = layers - int(cfg.get("first_k_dense_replace") or 0)
    return min(1.0, moe_layers * experts * 3 * h * width / total)


_NAME_SIZE = re.compile(r"(?<![A-Za-z0-9.])(?:(\d+)x)?(\d+(?:\.\d+)?)([BbMmTt])(?![A-Za-z0-9])")
_UNIT = {"b": 1e9, "m": 1e6, "t": 1e12}


def params_from_name(name: str) -> float:
    """Parameters from a model name: 'Llama-3.1-405B-Instruct' -> 405e9, 'opt-125m' -> 125e6,
    'Mixtral-8x7B' -> 56e9 (an over-estimate: experts share attention). The largest size in the
    name is taken ('Qwen3-30B-A3B' -> 30e9: 'A3B' is the active count and is not matched)."""
    found = []
    for m in _NAME_SIZE.finditer(name.rsplit("/", 1)[-1]):
        mult = int(m.group(1)) if m.group(1) else 1
        found.append(mult * float(m.group(2)) * _UNIT[m.group(3).lower()])
    if not found:
        raise ServePlanError(
            f"cannot tell the size of {name!r} from its name; give its config.json or weights")
    return max(found)


def _weight_files(file_sizes: Mapping[str, int]) -> int:
    """Bytes of the weight files vLLM would load: *.safetensors if any, else *.bin (vLLM prefers
    safetensors and does not load both); files under original/ are ignored, as vLLM does."""
    files = {p: s for p, s in file_sizes.items() if not p.startswith("original/")}
    st = [s for p, s in files.items() if p.endswith(".safetensors")]
    if st:
        return sum(st)
    return sum(s for p, s in files.items() if p.endswith(".bin"))


def model_size_from_config(config: Mapping[str, Any] | None,
                           safetensors_index: Mapping[str, Any] | None,
                           file_sizes: Mapping[str, int] | None, *,
                           name: str | None = None) -> ModelSize:
    """Weight bytes as served, from the best source available: the safetensors index's
    metadata.total_size, else the sum of the weight files, else params (config.json, or at last
    the model's name) x bytes per parameter of its dtype."""
    config = config or {}
    nbytes, dtype = dtype_of(config)
    # An FP32 checkpoint on disk is 4 bytes a parameter, served as 2.
    cfg = _text_config(config)
    raw = str(cfg.get("torch_dtype") or cfg.get("dtype") or "").lower().removeprefix("torch.")
    disk_scale = 0.5 if raw in ("float32", "float", "fp32") and not cfg.get("quantization_config") else 1.0

    try:
        counted: float | None = params_from_config(config)
    except ServePlanError:
        counted = None

    disk = None
    source = ""
    if safetensors_index:
        total = (safetensors_index.get("metadata") or {}).get("total_size")
        if isinstance(total, (int, float)) and total > 0:
            disk, source = int(total), "safetensors-index"
    if disk is None and file_sizes:
        total = _weight_files(file_sizes)
        if total > 0:
            disk, source = total, "files"
    if disk is not None:
        weight = int(disk * disk_scale)
        params = counted if counted is not None else weight / nbytes
        return ModelSize(params, dtype, nbytes, weight, source)
    if counted is not None:
        return ModelSize(counted, dtype, nbytes, int(counted * nbytes), "config")
    if name:
        params = params_from_name(name)
        return ModelSize(params, dtype, nbytes, int(params * nbytes), "name")
    raise ServePlanError("cannot size the model: no safetensors index, no weight files, "
                         "no usable config.json and no name")


def kv_cache_bytes(config: Mapping[str, Any], tokens: int, kv_bytes: float | None = None) -> int:
    """KV cache bytes for `tokens` tokens: 2 (K and V) x layers x kv_heads x head_dim x bytes
    (the model's dtype unless `kv_bytes`, e.g. 1 for --kv-cache-dtype fp8). Llama-3.1-8B in
    bf16: 128 KiB a token."""
    cfg = _text_config(config)
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    per_token = 2 * int(cfg["num_hidden_layers"]) * kv_heads * head_dim
    return int(per_token * (kv_bytes if kv_bytes is not None else dtype_of(cfg)[0]) * tokens)


@dataclass(frozen=True)
class Fit:
    fits: bool
    need_bytes: int
    have_bytes: int
    #: nodes of this shape the model needs (ceil(need / usable per node)).
    nodes_needed: int
    message: str


def _gb(n: float) -> str:
    g = n / 1e9
    return f"{g:.0f} GB" if g >= 100 or g == int(g) else f"{g:.1f} GB"


def _nodes(n: int) -> str:
    return f"{n} node" if n == 1 else f"{n} nodes"


def fit(weight_bytes: int, *, gpu_mem_bytes_per_gpu: int, gpus_per_node: int, nodes: int,
        gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
        overhead_fraction: float = OVERHEAD_FRACTION, kv_min_bytes: int = KV_MIN_BYTES,
        label: str | None = None) -> Fit:
    """The OCI guide's method: memory needed / memory per node, rounded up, gives the nodes.

    need = weights x (1 + overhead) + kv_min_bytes; usable per node = GPUs x memory x
    gpu_memory_utilization (what vLLM will take, stricter than the guide's raw memory);
    have = usable per node x nodes. For a CPU cluster pass the host memory as one "GPU".
    """
    if weight_bytes <= 0:
        raise ServePlanError(f"weight size must be positive, got {weight_bytes}")
    if gpu_mem_bytes_per_gpu <= 0 or gpus_per_node < 1 or nodes < 1:
        raise ServePlanError(
            f"cannot fit a model on {nodes} node(s) of {gpus_per_node} x {gpu_mem_bytes_per_gpu} bytes")
    if not 0 < gpu_memory_utilization <= 1:
        raise ServePlanError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if overhead_fraction < 0 or kv_min_bytes < 0:
        raise ServePlanError("overhead and KV minimum cannot be negative")
    need = int(weight_bytes * (1 + overhead_fraction) + kv_min_bytes)
    per_node = int(gpus_per_node * gpu_mem_bytes_per_gpu * gpu_memory_utilization)
    have = per_node * nodes
    needed = max(1, math.ceil(need / per_node))
    fits = need <= have
    what = f"{label} weights" if label else "weights"
    pct = f"{overhead_fraction * 100:g}%"
    kv = f" + KV {_gb(kv_min_bytes)}" if kv_min_bytes else ""
    shape = f"{_nodes(nodes)} of {gpus_per_node} x {_gb(gpu_mem_bytes_per_gpu)} ({_gb(have)} usable)"
    if fits:
        msg = f"{what} {_gb(weight_bytes)} + {pct}{kv} = {_gb(need)} fit {shape}"
    else:
        msg = (f"{what} {_gb(weight_bytes)} + {pct}{kv} = {_gb(need)} do not fit {shape}; "
               f"this model needs {_nodes(needed)} of this shape")
    return Fit(fits, need, have, needed, msg)


def _pos_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None
