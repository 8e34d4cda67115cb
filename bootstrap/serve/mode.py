"""The serving mode, decided once from the hosts and the options, and planned from the model: pure, no I/O.

A mode is one planner behind one interface (`Mode`): `check(hosts)` refuses options these hosts
cannot take (before any host is contacted), `plan(model, nodes)` gives one serving group's split
(`Choice`) once the model is read. `choose(hosts, options)` is the one place that decides which mode
serves; `check(hosts, options)` chooses and checks. The CLI, serve/run.py and fleet/run.py call these
and nothing else: the split rules (serve/split.py's arithmetic, serve/experts.py's layout) are
applied here only.

The modes: `TensorPipeline` (TP x PP, --tp/--pp, or the default split), `DataParallel` (--dp: vLLM's
DP engines within a group's nodes), `ExpertParallel` (--ep, or a mixture-of-experts model on GPUs),
`Auto` (no option: expert parallel for a MoE model, a copy per node for a model one node holds, else
the default TP x PP). Replicas (cluster.replicas > 1, of one size or of several) plan each group size
with the same mode (`plan_groups`); prefill/decode disaggregation (cluster.router.prefill) is a fleet
of TP x PP replicas, its connector rules in fleet/pd.py. A new mode is one class here with `name`,
`check`, `plan` and `tries_experts`, and one line in `choose`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from bootstrap.errors import ServePlanError
from bootstrap.serve import experts as EX
from bootstrap.serve import sizing as SZ
from bootstrap.serve import split as SP

#: why the backend is native with --dp
DP_WHY = "--dp: vLLM's own data parallel (one `vllm serve` per node, the head's balancing every engine)"
#: why the backend is native with expert parallel
EP_WHY = "expert parallel: vLLM's data parallel engines (one `vllm serve` per node, the head's balancing every engine)"
#: why the backend is native when the planner serves a copy of the model per node
AUTO_DP_WHY = "data parallel: vLLM's own DP runs one `vllm serve` per node"


class SplitRefused(ServePlanError):
    """Options the hosts cannot take. `option`: the option to name in front of the message (None: the
    message names it); `per_replica`: the rule was applied to each replica size (say which)."""

    def __init__(self, message: str, option: str | None = None, per_replica: bool = False):
        super().__init__(message)
        self.option, self.per_replica = option, per_replica


@dataclass(frozen=True)
class Hosts:
    """What of the inventory decides the mode."""

    #: each replica group's number of nodes, replica 0's first, each size once
    sizes: tuple[int, ...]
    gpus_per_node: int
    accelerator: str
    replicas: int = 1
    #: cluster.router.prefill names prefill replicas (a disaggregated fleet with replicas > 1)
    prefill: bool = False
    #: the nodes are linked by RDMA (cluster.infiniband)
    rdma: bool = False

    @classmethod
    def of(cls, inv: Any) -> "Hosts":
        c = inv.cluster
        return cls(tuple(dict.fromkeys(len(g) for g in inv.replicas)), inv.gpus_per_node, c.accelerator,
                   c.replicas, bool(c.router.prefill), bool(c.infiniband))


@dataclass(frozen=True)
class Options:
    """What serve was asked: --tp, --pp, --dp, --ep/--all2all, --backend."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: bool = False
    all2all: str | None = None
    backend: str | None = None

    @property
    def given(self) -> bool:
        """A split option was given (the backend is not one)."""
        return self.ep or self.all2all is not None or any(v is not None for v in (self.tp, self.pp, self.dp))

    @property
    def plain(self) -> bool:
        """No option at all: the planner chooses the mode from the model."""
        return not self.given and self.backend is None


@dataclass(frozen=True)
class Model:
    """What was read of the model (and, for expert parallel, of the GPUs)."""

    shape: SP.ModelShape | None = None
    config: Mapping[str, Any] | None = None
    engine: EX.EngineCaps = field(default_factory=EX.EngineCaps)
    #: the whole model on all the group's GPUs (a model path's files); None: not known
    fit: SZ.Fit | None = None
    weight_bytes: int | None = None
    gpu_mem_bytes: int | None = None


@dataclass(frozen=True)
class Choice:
    """One group's split and what comes with it."""

    split: SP.SplitChoice
    #: why the backend is native (None: the mode's own reason, or the cluster's backend)
    why: str | None = None
    #: expert parallel's per-rank fit (None: the caller's whole-model fit stands)
    fit: SZ.Fit | None = None
    notes: tuple[str, ...] = ()


class Mode(Protocol):
    name: str
    #: the backend this mode needs ('native'), None: the cluster's
    backend: str | None
    #: why the backend is native, shown with the plan (None: the cluster's own reason)
    why: str | None

    def check(self, hosts: Hosts) -> None:
        """Refuse (SplitRefused) what these hosts cannot take, before any host is contacted."""

    def plan(self, model: Model, hosts: Hosts, nodes: int) -> Choice:
        """The split of one group of `nodes` nodes for this model."""

    def tries_experts(self, shape: SP.ModelShape | None, hosts: Hosts) -> bool:
        """Whether plan may try expert parallel (the caller then reads the weights' size and the GPUs)."""


@dataclass(frozen=True)
class TensorPipeline:
    tp: int | None = None
    pp: int | None = None
    name: str = "tp-pp"
    backend: str | None = None
    why: str | None = None

    def check(self, hosts: Hosts) -> None:
        for n in hosts.sizes:
            try:
                SP.parallelism(n, hosts.gpus_per_node, self.tp, self.pp, accelerator=hosts.accelerator)
            except ServePlanError as exc:
                raise SplitRefused(str(exc), "--tp/--pp", True) from None

    def plan(self, model: Model, hosts: Hosts, nodes: int) -> Choice:
        return Choice(SP.choose_split(model.shape, nodes, hosts.gpus_per_node, accelerator=hosts.accelerator,
                                      tp=self.tp, pp=self.pp))

    def tries_experts(self, shape: SP.ModelShape | None, hosts: Hosts) -> bool:
        return False


@dataclass(frozen=True)
class DataParallel:
    dp: int
    tp: int | None = None
    pp: int | None = None
    name: str = "dp"
    backend: str | None = "native"
    why: str | None = DP_WHY

    def check(self, hosts: Hosts) -> None:
        if hosts.replicas > 1 and hosts.prefill:
            raise SplitRefused("--dp with cluster.router.prefill: a disaggregated fleet's replicas are TP x PP "
                               "groups (drop --dp)")
        for n in hosts.sizes:  # with replicas, each replica's engines within its own nodes
            try:
                SP.data_parallel(n, hosts.gpus_per_node, self.dp, self.tp, self.pp, accelerator=hosts.accelerator)
            except ServePlanError as exc:
                raise SplitRefused(str(exc), "--dp", True) from None

    def plan(self, model: Model, hosts: Hosts, nodes: int) -> Choice:
        return Choice(SP.choose_split(model.shape, nodes, hosts.gpus_per_node, accelerator=hosts.accelerator,
                                      tp=self.tp, pp=self.pp, dp=self.dp))

    def tries_experts(self, shape: SP.ModelShape | None, hosts: Hosts) -> bool:
        return False


@dataclass(frozen=True)
class ExpertParallel:
    """--ep (forced: what stops it is an error) or, from Auto, a mixture-of-experts model."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    all2all: str | None = None
    forced: bool = True
    name: str = "ep"
    backend: str | None = "native"
    why: str | None = EP_WHY

    def check(self, hosts: Hosts) -> None:
        if hosts.replicas > 1:
            raise SplitRefused("--ep: expert parallel serves one cluster (its engines behind the head's API "
                               "server); with cluster.replicas > 1 each replica is a TP x PP group behind the "
                               "router (drop --ep, or set replicas: 1)")
        if hosts.accelerator != "gpu":
            raise SplitRefused("--ep: vLLM-CPU runs no expert parallel (TP=2 with EP crashes its worker; MoE "
                               "across DP engines needs all_gatherv, which its CPU communicator lacks); serve "
                               "the model with a TP x PP split (drop --ep)")
        if self.pp not in (None, 1):
            raise SplitRefused(f"--ep with --pp {self.pp}: expert parallel runs data parallel engines within a node "
                               "(TP only); drop --pp")
        bad = EX.layout_problem(hosts.sizes[0], hosts.gpus_per_node, self.tp, self.dp)
        if bad:
            raise SplitRefused(bad, "--ep")

    def plan(self, model: Model, hosts: Hosts, nodes: int) -> Choice:
        split, fit, why_not = EX.plan_experts(
            model.shape, nodes, hosts.gpus_per_node, accelerator=hosts.accelerator, caps=model.engine,
            rdma=hosts.rdma, forced=self.forced, tp=self.tp, dp=self.dp, all2all=self.all2all,
            weight_bytes=model.weight_bytes, expert_fraction=SZ.expert_fraction(model.config),
            gpu_mem_bytes=model.gpu_mem_bytes)
        if split is not None:
            return Choice(split, EP_WHY, fit)
        notes = (f"expert parallel not planned: {why_not}",) if why_not else ()
        return Choice(SP.choose_split(model.shape, nodes, hosts.gpus_per_node, accelerator=hosts.accelerator,
                                      tp=self.tp, pp=self.pp, dp=self.dp), None, None, notes)

    def tries_experts(self, shape: SP.ModelShape | None, hosts: Hosts) -> bool:
        return True


@dataclass(frozen=True)
class Auto:
    """No option: expert parallel for a mixture-of-experts model on GPUs, a copy per node of a model
    one node holds (vLLM's DP), else the default TP x PP split."""

    name: str = "auto"
    backend: str | None = None
    why: str | None = None

    def check(self, hosts: Hosts) -> None:
        TensorPipeline().check(hosts)

    def plan(self, model: Model, hosts: Hosts, nodes: int) -> Choice:
        notes: tuple[str, ...] = ()
        if self.tries_experts(model.shape, hosts):
            got = ExpertParallel(forced=False).plan(model, hosts, nodes)
            if got.why is not None:
                return got
            notes = got.notes
        if model.fit is not None and model.fit.fits:
            split = SP.auto_data_parallel(model.shape, nodes, hosts.gpus_per_node, accelerator=hosts.accelerator,
                                          nodes_needed=model.fit.nodes_needed)
            if split is not None:
                return Choice(split, AUTO_DP_WHY, None, notes)
        return Choice(TensorPipeline().plan(model, hosts, nodes).split, None, None, notes)

    def tries_experts(self, shape: SP.ModelShape | None, hosts: Hosts) -> bool:
        return hosts.accelerator == "gpu" and shape is not None and bool(shape.experts)


def choose(hosts: Hosts, options: Options) -> Mode:
    """The one decision of the serving mode, from the hosts and the options."""
    o = options
    if o.ep or o.all2all is not None:
        return ExpertParallel(o.tp, o.pp, o.dp, o.all2all)
    if o.dp is not None:
        return DataParallel(o.dp, o.tp, o.pp)
    if o.plain and hosts.replicas == 1:
        return Auto()
    return TensorPipeline(o.tp, o.pp)


def check(hosts: Hosts, options: Options) -> Mode:
    """The mode, its options checked against the hosts (SplitRefused), and a backend it cannot run
    on refused: vLLM's data parallel engines run on the native backend."""
    mode = choose(hosts, options)
    mode.check(hosts)
    if mode.backend == "native" and options.backend == "ray":
        flag = "--dp" if options.dp is not None else "--ep"
        raise SplitRefused(f"{flag} with --backend ray: bootstrap runs vLLM's data parallel engines with its native "
                           "backend (one `vllm serve` per node); drop --backend ray")
    return mode


def plan_groups(mode: Mode, hosts: Hosts, model: Model) -> dict[int, Choice]:
    """Each group size's choice (one entry when the replicas are of one size), replica 0's first."""
    return {n: mode.plan(model, hosts, n) for n in hosts.sizes}
