"""How one serving group's GPUs are split (TP x PP, DP engines) for a model's shape: pure arithmetic, no I/O.

* `parallelism` / `data_parallel`: the sizes a group of `nodes` x `gpus_per_node` can take.
* `model_shape` / `split_problems`: what in config.json limits the split.
* `choose_split` / `auto_data_parallel`: the split for this model on this group, with its reason.

bootstrap.serve.mode is the one caller in the package: it decides the serving mode and applies these
rules; nothing else checks --tp/--pp/--dp. Sources (vLLM): docs/serving/distributed_serving.md
("TP = GPUs per node, PP = nodes"); vllm/config/model.py, layers/linear.py, distributed/utils.py (below).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bootstrap.errors import ModelSplitError, ServePlanError
from bootstrap.serve.sizing import _pos_int, _text_config


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

def split_label(par: Parallelism) -> str:
    """"DP=16 x TP=1, EP=16", "DP=2 x TP=8", "TP=8 PP=2"."""
    if par.ep:
        return f"DP={par.dp} x TP={par.tp}, EP={par.ep_size}"
    if par.dp > 1:
        return f"DP={par.dp} x TP={par.tp}"
    return f"TP={par.tp} PP={par.pp}"
