"""The `vllm serve` argv each node of a serving group runs, and the env vLLM must not copy between nodes: pure, no I/O.

* `ray_serve_argv`: one command on the head, on the Ray cluster the containers form.
* `native_serve_argvs`: vLLM's own multi-node mode, one `vllm serve` per node (TP x PP, DP, EP).
* `per_node_env_names`: the variables vLLM must not copy from the head to its Ray workers.

Sources (vLLM): vllm/config/parallel.py (`nnodes`, `node_rank`, `master_addr`, `master_port`: "for
multi-node distributed inference when distributed_executor_backend is mp", master_port default 29501);
vllm/engine/arg_utils.py (`--nnodes/-n`, `--node-rank/-r`, `--master-addr`, `--master-port`,
`--tensor-parallel-size/-tp`, `--pipeline-parallel-size/-pp`, `--distributed-executor-backend`);
vllm/entrypoints/cli/serve.py (`--headless`: no API server; with node rank > 0 it runs the multiproc
executor's workers); docs/deployment/integrations/kthena.md (the same two `vllm serve` commands, rank 0
and a `--headless` rank 1, with `--distributed-executor-backend mp`).
"""
from __future__ import annotations

from typing import Sequence

from bootstrap.cluster import plan as PL
from bootstrap.errors import ServePlanError
from bootstrap.model import Inventory
from bootstrap.serve import passthrough as PT
from bootstrap.serve.flags import _INSTEAD, _OWNED_DP, _OWNED_EP, _OWNED_NATIVE, _OWNED_RAY, check_model_ref
from bootstrap.serve.split import Parallelism


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


#: Variables with these prefixes may name a node's own NICs and HCAs (NCCL_SOCKET_IFNAME, ...).
PER_NODE_PREFIXES = ("NCCL_", "GLOO_", "UCX_")


def per_node_env_names(inv: Inventory) -> list[str]:
    """NCCL_/GLOO_/UCX_ variables of the node containers (PL.node_env) whose value differs between
    nodes, or that some node lacks: vLLM must not copy them from the head to its Ray workers."""
    envs = [PL.node_env(h) for h in inv.hosts]
    keys = {k for e in envs for k in e if k.startswith(PER_NODE_PREFIXES)}
    return sorted(k for k in keys if len({e.get(k) for e in envs}) > 1)
