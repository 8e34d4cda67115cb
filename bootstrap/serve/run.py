"""`bootstrap serve`: run `vllm serve` across the running cluster, wait for it, report the endpoint.

Pure decisions (parallelism, argv, fit, manifests, KV capacity) live in `bootstrap.serve.mode` and its
split, flags, argv, sizing, manifest and kvlog modules; what serve leaves on the head and how it is
read back in `bootstrap.serve.state`; this module does the I/O on the node containers.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from bootstrap import signatures as D
from bootstrap.cluster import facts as F
from bootstrap.cluster import plan as PL
from bootstrap.cluster import probe
from bootstrap.cluster import ray as R
from bootstrap.cluster import runtime as RT
from bootstrap.containers import LOAD_SECRETS
from bootstrap.errors import PreflightFailed, ServeFailed, ServePlanError, UsageError
from bootstrap.model import Host, Inventory
from bootstrap.remote import docker as DK
from bootstrap.remote import node as N
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.remote.session import Reporter, Session
from bootstrap.serve import argv as AV
from bootstrap.serve import experts as EX
from bootstrap.serve import flags as FG
from bootstrap.serve import kvlog as KL
from bootstrap.serve import manifest as MF
from bootstrap.serve import mode as M
from bootstrap.serve import modelref as MR
from bootstrap.serve import modelsync as MS
from bootstrap.serve import sizing as SZ
from bootstrap.serve import split as SP
from bootstrap.serve import watch as W
from bootstrap.serve.state import LOG, PIDFILE, STATE, check_extra_in_image, read_model_info, stop_serving

NON_CARRY_OVER = "/root/.config/vllm/ray_non_carry_over_env_vars.json"
# Start a command detached inside the container, its output in LOG and its pid in PIDFILE.
_DETACH = f'{LOAD_SECRETS}; echo $$ > {PIDFILE}; exec "$@" > {LOG} 2>&1'


@dataclass(frozen=True)
class NodeLaunch:
    host: str
    ip: str
    #: the `vllm serve` argv this node runs inside its container (empty: nothing, Ray places it)
    argv: tuple[str, ...]


@dataclass
class ServePlan:
    """What `serve` will do, decided before anything starts; `--dry-run` prints it and stops."""
    model: str
    backend: str
    backend_reason: str
    split: SP.SplitChoice
    shape: SP.ModelShape | None
    #: where config.json came from: path, hf-cache, hub; None when it could not be read
    config_source: str | None
    config_error: str | None
    nodes: list[NodeLaunch]
    endpoint: str
    #: the URL the head container itself uses to reach vLLM
    url_in: str
    master_port: int | None
    #: secrets the containers get from `up` (their values are never shown)
    secrets: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    fit: object | None = None

    def to_dict(self) -> dict:
        return {"model": self.model, "backend": self.backend, "backend_reason": self.backend_reason,
                "tp": self.split.par.tp, "pp": self.split.par.pp, "dp": self.split.par.dp,
                "ep": self.split.par.ep_size, "all2all": self.split.all2all,
                "split_reason": self.split.reason,
                "model_shape": self.shape.describe() if self.shape and self.shape.known else None,
                "config_source": self.config_source, "config_error": self.config_error,
                "endpoint": self.endpoint, "secrets": self.secrets, "notes": self.notes,
                "nodes": [{"host": n.host, "ip": n.ip, "argv": list(n.argv)} for n in self.nodes]}


@dataclass
class ServeResult:
    endpoint: str
    model: str
    served: list[str]
    backend: str
    parallelism: SP.Parallelism
    ready_seconds: float
    kv: object | None = None
    fit: object | None = None
    notes: list[str] = field(default_factory=list)
    plan: ServePlan | None = None

    def curl(self) -> str:
        body = json.dumps({"model": self.served[0] if self.served else self.model,
                           "prompt": "San Francisco is a", "max_tokens": 32, "temperature": 0})
        return f"curl {self.endpoint}/completions -H 'Content-Type: application/json' -d '{body}'"


def _detached(container: str, argv: Sequence[str], env: Iterable[tuple[str, str]] = ()) -> tuple[str, ...]:
    return DK.exec_argv(container, "sh", "-c", _DETACH, "sh", *argv, detach=True, env=env)


def is_path(model: str) -> bool:
    return model.startswith("/")


def choose_backend(accelerator: str, runtime: str | None, requested: str | None) -> tuple[str, str]:
    """(backend, why) from the cluster's facts; an impossible request is refused (exit 2) before
    anything starts. vLLM's Ray executor needs GPUs ("current platform cpu does not support ray").
    runtime None: not known yet (unset in the inventory, before the containers were read)."""
    if requested not in (None, "ray", "native"):
        raise UsageError(f"unknown backend {requested!r} (ray or native)")
    if requested == "ray" and runtime == "none":
        raise UsageError("the Ray backend needs the nodes to run Ray, and this cluster runs without it "
                         "(cluster.runtime: none, or an image without Ray): use --backend native")
    if requested == "ray" and accelerator != "gpu":
        raise UsageError("--backend ray cannot serve on a CPU cluster (accelerator: none): vLLM's Ray executor "
                         "needs GPUs (\"current platform cpu does not support ray\"); use --backend native")
    if requested:
        return requested, f"--backend {requested}"
    if accelerator != "gpu":
        return "native", "CPU cluster: vLLM's Ray executor needs GPUs"
    if runtime != "ray":
        return "native", "the containers run without Ray (cluster.runtime: none, or an image without Ray)"
    return "ray", "GPU cluster running Ray"


@dataclass
class _Gathered:
    """What serve read on the hosts before it chooses: the inventory (its runtime from the containers),
    the model's config and files, the fit, where the model must be copied, the notes so far."""
    inv: Inventory
    order: list[Host]
    info: dict
    config: dict | None
    shape: SP.ModelShape | None
    manifests: dict
    sync_to: list[str]
    fit: SZ.Fit | None
    notes: list[str]


def serve(inv: Inventory, model: str, *, tp: int | None = None, pp: int | None = None, dp: int | None = None,
          ep: bool = False, all2all: str | None = None, backend: str | None = None,
          extra: Sequence[str] = (), sync_model: bool = False, wait: float = 900.0, listen: str | None = None,
          served_name: str | None = None, parallel: int = DEFAULT_PARALLEL, dry_run: bool = False,
          on_plan: Callable[[ServePlan], None] | None = None,
          reporter: Reporter | None = None) -> ServeResult | ServePlan:
    """Plan, then (unless dry_run) launch and wait: gather -> choose -> launch -> wait. The plan is
    handed to `on_plan` before anything starts; a dry run returns it. Raises UsageError (exit 2) for
    a split or backend that cannot work, before any change on the nodes."""
    opts = M.Options(tp, pp, dp, ep=ep or all2all is not None, all2all=all2all, backend=backend)
    # The cluster's shape alone (no model yet): bad --tp/--pp/--dp/--ep for these nodes fail before connecting.
    mode = M.check(M.Hosts.of(inv), opts)
    choose_backend(inv.cluster.accelerator, inv.cluster.runtime, mode.backend or backend)
    host_bind = listen or inv.head.ip
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        got = _gather(sess, inv, model, host_bind, sync_model)
        plan = _choose(sess, got, mode, opts, model, host_bind, served_name, extra)
        if got.sync_to:
            plan.notes.append(f"{'would copy' if dry_run else 'copies'} {model} from {got.inv.head.name} to "
                              f"{', '.join(got.sync_to)} (--sync-model)")
        if on_plan is not None:
            on_plan(plan)
        if dry_run:
            return plan
        _launch(sess, got, plan, served_name, extra)
        return _wait(sess, got, plan, wait)


def plan_offline(inv: Inventory, model: str, *, config: str | None = None, tp: int | None = None,
                 pp: int | None = None, dp: int | None = None, ep: bool = False, all2all: str | None = None,
                 backend: str | None = None, extra: Sequence[str] = (), listen: str | None = None,
                 served_name: str | None = None) -> ServePlan:
    """The plan `serve --dry-run` makes, from the inventory and the model's config.json read on this
    machine (CONFIG: a config.json or the folder holding it; default: MODEL, where it is such a folder
    here), contacting no host. What only the hosts can tell is left out and said in the notes: the
    containers' runtime where the inventory leaves it unset, the model's files and fit, the image's own
    vLLM parser, Ray's view. Raises UsageError / ModelSplitError as serve does, before any contact."""
    opts = M.Options(tp, pp, dp, ep=ep or all2all is not None, all2all=all2all, backend=backend)
    mode = M.check(M.Hosts.of(inv), opts)
    choose_backend(inv.cluster.accelerator, inv.cluster.runtime, mode.backend or backend)
    cfg, where = local_config(config, model)
    notes = ["planned offline: no host was contacted (the model's files and fit, the image's vLLM parser and "
             "Ray's view are checked by serve on the hosts)"]
    if cfg is None:
        notes.append(f"no config.json here ({where}): the split is not checked against the model; give "
                     "--model-config PATH")
    if inv.cluster.runtime is None:
        notes.append("cluster.runtime is unset: planned as the containers without Ray; where the image has Ray, "
                     "serve on the hosts plans the Ray backend")
    order = [inv.head, *inv.workers]
    got = _Gathered(inv, order, {"source": where} if cfg else {}, cfg, SP.model_shape(cfg) if cfg else None, {}, [],
                    None, notes)
    return _choose(None, got, mode, opts, model, listen or inv.head.ip, served_name, extra)


def local_config(config: str | None, model: str) -> tuple[dict | None, str]:
    """(the model's config.json read on this machine, where it was looked for): CONFIG (a file, or a
    folder holding config.json), else MODEL where it is a folder here. UsageError for a CONFIG that
    cannot be read as a JSON object."""
    path = config or model
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        if config is not None:
            raise UsageError(f"--model-config: {config}: no config.json there")
        return None, path
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--model-config: {path}: not a JSON config ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(f"--model-config: {path}: not a JSON object")
    return doc, path


def _gather(sess: Session, inv: Inventory, model: str, host_bind: str, sync_model: bool) -> _Gathered:
    """The containers running (their runtime where the inventory leaves it unset), the model's
    config.json as the head's vLLM reads it, and for a model path its files on every node and the fit."""
    name = inv.cluster.container_name
    order = [inv.head, *inv.workers]
    notes = [w for w in probe.exposure_warnings(sess, vllm_listen=host_bind) if "vLLM" in w]
    states = sess.stage("inspect", order, lambda h: N.of(sess, h, name).inspect())
    down = [h.name for h in order if not (states.get(h.name) and states[h.name].running)]
    if down:
        raise PreflightFailed(", ".join(down), "the cluster container is not running", "run `bootstrap up` first")
    if inv.cluster.runtime is None:  # unset: what `up` started the containers with (see cluster.runtime)
        inv = sess.inv = RT.from_containers(inv, states)
    # What the model allows: its config.json, read where vLLM will read it (the head container).
    info = read_model_info(sess, inv.head, model)
    refused = MR.refusal(model, info, inv.head.name)
    if refused is not None:
        raise refused
    config = info.get("config") if isinstance(info.get("config"), dict) else None
    shape = SP.model_shape(config) if config else None
    if config is None:
        notes.append(f"could not read the model's config.json ({info.get('error') or 'no answer'}): "
                     "the split is not checked against the model")
    # The model must be the same on every node (or come from the hub through the HF cache).
    fit, sync_to, manifests = None, [], {}
    if is_path(model):
        manifests = _manifests(sess, order, model)
        if not manifests[inv.head.name]:
            raise UsageError(f"{inv.head.name}: no files under {model} in the container "
                             "(a model path is a path inside the container: mount it with cluster.mounts)")
        diffs = MF.compare_manifests(manifests, inv.head.name)
        if diffs and not sync_model:
            raise PreflightFailed(", ".join(d.host for d in diffs), MF.describe(diffs),
                                  "copy the model to every node, or pass --sync-model to copy it from the head")
        sync_to = [d.host for d in diffs]
        fit = _fit(sess, inv, config, info.get("index"), manifests[inv.head.name])
    return _Gathered(inv, order, info, config, shape, manifests, sync_to, fit, notes)


def _choose(sess: Session | None, got: _Gathered, mode: M.Mode, opts: M.Options, model: str, host_bind: str,
            served_name: str | None, extra: Sequence[str]) -> ServePlan:
    """The mode's split for this model (serve/mode.py), the checks that need it, and each node's argv."""
    inv, c = got.inv, got.inv.cluster
    hosts = M.Hosts.of(inv)
    backend, backend_why = choose_backend(c.accelerator, c.runtime, mode.backend or opts.backend)
    backend_why = mode.why or backend_why
    weight = gpu_mem = None
    if mode.tries_experts(got.shape, hosts) and sess is not None:
        weight, gpu_mem = _expert_sizes(sess, inv, got.config, got.info, got.manifests)
    choice = mode.plan(M.Model(got.shape, got.config, EX.EngineCaps.from_doc(got.info.get("engine")), got.fit,
                               weight, gpu_mem), hosts, len(got.order))
    split, fit = choice.split, choice.fit or got.fit
    if choice.why is not None:
        backend, backend_why = "native", choice.why
    got.notes.extend(choice.notes)
    FG.check_engine_flags(c.accelerator, split.par, extra)
    if sess is not None:  # offline: the words after -- were judged by bootstrap's own table only
        check_extra_in_image(sess, inv.head, c.image, extra, backend, got.notes)
    if split.par.dp > 1 and not split.par.ep and got.manifests:
        fit = _fit(sess, inv, got.config, got.info.get("index"), got.manifests[inv.head.name], split.par)
    if fit is not None and not fit.fits:
        fix = ("each rank holds attention whole and its share of the experts: more GPUs, or a smaller/quantized "
               "model" if split.par.ep else
               "each data parallel engine holds the whole model in its TP GPUs: a smaller --dp (a larger "
               "TP), or drop --dp" if split.par.dp > 1
               else "add nodes of this shape, or a smaller/quantized model")
        raise PreflightFailed("cluster", fit.message, fix)
    order, port = got.order, c.ports.vllm
    if backend == "ray" and sess is not None:
        view = R.ray_view(sess, order, deadline=10)
        if not view.ready:
            by_ip = {h.ip: h.name for h in order}
            raise PreflightFailed(", ".join(by_ip.get(i, i) for i in view.missing),
                                  "Ray does not list this node as alive", "run `bootstrap up` to restart it")
    master_port = None
    if backend == "ray":
        argv = AV.ray_serve_argv(model, split.par, port=port, host=host_bind, served_name=served_name, extra=extra)
        launches = [NodeLaunch(h.name, h.ip, argv if h.is_head else ()) for h in order]
    else:
        master_port = 29500 + random.randrange(400)
        argvs = AV.native_serve_argvs(model, split.par, [h.ip for h in order], port=port, host=host_bind,
                                      master_port=master_port, served_name=served_name, extra=extra,
                                      all2all=split.all2all)
        launches = [NodeLaunch(h.name, h.ip, argvs[i]) for i, h in enumerate(order)]
    url_in = "http://" + PL.hostport(inv.head.ip if host_bind in ('0.0.0.0', '::') else host_bind, port)
    return ServePlan(model, backend, backend_why, split, got.shape, got.info.get("source"), got.info.get("error"),
                     launches, f"{url_in}/v1", url_in, master_port,
                     secrets=[x.name for x in c.secrets], notes=list(got.notes), fit=fit)


def _launch(sess: Session, got: _Gathered, plan: ServePlan, served_name: str | None, extra: Sequence[str]) -> None:
    """Copy the model where --sync-model says, stop what serve started before, leave the plan on the
    head, and start each node's `vllm serve` detached."""
    inv, order, model = got.inv, got.order, plan.model
    name = inv.cluster.container_name
    if got.sync_to:
        got_from = MS.sync_model(sess, model, [inv.host(n) for n in got.sync_to], got.manifests)
        got.notes.append(f"copied {model} from {inv.head.name} to {', '.join(got.sync_to)} "
                         f"({'; '.join(f'{n} from {got_from[n]}' for n in got.sync_to if n in got_from)})")
        got.manifests = _manifests(sess, order, model)
        diffs = MF.compare_manifests(got.manifests, inv.head.name)
        if diffs:
            raise PreflightFailed(", ".join(d.host for d in diffs), "after --sync-model: " + MF.describe(diffs))
    # Replace whatever serve started before (stale workers keep their ports).
    sess.stage("stop-old", order, lambda h: stop_serving(sess, h))
    state = json.dumps({**plan.to_dict(), "url_in": plan.url_in, "served_name": served_name,
                        "nodes": [h.name for h in order], "extra": list(extra)}).encode()
    sess.ssh[inv.head.name].run_with_input(DK.exec_argv(name, "sh", "-c", f"cat > {STATE}", interactive=True),
                                           [state], timeout=30)
    if plan.backend == "ray":
        keep = AV.per_node_env_names(inv)
        if keep:
            # vLLM copies the head's NCCL_* to every Ray worker unless listed here.
            body = json.dumps(keep).encode()
            sess.ssh[inv.head.name].run_with_input(
                DK.exec_argv(name, "sh", "-c", f'mkdir -p "$(dirname {NON_CARRY_OVER})" && cat > {NON_CARRY_OVER}',
                             interactive=True),
                [body])
            got.notes.append(f"kept per-node {', '.join(keep)} (not copied from the head)")
    by_host = {n.host: n.argv for n in plan.nodes if n.argv}
    sess.stage("launch", [h for h in order if h.name in by_host],
               lambda h: sess.ssh[h.name].run(_detached(name, by_host[h.name])))


def _wait(sess: Session, got: _Gathered, plan: ServePlan, wait: float) -> ServeResult:
    """Wait for vLLM to answer on the head; a failure names its cause from every node's log and stops serving."""
    inv, order = got.inv, got.order
    name, url_in = inv.cluster.container_name, plan.url_in
    t0 = time.monotonic()
    head = N.of(sess, inv.head, name)
    with W.watching(lambda line: sess.reporter.event(inv.head.name, "vllm-start", "waiting", line),
                    lambda: head.run_in("tail", "-c", str(W.TAIL_BYTES), LOG, timeout=10, check=False).stdout):
        ready = head.payload_or_error("serve_probe.py", url_in, str(wait), PIDFILE, timeout=wait + 60)
    elapsed = time.monotonic() - t0
    sess.reporter.event(inv.head.name, "vllm-start", "done" if ready.get("ready") else "failed", f"{elapsed:.0f}s")
    # not checked: the log only adds detail (KV capacity, the failure's tail); the probe's answer decides
    log = N.of(sess, inv.head, name).run_in("cat", LOG, timeout=60, check=False).stdout
    if not ready.get("ready"):
        failed = _failure(sess, got, plan, ready, log, f"after {elapsed:.0f}s", wait)
        # a stop that fails is attached to the error, not raised in its place (Session.cleanup)
        sess.cleanup("stop-failed", order, lambda h: stop_serving(sess, h), failed)
        raise failed
    return ServeResult(f"{url_in}/v1", plan.model, ready.get("models", []), plan.backend, plan.split.par, elapsed,
                       kv=KL.kv_capacity(log), fit=plan.fit, notes=got.notes, plan=plan)


def _failure(sess: Session, got: _Gathered, plan: ServePlan, ready: dict, log: str, after: str,
             wait: float) -> ServeFailed:
    """Why vLLM did not serve: a worker cut off from the head, vLLM's own root cause, the signatures."""
    inv, order, c = got.inv, got.order, got.inv.cluster
    name = c.container_name
    # A worker cut off from the head shows up as a hang on every node alike: name it.
    cut = {}
    if len(order) > 1 and not ready.get("exited"):
        cut = probe.workers_cut_off(sess, plan.master_port if plan.backend == "native" else c.ports.ray_gcs)
    tails = {inv.head.name: log}
    if plan.backend == "native":
        for h in inv.workers:
            tails[h.name] = N.of(sess, h, name).run_in("cat", LOG, timeout=60, check=False).stdout
    findings = D.scan_logs(tails, infiniband=c.infiniband)
    what = ("vLLM exited" if ready.get("exited") else f"vLLM was not ready within {wait:g}s")
    root = D.root_cause_of(tails)
    cause = f": {root}" if root else ""
    if findings and (not root or findings[0].evidence not in root):
        cause += f" ({findings[0].title})"
    if cut:
        cause = "; " + "; ".join(f"{n}: {why}" for n, why in cut.items()) + cause
    tail = "\n".join(ln for ln in log.splitlines()[-30:])
    return ServeFailed(f"{what} {after}{cause}", tail, findings)


def _manifests(sess: Session, hosts: Sequence[Host], model: str) -> dict:
    """{host: {relative path: size}} of the model directory in each host's container."""
    name = sess.inv.cluster.container_name
    # not checked: `find` fails on a directory that is not there, and an empty manifest is then what the
    # comparison reports (the model's files missing on that host); the containers were seen running
    return sess.stage("model-files", hosts, lambda h: MF.model_manifest(sess.ssh[h.name].run(
        DK.exec_argv(name, *MF.manifest_cmd(model)), timeout=120, check=False).stdout))


def _expert_sizes(sess: Session, inv: Inventory, config: dict | None, info: dict,
                  manifests: dict) -> tuple[int | None, int | None]:
    """(the weights' bytes, one GPU's memory) for expert parallel's per-rank fit (bootstrap.serve.experts),
    where the model's size and the GPUs are known; (None, None) elsewhere."""
    weight = gpu_mem = None
    if inv.cluster.accelerator == "gpu" and config:
        index = info.get("index") if isinstance(info.get("index"), dict) else None
        try:
            weight = SZ.model_size_from_config(config, index, manifests.get(inv.head.name)).weight_bytes
        except ServePlanError:
            weight = None
        # not checked: without nvidia-smi's answer the per-rank fit is not checked (the plan says so)
        gpus = F.parse_nvidia_smi(sess.ssh[inv.head.name].run(F.NVIDIA_SMI, timeout=60, check=False).stdout)
        gpu_mem = gpus[0].memory_mib * (1 << 20) if gpus else None
    return weight, gpu_mem


def _fit(sess: Session, inv: Inventory, config: dict | None, index: dict | None, manifest: dict,
         par: SP.Parallelism | None = None):
    """Does the model fit? With data parallel, in one engine's GPUs (each engine holds it whole)."""
    if inv.cluster.accelerator != "gpu":
        return None
    head = sess.ssh[inv.head.name]
    config = config or {}
    index = index if isinstance(index, dict) else None
    size = SZ.model_size_from_config(config, index, manifest)
    # not checked: the fit is advice printed with the plan; without nvidia-smi's answer there is none
    gpus = F.parse_nvidia_smi(head.run(F.NVIDIA_SMI, timeout=60, check=False).stdout)
    if not gpus:
        return None
    if par is not None and par.dp > 1:
        return SZ.fit(size.weight_bytes, gpu_mem_bytes_per_gpu=gpus[0].memory_mib * (1 << 20),
                     gpus_per_node=par.tp, nodes=1, label=f"{size.label}, in each engine's {par.tp} GPU(s)")
    return SZ.fit(size.weight_bytes, gpu_mem_bytes_per_gpu=gpus[0].memory_mib * (1 << 20),
                 gpus_per_node=inv.gpus_per_node, nodes=len(inv.hosts), label=size.label)


def stop(inv: Inventory, *, parallel: int = DEFAULT_PARALLEL, reporter: Reporter | None = None) -> list[str]:
    """Stop serving on every node; the Ray cluster keeps running."""
    with Session(inv, parallel=parallel, reporter=reporter) as sess:
        sess.connect()
        sess.stage("stop", inv.hosts, lambda h: stop_serving(sess, h))
    return [h.name for h in inv.hosts]
