"""The library face: the one module a program (or the CLI) calls to load an inventory and run a command on it.

Each command is one call: it takes an inventory (loaded, or the path of one; face.load_inventory
loads and validates), routes one cluster vs a fleet (cluster.replicas) itself, and returns a result
object with to_doc() (the `--json` document) and, where the command can fail on it, exit_status.
Progress goes to a `reporter`; streams (exec's output, logs' lines, top's frames) to callbacks.
Nothing here prints. The CLI (bootstrap/cli) imports nothing else of the library: the names it needs
to read options and to show results are re-exported here too (tests/cli/test_face_imports.py).
"""
from __future__ import annotations

# the names the command line's options and renderers need (re-exported: their homes stay where they are)
from bootstrap.cluster.guard import fence as fence  # port_clash: check-kv's --port
from bootstrap.cluster.preflight.checks import CHECKS as RACK_CHECKS
from bootstrap.cluster.runtime import UNDECIDED as RUNTIME_UNDECIDED
from bootstrap.doctor.logsources import SOURCES
from bootstrap.exposure import ssh_tunnel_argv
from bootstrap.face import docs as docs
from bootstrap.face.checks import check_kv, check_nccl, doctor, logs, model_hosts
from bootstrap.face.cluster import (
    down,
    down_preview,
    exec_all,
    inventory,
    load_inventory,
    plan,
    status,
    stop_preview,
    sudoers,
    up,
    validate,
)
from bootstrap.face.observe import TopView, monitor_down, monitor_status, monitor_up, purge_preview, top
from bootstrap.face.results import (
    BenchResult,
    DoctorResult,
    DownResult,
    DrainOutcome,
    ExecResult,
    ExposureResult,
    FleetPlanResult,
    FleetStatusResult,
    KvCheckResult,
    LogsResult,
    MonitorResult,
    NcclResult,
    OptionError,
    PlanResult,
    Prometheus,
    RolloutResult,
    SandboxResult,
    ServeOutcome,
    StatusResult,
    UpResult,
)
from bootstrap.face.sandbox import sandbox_down, sandbox_up
from bootstrap.face.serving import adapter, bench, bench_ab, drain, rollout, serve
from bootstrap.fleet import plan as fleet_plan  # check_pd_flags: the vLLM flags a fleet's plan sets
from bootstrap.fleet.plan import FleetPlan
from bootstrap.inventory.envvars import _CREDENTIAL_VALUE  # the one definition of a credential's form
from bootstrap.inventory.values import image_problem
from bootstrap.model import ROUTER_POLICIES
from bootstrap.nccl.parse import bandwidth_note, format_bandwidth
from bootstrap.remote.fanout import DEFAULT_PARALLEL
from bootstrap.serve import benchload as bench_load  # split_url
from bootstrap.serve import benchstats as bench_stats  # format_result
from bootstrap.serve import experts as experts
from bootstrap.serve import flags as serve_flags  # the checks of the user's model and vLLM flags
from bootstrap.serve import mode as mode  # the serving modes: the split rules the options are checked with
from bootstrap.serve.abtest import arm_router  # an A/B arm's policy and settings
from bootstrap.serve.benchload import MAX_TOKENS as MAX_BENCH_TOKENS
from bootstrap.serve.passthrough import CREDENTIAL_FLAGS
from bootstrap.serve.split import split_label
from bootstrap.serve.workloads import WORKLOADS as BENCH_WORKLOADS


def trace_commands(fn) -> None:
    """fn(host, command as shown, exit status or None at a timeout, seconds) after each command run
    over SSH (the CLI's run log and -v); None: nothing."""
    from bootstrap.remote import ssh

    ssh.trace = fn


__all__ = [
    "BENCH_WORKLOADS", "BenchResult", "CREDENTIAL_FLAGS", "DEFAULT_PARALLEL", "DoctorResult", "DownResult",
    "DrainOutcome",
    "ExecResult", "ExposureResult", "FleetPlan", "FleetPlanResult", "FleetStatusResult", "KvCheckResult", "LogsResult",
    "MAX_BENCH_TOKENS", "MonitorResult", "NcclResult", "OptionError", "PlanResult", "Prometheus", "RACK_CHECKS",
    "ROUTER_POLICIES", "RUNTIME_UNDECIDED", "RolloutResult", "SOURCES", "SandboxResult", "ServeOutcome",
    "StatusResult", "TopView",
    "UpResult", "_CREDENTIAL_VALUE", "adapter", "arm_router", "bandwidth_note", "bench", "bench_ab", "bench_load",
    "bench_stats",
    "check_kv", "check_nccl",
    "docs", "doctor", "down", "down_preview", "drain", "exec_all", "experts", "fence", "fleet_plan", "format_bandwidth",
    "image_problem",
    "inventory", "load_inventory", "logs", "mode", "model_hosts", "monitor_down", "monitor_status", "monitor_up",
    "plan", "purge_preview", "rollout",
    "sandbox_down", "sandbox_up", "serve", "serve_flags", "split_label", "ssh_tunnel_argv", "status",
    "stop_preview", "sudoers", "top", "trace_commands", "up", "validate",
]
