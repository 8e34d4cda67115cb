"""vLLM's own checks of its configuration against the model: --tp against the attention heads, --pp
against the layers, --max-model-len against the model's context and the memory left for the KV cache;
vLLM refusing its command line; and a serve container that exited under the fleet's keeper.
"""
from __future__ import annotations

import re

from bootstrap.signatures.engine import Signature, fix_from
from bootstrap.signatures.engine import pattern as _p

_TP_PLAN = ("put the other GPUs into pipeline stages: `bootstrap serve MODEL --tp T --pp P` with T x P = all "
            "GPUs (`bootstrap serve --dry-run` shows the plan), e.g. 3 nodes x 1 GPU: --tp 1 --pp 3.")
_TP_HEADS_FIX = ("Choose a --tp that divides the model's num_attention_heads and that divides, or is a multiple of, "
                 "its num_key_value_heads (both in the model's config.json), and " + _TP_PLAN)
_HEADS_VS_TP = re.compile(r"attention heads \((\d+)\) must be divisible by tensor parallel size \((\d+)\)")


def _tp_heads_fix(line: str) -> str:
    m = _HEADS_VS_TP.search(line)
    if not m:
        return _TP_HEADS_FIX
    heads, tp = int(m[1]), int(m[2])
    ok = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
    return (f"The model has {heads} attention heads, so --tp {tp} cannot split them; --tp must be one of {ok} "
            "(and divide, or be a multiple of, num_key_value_heads in config.json): " + _TP_PLAN)


_MAX_LEN_FIX = ("Pass a length within the model's limit after `--`: `bootstrap serve MODEL -- --max-model-len N` (N "
                "at most the derived max_model_len the error names), or leave --max-model-len out to use the "
                "model's own; a longer context needs RoPE scaling (--hf-overrides with rope_scaling) plus "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in the containers' environment.")
_DERIVED_LEN = re.compile(r"derived max_model_len \((?:(\w+)=)?(\d+)(?:\.\d+)?(?: or model_max_length=(\d+))?")


def _max_len_fix(line: str) -> str:
    m = _DERIVED_LEN.search(line)
    if not m:
        return _MAX_LEN_FIX
    key, limit = m[1], int(m[2])
    if m[3] and int(m[3]) > limit:  # vLLM accepts up to model_max_length when the config sets it
        key, limit = "model_max_length", int(m[3])
    named = f" ({key}={limit})" if key and key != "None" else ""
    return (f"The model's config.json allows {limit} tokens{named}: pass `bootstrap serve MODEL -- "
            f"--max-model-len {limit}` (or less), or leave --max-model-len out to use the model's own; a longer "
            "context needs RoPE scaling (--hf-overrides with rope_scaling) plus VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "
            "in the containers' environment.")


_BAD_ARG_FIX = ("Check the flags after `--` against this image's vLLM: `bootstrap exec -i INV --container -- vllm "
                "serve --help` lists them (flags change between vLLM versions); `bootstrap serve --dry-run` shows "
                "the command each node runs.")
_BAD_ARG = re.compile(r"error: (?:unrecognized arguments: (\S+)|argument ([^:\s]+))")


_bad_arg_fix = fix_from(_BAD_ARG, _BAD_ARG_FIX, lambda m: (
    f"vLLM does not accept {m[1] or m[2]} as given: drop or correct it after `--` in `bootstrap serve` (or the "
    "rollout), checking `bootstrap exec -i INV --container -- vllm serve --help` for this image's vLLM."))


_KV_FIX = ("Lower --max-model-len after `--` (`bootstrap serve MODEL -- --max-model-len N`), raise "
           "--gpu-memory-utilization, or spread the model over more GPUs (a larger TP or PP leaves more memory "
           "per GPU for the cache); on CPU, raise VLLM_CPU_KVCACHE_SPACE in the containers' environment.")
_EST_LEN = re.compile(r"estimated maximum model length is (\d+)")


_kv_fix = fix_from(_EST_LEN, _KV_FIX, lambda m: (
    f"vLLM estimates the memory left holds {m[1]} tokens: pass `bootstrap serve MODEL -- --max-model-len {m[1]}` "
    "(or less), or free memory for the cache: raise --gpu-memory-utilization or spread the model over more GPUs "
    "(a larger TP or PP)."))


_EXITED_FIX = ("Read that member's vLLM output for why it stopped: `bootstrap logs -i INV --serve HOST`; a group "
               "restarts whole when one member goes, so the other members' restarts follow from it.")
_EXIT_CODE = re.compile(r"keeper: (\S+) was Exited \((\d+)\)")


def _exited(m: re.Match) -> str:
    name, code = m[1], int(m[2])
    if code == 137:
        return (f"Exit 137 is SIGKILL: a `docker kill`, or the kernel's OOM killer; on the host, "
                f"`docker inspect -f '{{{{.State.OOMKilled}}}}' {name}` and `dmesg | grep -i oom` say which. "
                "Give vLLM less to hold (--max-model-len, --max-num-seqs, VLLM_CPU_KVCACHE_SPACE on CPU) or the "
                "host more memory. " + _EXITED_FIX)
    return f"vLLM exited with code {code}. " + _EXITED_FIX


_exited_fix = fix_from(_EXIT_CODE, _EXITED_FIX, _exited)


SIGNATURES: tuple[Signature, ...] = (
    Signature(
        id="tp-heads-indivisible",
        severity="error",
        patterns=(
            _p(r"Total number of attention heads \(\d+\) must be divisible by tensor parallel size \(\d+\)",
               needle="must be divisible by tensor parallel size"),
            # the KV-head checks of the model files (llama.py, qwen2.py, ...), a bare AssertionError under them
            _p(r"\bassert (?:self\.)?total_num_kv_heads % tp_size == 0", needle="total_num_kv_heads % tp_size"),
            _p(r"\bassert tp_size % (?:self\.)?total_num_kv_heads == 0",
               needle="total_num_kv_heads == 0"),
            # QKVParallelLinear splitting (or replicating) the KV heads, whose divide() asserts "X is not
            # divisible by Y" (vllm/model_executor/layers/linear.py)
            _p(r"num_kv_head_replicas = divide\(tp_size, self\.total_num_kv_heads\)",
               needle="num_kv_head_replicas = divide("),
            _p(r"num_kv_heads = divide\(self\.total_num_kv_heads, tp_size\)", needle="num_kv_heads = divide("),
        ),
        title="The tensor-parallel size (--tp) does not divide the model's attention heads (or its KV heads): "
              "tensor parallelism gives every GPU an equal share of the heads",
        fix=_TP_HEADS_FIX,
        fix_for=_tp_heads_fix,
        sources=("https://github.com/vllm-project/vllm/issues/52435",
                 "https://github.com/vllm-project/vllm/issues/2652",
                 "https://github.com/vllm-project/vllm/issues/16021",
                 "https://github.com/vllm-project/vllm/issues/1581",
                 "vllm-project/vllm vllm/config/model.py (ModelConfig.verify_with_parallel_config)",
                 "vllm-project/vllm vllm/model_executor/models/llama.py (LlamaAttention)",
                 "vllm-project/vllm vllm/model_executor/layers/linear.py (QKVParallelLinear)"),
    ),
    Signature(
        id="pp-invalid",
        severity="error",
        patterns=(
            _p(r"Pipeline parallelism is not supported for this model"),
            _p(r"Pipeline parallelism is only supported for the following"),
            _p(r"Total number of hidden layers \(\d+\) must be divisible by pipeline parallel size \(\d+\)",
               needle="must be divisible by pipeline parallel size"),
            # VLLM_PP_LAYER_PARTITION that does not fit the stages or the layers (vllm/distributed/utils.py)
            _p(r"len\(partitions\)=\d+ does not match pp_size=\d+", needle="does not match pp_size="),
            _p(r"sum\(partitions\)=\d+ does not match num_hidden_layers=\d+",
               needle="does not match num_hidden_layers="),
        ),
        title="vLLM cannot split this model into --pp pipeline stages: the model does not support pipeline "
              "parallelism, or the layer split does not fit the stages",
        fix="Serve it without pipeline stages: `bootstrap serve MODEL --tp <all GPUs> --pp 1` (tensor parallel "
            "across the nodes; `bootstrap serve --dry-run` shows the plan), or use a vLLM version in which the "
            "model implements SupportsPP. For a layer-count error pick a --pp that divides num_hidden_layers "
            "(config.json), and unset VLLM_PP_LAYER_PARTITION or give it one layer count per stage summing to "
            "num_hidden_layers.",
        sources=("https://github.com/vllm-project/vllm/issues/16231",
                 "https://github.com/vllm-project/vllm/issues/9015",
                 "vllm-project/vllm vllm/config/model.py (ModelConfig.verify_with_parallel_config)",
                 "vllm-project/vllm vllm/distributed/utils.py (get_pp_indices)"),
    ),
    Signature(
        id="max-model-len-too-long",
        severity="error",
        patterns=(_p(r"User-specified max_model_len \(\d+\) is greater than the derived max_model_len",
                     needle="is greater than the derived max_model_len"),),
        title="--max-model-len asks for a longer context than the model's config.json declares "
              "(max_position_embeddings or model_max_length), so vLLM refuses to start",
        fix=_MAX_LEN_FIX,
        fix_for=_max_len_fix,
        sources=("https://github.com/vllm-project/vllm/issues/3676",
                 "https://github.com/xorbitsai/inference/issues/1715",
                 "vllm-project/vllm vllm/config/model.py (_get_and_verify_max_len)"),
    ),
    Signature(
        id="vllm-bad-argument",
        severity="error",
        patterns=(_p(r"\bvllm(?: serve)?: error: \S.*", needle=": error: "),),
        title="vLLM refused its command line: a flag this vLLM does not know, or a value it does not accept",
        fix=_BAD_ARG_FIX,
        fix_for=_bad_arg_fix,
        sources=("python argparse (ArgumentParser.error: '%(prog)s: error: %(message)s')",
                 "vllm-project/vllm vllm/entrypoints/cli/main.py"),
    ),
    Signature(
        id="kv-cache-too-small",
        severity="error",
        patterns=(_p(r"KV cache is needed, which is larger than the available KV cache memory",
                     needle="larger than the available kv cache memory"),
                  _p(r"No available memory for the cache blocks")),
        title="The memory left after the model's weights cannot hold the KV cache of one request of "
              "--max-model-len tokens",
        fix=_KV_FIX,
        fix_for=_kv_fix,
        sources=("vllm-project/vllm vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory)",
                 "vllm-project/vllm vllm/v1/worker/gpu_worker.py (determine_available_memory)"),
    ),
    Signature(
        id="worker-illegal-instruction",
        severity="error",
        patterns=(
            # vLLM's executor naming a worker killed by SIGILL (exit code -4)
            _p(r"Worker proc \S+ died unexpectedly \(exit code: -4\)", needle="died unexpectedly (exit code: -4)"),
            # Python's faulthandler, or the shell, over the process that executed it
            _p(r"\bIllegal instruction\b", needle="illegal instruction"),
        ),
        ignore=re.compile(r"illegal instruction was encountered", re.IGNORECASE),  # a CUDA kernel's, not the CPU's
        title="A vLLM process was killed by SIGILL: it ran a CPU instruction this host does not allow it",
        fix=("On a CPU cluster (vLLM-CPU) with AMX tiles (`amx_tile` in /proc/cpuinfo): vLLM-CPU's attention kernel "
             "uses AMX without asking Linux for it, so eager engines die on their first request; leave "
             "--enforce-eager out, or use an image that requests the AMX state in every Python process (the "
             "sandbox image's bootstrap_sandbox_amx; docs/troubleshooting.md). Otherwise the image was built for "
             "a newer CPU than this host's: compare the host's flags in /proc/cpuinfo with the image's build."),
        sources=("vllm-project/vllm vllm/v1/executor/multiproc_executor.py (\"Worker proc %s died unexpectedly "
                 "(exit code: %s)\")",
                 "vllm-project/vllm vllm/v1/attention/backends/cpu_attn.py (_get_attn_isa picks amx)",
                 "Linux Documentation/arch/x86/xstate.rst (ARCH_REQ_XCOMP_PERM)"),
    ),
    Signature(
        id="serve-container-exited",
        severity="warning",
        patterns=(_p(r"^keeper: \S+ was Exited \(\d+\)", needle="keeper: "),),
        title="A replica's serve container exited and the keeper started it again (the group restarted)",
        fix=_EXITED_FIX,
        fix_for=_exited_fix,
        sources=("checks/keeper.py (this project: the line it prints when it starts an exited container)",),
    ),
)

