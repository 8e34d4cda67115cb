"""Diagnosis on real log excerpts (tests/data/logs) and cluster checks on explicit inputs.

Each excerpt is named <finding id>__<n>.log (clean__<what>.log: a healthy log). Its first lines carry
metadata: `# source: <issue URL>` (or `constructed: ...` where no real report exists), optionally
`# context: infiniband=true` and `# note: ...`. Everything after them is the log as reported.
"""
import re
from pathlib import Path

import pytest

from bootstrap.signatures import (
    GIB,
    MAX_EVIDENCE,
    SEVERITIES,
    SIGNATURES,
    Finding,
    HostReport,
    Interface,
    check_cluster,
    mask_secrets,
    parse_ip_addr,
    root_cause,
    scan_log,
    scan_logs,
    signature,
    sort_findings,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
_META = re.compile(r"^# (source|context|note): ?(.*)$")


def load(path: Path) -> tuple[dict[str, str], str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    meta: dict[str, str] = {}
    while lines and (m := _META.match(lines[0])):
        meta.setdefault(m[1], m[2])
        lines.pop(0)
    return meta, "\n".join(lines)


def context(meta: dict[str, str]) -> dict[str, bool]:
    ctx = {}
    for item in filter(None, (s.strip() for s in meta.get("context", "").split(","))):
        key, _, value = item.partition("=")
        ctx[key] = value.lower() == "true"
    return ctx


EXCERPTS = sorted(p for p in LOGS.glob("*.log") if not p.name.startswith("clean__"))
CLEAN = sorted(LOGS.glob("clean__*.log"))


def expected_id(path: Path) -> str:
    return path.name.split("__")[0]


def flat(text: str) -> str:
    return " ".join(text.split())


# -- the excerpts ----------------------------------------------------------------------------


def test_every_excerpt_names_its_source_and_every_signature_has_one():
    for path in EXCERPTS + CLEAN:
        meta, text = load(path)
        src = meta.get("source", "")
        assert src.startswith(("https://github.com/", "constructed", "captured in this project")), path.name
        assert text.strip(), path.name
        assert mask_secrets(text) == text, path.name  # no token-like strings committed
    covered = {expected_id(p) for p in EXCERPTS}
    assert covered == {s.id for s in SIGNATURES}


@pytest.mark.parametrize("path", EXCERPTS, ids=lambda p: p.name)
def test_excerpt_yields_exactly_its_finding(path):
    meta, text = load(path)
    findings = scan_log("node-a", text, **context(meta))
    assert [f.id for f in findings] == [expected_id(path)]
    f = findings[0]
    assert f.host == "node-a" and f.severity in SEVERITIES
    assert f.title and f.fix
    assert "\n" not in f.evidence and 0 < len(f.evidence) <= MAX_EVIDENCE
    assert f.evidence.strip("…") in flat(text)


@pytest.mark.parametrize("path", [p for p in EXCERPTS if context(load(p)[0])], ids=lambda p: p.name)
def test_infiniband_signatures_need_infiniband(path):
    _, text = load(path)
    assert scan_log("node-a", text) == []


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_healthy_logs_yield_nothing(path):
    meta, text = load(path)
    assert scan_log("node-a", text, **context(meta)) == []


# -- what a finding says ---------------------------------------------------------------------


def findings_for(name: str, host="node-a") -> list[Finding]:
    meta, text = load(LOGS / name)
    return scan_log(host, text, **context(meta))


def test_ray_ip_mismatch_names_the_requested_node_ip():
    (f,) = findings_for("ray-ip-mismatch__1.log")
    assert f.severity == "error"
    assert "'node:111.6.168.225': 0.001" in f.evidence
    assert "VLLM_HOST_IP" in f.fix and "--node-ip-address" in f.fix
    # the placement-group wait in the same log is its symptom, not a second finding
    assert [x.id for x in findings_for("ray-ip-mismatch__1.log")] == ["ray-ip-mismatch"]


def test_ansi_colour_codes_are_not_evidence():
    (f,) = scan_log("h", "\x1b[33m(autoscaler +21m12s)\x1b[0m Error: No available node types can "
                         "fulfill resource request {'node:10.2.0.127': 0.001, 'GPU': 1.0}.")
    assert f.id == "ray-ip-mismatch" and "\x1b" not in f.evidence
    assert f.evidence.startswith("(autoscaler +21m12s) Error: No available node types")


def test_severity_is_the_worst_matching_line_and_evidence_the_first():
    (loop_then_fail,) = findings_for("gloo-loopback__1.log")
    assert loop_then_fail.severity == "error"
    assert "Using the loopback address as fallback" in loop_then_fail.evidence
    (loop_only,) = findings_for("gloo-loopback__2.log")
    assert loop_only.severity == "warning" and loop_only.evidence.startswith("[rank7]")
    assert findings_for("placement-group-wait__1.log")[0].severity == "warning"  # still waiting
    (gave_up,) = findings_for("placement-group-wait__2.log")
    assert gave_up.severity == "error"
    assert "number of required GPUs exceeds" in gave_up.evidence


def test_nccl_env_overwritten_fix_lists_the_per_node_names():
    (copied,) = findings_for("nccl-env-overwritten__1.log")
    assert copied.severity == "warning"
    assert '"NCCL_SOCKET_IFNAME"' in copied.fix and '"NCCL_IB_HCA"' in copied.fix
    assert "NCCL_DEBUG" not in copied.fix  # same on every node: fine to copy
    assert "ray_non_carry_over_env_vars.json" in copied.fix
    (overwritten,) = findings_for("nccl-env-overwritten__2.log")
    assert overwritten.severity == "error"  # a worker's own value was replaced
    assert overwritten.evidence.startswith("INFO 07-11 09:57:11 [ray_distributed_executor.py:355]")


def test_causes_suppress_their_symptoms():
    assert [f.id for f in findings_for("nccl-shm__1.log")] == ["nccl-shm"]
    assert [f.id for f in findings_for("socket-ifname-missing__1.log")] == ["socket-ifname-missing"]
    assert [f.id for f in findings_for("nccl-ib-no-device__1.log")] == ["nccl-ib-no-device"]
    # without the cause, the symptom stands
    assert [f.id for f in scan_log("h", "RuntimeError: NCCL error: unhandled system error")] == [
        "nccl-unhandled-system-error"]


def test_ray_scheduler_warning_counts_only_for_gpu_requests():
    # Ray's own warning format, as in ray-project/ray's docs and user logs
    gpu = ("(autoscaler +2s) Warning: The following resource request cannot be scheduled right now: "
           "{'GPU': 1.0, 'CPU': 1.0}. This is likely due to all cluster resources being claimed by actors.")
    (f,) = scan_log("head", gpu)
    assert (f.id, f.severity) == ("placement-group-wait", "warning")
    assert scan_log("head", gpu.replace("'GPU': 1.0, ", "")) == []


def test_shm_exhaustion_is_not_reported_as_a_full_disk():
    line = "OSError: [Errno 28] No space left on device: '/dev/shm/psm_1234'"
    assert scan_log("h", line) == []
    assert [f.id for f in scan_log("h", "OSError: [Errno 28] No space left on device: '/root/.cache'")] \
        == ["disk-full"]


def test_ray_module_submodules_are_not_a_missing_ray():
    assert scan_log("h", "ModuleNotFoundError: No module named 'ray.core.generated.ray.protocol'") == []
    assert [f.id for f in scan_log("h", "ModuleNotFoundError: No module named 'ray'")] == ["ray-missing"]


def test_a_cuda_kernels_illegal_instruction_is_not_the_cpus():
    cuda = "RuntimeError: CUDA error: an illegal instruction was encountered"
    assert "worker-illegal-instruction" not in [f.id for f in scan_log("h", cuda)]
    died = "ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died unexpectedly (exit code: -4), shutting down"
    assert [f.id for f in scan_log("h", died)] == ["worker-illegal-instruction"]
    other = "ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down"
    assert "worker-illegal-instruction" not in [f.id for f in scan_log("h", other)]


def test_long_lines_are_cut_around_the_match():
    (f,) = findings_for("port-in-use__2.log")
    assert len(f.evidence) <= MAX_EVIDENCE
    assert "Address already in use" in f.evidence and f.evidence.startswith("…")


def test_tokens_never_reach_evidence():
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    text = (f"HF_TOKEN={token} huggingface_hub.errors.GatedRepoError: 401 Client Error. "
            f"Cannot access gated repo for url https://huggingface.co/x/y (token {token})")
    (f,) = scan_log("h", text)
    assert f.id == "hf-auth" and token not in f.evidence and "hf_***" in f.evidence
    assert "HF_TOKEN=***" in f.evidence
    long_line = "x" * 400 + f" {token} GatedRepoError " + "y" * 400
    (g,) = scan_log("h", long_line)
    assert token[:10] not in g.evidence


def test_one_finding_per_id_and_host_and_merged_order():
    ray_missing = load(LOGS / "ray-missing__3.log")[1]
    twice = ray_missing + "\n" + ray_missing + "\nModuleNotFoundError: No module named 'ray'"
    assert len(scan_log("w1", twice)) == 1
    logs = {"w2": load(LOGS / "nccl-socket-with-ib__1.log")[1], "w1": twice,
            "head": load(LOGS / "placement-group-wait__1.log")[1]}
    merged = scan_logs(logs, infiniband=True)
    assert [(f.severity, f.host, f.id) for f in merged] == [
        ("error", "w1", "ray-missing"),
        ("warning", "head", "placement-group-wait"),
        ("warning", "w2", "nccl-socket-with-ib"),
    ]


def test_signature_table_is_consistent():
    ids = [s.id for s in SIGNATURES]
    assert len(ids) == len(set(ids))
    for s in SIGNATURES:
        assert s.severity in SEVERITIES and s.title and s.fix and s.sources and s.patterns
        assert all(p.severity in (None, *SEVERITIES) for p in s.patterns)
        assert set(s.suppressed_by) <= set(ids) and s.id not in s.suppressed_by
        assert signature(s.id) is s


def test_sort_findings():
    fs = [Finding("b", "warning", "n2", "t", "e", "f"), Finding("a", "info", None, "t", "e", "f"),
          Finding("c", "error", "n2", "t", "e", "f"), Finding("d", "warning", None, "t", "e", "f"),
          Finding("e", "error", "n1", "t", "e", "f")]
    assert [f.id for f in sort_findings(fs)] == ["e", "c", "d", "b", "a"]


def test_tp_heads_fix_lists_the_tp_sizes_that_divide_the_heads():
    (f,) = findings_for("tp-heads-indivisible__1.log")
    assert f.severity == "error"
    assert "64 attention heads" in f.fix and "one of 1, 2, 4, 8, 16, 32, 64 " in f.fix
    assert "--tp" in f.fix and "--pp" in f.fix and "bootstrap serve --dry-run" in f.fix
    (pydantic,) = findings_for("tp-heads-indivisible__2.log")
    assert pydantic.evidence.startswith("(APIServer pid=1) Value error, Total number of attention heads (4)")
    assert "one of 1, 2, 4 " in pydantic.fix
    # the KV-head variant names no numbers: the fix explains the rule instead
    (kv,) = findings_for("tp-heads-indivisible__3.log")
    assert "assert self.total_num_kv_heads % tp_size == 0" in kv.evidence
    assert "num_key_value_heads" in kv.fix and "--tp" in kv.fix


def test_tp_kv_heads_split_by_qkv_parallel_linear():
    # constructed from vllm/model_executor/layers/linear.py (QKVParallelLinear.__init__) and
    # vllm/distributed/utils.py (divide -> ensure_divisibility): 4 KV heads over TP 6
    log = """\
(Worker_TP0 pid=212)   File "/opt/venv/vllm/model_executor/layers/linear.py", line 1055, in __init__
(Worker_TP0 pid=212)     self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)
(Worker_TP0 pid=212)                                 ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(Worker_TP0 pid=212)   File "/opt/venv/vllm/distributed/utils.py", line 61, in divide
(Worker_TP0 pid=212)     ensure_divisibility(numerator, denominator)
(Worker_TP0 pid=212)   File "/opt/venv/vllm/distributed/utils.py", line 53, in ensure_divisibility
(Worker_TP0 pid=212)     assert numerator % denominator == 0, (
(Worker_TP0 pid=212)            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^
(Worker_TP0 pid=212) AssertionError: 6 is not divisible by 4"""
    assert [f.id for f in scan_log("h", log)] == ["tp-heads-indivisible"]
    assert root_cause(log) == "AssertionError: 6 is not divisible by 4"


def test_pp_layer_counts_of_older_vllm_and_of_the_partition_variable():
    # vLLM before 0.5.1 required the layers to divide evenly (vllm/config.py verify_with_parallel_config)
    old = "ValueError: Total number of hidden layers (30) must be divisible by pipeline parallel size (4)."
    assert [f.id for f in scan_log("h", old)] == ["pp-invalid"]
    assert [f.id for f in scan_log("h", "ValueError: len(partitions)=3 does not match pp_size=2.")] == [
        "pp-invalid"]
    (f,) = findings_for("pp-invalid__3.log")
    assert "sum(partitions)=30 does not match num_hidden_layers=32" in f.evidence
    assert "--pp 1" in f.fix and "VLLM_PP_LAYER_PARTITION" in f.fix
    # vLLM's INFO line about an uneven split is no error
    assert scan_log("h", "INFO 07-03 [utils.py:160] Hidden layers were unevenly partitioned: [16,16,15,15]. "
                         "This can be manually overridden using the VLLM_PP_LAYER_PARTITION environment "
                         "variable") == []


def test_max_model_len_fix_names_the_models_limit():
    (current,) = findings_for("max-model-len-too-long__3.log")
    assert "32768 tokens (max_position_embeddings=32768)" in current.fix
    assert "bootstrap serve MODEL -- --max-model-len 32768" in current.fix
    (old,) = findings_for("max-model-len-too-long__1.log")  # vLLM 0.4: "(None=8192 in model's config.json)"
    assert "-- --max-model-len 8192" in old.fix and "None" not in old.fix
    # a model_max_length above the derived length is the real limit (vLLM accepts up to it)
    line = ("ValueError: User-specified max_model_len (200000) is greater than the derived max_model_len "
            "(max_position_embeddings=4096 or model_max_length=131072 in model's config.json).")
    (f,) = scan_log("h", line)
    assert "-- --max-model-len 131072" in f.fix and "model_max_length=131072" in f.fix
    assert "-- --max-model-len N" in signature("max-model-len-too-long").fix


# -- root cause ------------------------------------------------------------------------------


def test_root_cause_of_a_plain_traceback():
    log = """\
INFO 05-15 15:13:52 api_server.py:220] vLLM API server version 0.4.2
Traceback (most recent call last):
  File "/usr/local/lib/python3.10/dist-packages/vllm/config.py", line 1087, in verify_with_parallel_config
    raise ValueError(
ValueError: Total number of attention heads (40) must be divisible by tensor parallel size (3).
"""
    assert root_cause(log) == ("ValueError: Total number of attention heads (40) must be divisible by tensor "
                               "parallel size (3).")


def test_root_cause_of_a_pydantic_validation_error_drops_the_type_tail():
    _, log = load(LOGS / "tp-heads-indivisible__2.log")
    assert root_cause(log) == ("Value error, Total number of attention heads (4) must be divisible by tensor "
                               "parallel size (3).")
    # a field error keeps the field's name
    field = """\
pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig
pipeline_parallel_size
  Input should be greater than or equal to 1 [type=greater_than_equal, input_value=0, input_type=int]
    For further information visit https://errors.pydantic.dev/2.13/v/greater_than_equal"""
    assert root_cause(field) == "pipeline_parallel_size: Input should be greater than or equal to 1"


def test_root_cause_skips_the_front_ends_wrapper_in_a_multi_process_log():
    # captured in this project's sandbox: EngineCore fails, the API server ends the log with a wrapper
    _, log = load(LOGS / "nccl-shm__vllm_cpu_sandbox.log")
    assert log.rstrip().endswith("See root cause above. Failed core proc(s): {}")
    assert root_cause(log) == ("RuntimeError: Insufficient space in /dev/shm for shared-memory allocation: 160 "
                               "MiB required, 64 MiB free. Increase /dev/shm (e.g. --shm-size or --ipc=host).")
    # Ray workers inside the engine core, two wrappers after the cause
    _, ray = load(LOGS / "pp-invalid__3.log")
    ray += ("\n(APIServer pid=1) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
            "See stack trace (above) for the root cause.")
    assert root_cause(ray) == "ValueError: sum(partitions)=30 does not match num_hidden_layers=32."
    # only a wrapper: better than nothing
    assert root_cause("RuntimeError: Engine core initialization failed. See root cause above. Failed core "
                      "proc(s): {'EngineCore_DP0': 1}") == ("RuntimeError: Engine core initialization failed. "
                                                            "See root cause above. Failed core proc(s): "
                                                            "{'EngineCore_DP0': 1}")


def test_root_cause_reads_through_ansi_colours_and_nested_prefixes():
    log = ("\x1b[1;36m(EngineCore_DP0 pid=6183)\x1b[0;0m \x1b[1;36m(RayWorkerWrapper pid=1672, ip=10.0.0.7)"
           "\x1b[0;0m ERROR 11-24 22:55:35 [worker_base.py:620] Traceback (most recent call last):\n"
           "\x1b[1;36m(EngineCore_DP0 pid=6183)\x1b[0;0m \x1b[1;36m(RayWorkerWrapper pid=1672, ip=10.0.0.7)"
           "\x1b[0;0m ERROR 11-24 22:55:35 [worker_base.py:620] \x1b[31mtorch.distributed.DistBackendError: "
           "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.hpp:268, unhandled system error\x1b[0m"
           "\r\n")
    assert root_cause(log) == ("torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
                               "c10d/NCCLUtils.hpp:268, unhandled system error")


def test_root_cause_of_a_bare_assertion_names_the_assert():
    _, log = load(LOGS / "tp-heads-indivisible__3.log")
    assert root_cause(log) == "AssertionError at `assert self.total_num_kv_heads % tp_size == 0`"
    assert root_cause("AssertionError") is None  # no traceback above it: just a word


@pytest.mark.parametrize("path", CLEAN, ids=lambda p: p.name)
def test_root_cause_of_a_healthy_log_is_none(path):
    assert root_cause(load(path)[1]) is None


def test_root_cause_is_one_masked_trimmed_line():
    assert root_cause("") is None
    assert root_cause("INFO Started server process\nTraceback (most recent call last):\n  File \"x.py\", "
                      "line 1, in <module>\n    raise ValueError(msg)\n") is None
    token = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123"
    long = root_cause(f"OSError: token {token} refused " + "x" * 500 + "\nsecond line of the message")
    assert long is not None and "\n" not in long and len(long) <= MAX_EVIDENCE and long.endswith("…")
    assert token not in long and "hf_***" in long


@pytest.mark.parametrize("path", [p for p in EXCERPTS
                                  if expected_id(p) in ("tp-heads-indivisible", "pp-invalid",
                                                        "max-model-len-too-long")], ids=lambda p: p.name)
def test_root_cause_of_a_config_error_is_the_signatures_own_line(path):
    # the screen shows root_cause; the finding's signature must recognise that one line too
    rc = root_cause(load(path)[1])
    assert rc is not None
    assert [f.id for f in scan_log("h", rc)] == [expected_id(path)]


# -- cluster checks --------------------------------------------------------------------------

# `ip -o addr show` on a Docker host (captured on the development machine).
IP_O_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
4: eth0    inet 192.0.2.2/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever preferred_lft forever
4: eth0    inet6 fd00::2/64 scope global nodad \\       valid_lft forever preferred_lft forever
4: eth0    inet6 fe80::fc:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever
5: docker0    inet 172.17.0.1/16 brd 172.17.255.255 scope global docker0\\       valid_lft forever preferred_lft forever
5: docker0    inet6 fe80::42:92ff:fe58:cfe2/64 scope link \\       valid_lft forever preferred_lft forever
194: br-1514c9ba53e4    inet 172.31.240.1/24 brd 172.31.240.255 scope global br-1514c9ba53e4\\       valid_lft forever preferred_lft forever
196: veth679ea96    inet6 fe80::885a:7dff:fe5a:5b2b/64 scope link \\       valid_lft forever preferred_lft forever
"""
IFACES = parse_ip_addr(IP_O_ADDR)


def test_parse_ip_addr():
    assert [i.name for i in IFACES] == ["lo", "eth0", "docker0", "br-1514c9ba53e4", "veth679ea96"]
    assert IFACES[1] == Interface("eth0", ("192.0.2.2", "fd00::2", "fe80::fc:ff:fe00:1"))
    assert parse_ip_addr("3: eth1@if12    inet 10.0.0.7/24 scope global eth1") == (
        Interface("eth1", ("10.0.0.7",)),)
    assert parse_ip_addr("") == ()


def only(findings: list[Finding], id: str) -> list[Finding]:
    return [f for f in findings if f.id == id]


def test_healthy_cluster_has_no_findings():
    reports = [HostReport(h, gpu_count=8, gpu_names=("NVIDIA H100 80GB HBM3",) * 8,
                          driver_version="550.54.15", clock_epoch=1_700_000_000.0 + i * 0.3,
                          disk_free_bytes=200 * GIB, ip=ip, vllm_host_ip=ip, ray_node_ip=ip,
                          interfaces=(Interface("lo", ("127.0.0.1",)), Interface("ens5", (ip,))),
                          socket_env=(("NCCL_SOCKET_IFNAME", "ens"), ("GLOO_SOCKET_IFNAME", "ens5")))
               for i, (h, ip) in enumerate([("head", "10.0.0.1"), ("w1", "10.0.0.2")])]
    assert check_cluster(reports, image_size_bytes=20 * GIB) == []


def test_gpu_count_mismatch_names_the_odd_node():
    fs = check_cluster([HostReport("a", gpu_count=8), HostReport("b", gpu_count=4),
                        HostReport("c", gpu_count=8)])
    (f,) = fs
    assert (f.id, f.severity, f.host) == ("gpu-count-mismatch", "warning", "b")
    assert "b: 4 GPUs; the other nodes: 8 GPUs" in f.evidence
    # no majority: one cluster-wide finding that lists everyone
    (g,) = check_cluster([HostReport("a", gpu_count=8), HostReport("b", gpu_count=4)])
    assert g.host is None and "a: 8 GPUs; b: 4 GPUs" in g.evidence


def test_a_node_without_gpus_is_an_error():
    fs = check_cluster([HostReport("a", gpu_count=8), HostReport("b", gpu_count=0)])
    assert [(f.id, f.host, f.severity) for f in fs] == [("gpu-not-visible", "b", "error")]
    assert "b: 0 GPUs" in fs[0].evidence


def test_gpu_model_and_driver_mismatch():
    fs = check_cluster([
        HostReport("a", gpu_names=("NVIDIA H100 80GB HBM3",) * 8, driver_version="550.54.15"),
        HostReport("b", gpu_names=("NVIDIA A100-SXM4-80GB",) * 8, driver_version="535.104.05"),
        HostReport("c", gpu_names=("NVIDIA H100 80GB HBM3",) * 8, driver_version="550.54.15"),
    ])
    assert [(f.id, f.host) for f in fs] == [("driver-mismatch", "b"), ("gpu-model-mismatch", "b")]
    assert "b: driver 535.104.05; the other nodes: driver 550.54.15" in fs[0].evidence
    assert "NVIDIA A100-SXM4-80GB" in fs[1].evidence


def test_clock_skew_names_nodes_and_offset():
    fs = check_cluster([HostReport("head", clock_epoch=1000.0), HostReport("w1", clock_epoch=1000.4),
                        HostReport("w2", clock_epoch=996.75)], max_skew_s=1.0)
    (f,) = fs
    assert (f.id, f.host, f.severity) == ("clock-skew", "w2", "warning")
    assert "w2 is -3.25 s from head" in f.evidence and "behind" in f.title
    assert "timedatectl set-ntp true" in f.fix
    assert check_cluster([HostReport("head", clock_epoch=1000.0), HostReport("w1", clock_epoch=1000.4)],
                         max_skew_s=0.25)[0].host == "w1"


def test_low_disk_for_the_image():
    fs = check_cluster([HostReport("a", disk_free_bytes=30 * GIB), HostReport("b", disk_free_bytes=40 * GIB)],
                       image_size_bytes=20 * GIB)  # needs 20 x 1.2 + 10 = 34 GiB
    (f,) = fs
    assert (f.id, f.host, f.severity) == ("disk-low", "a", "error")
    assert "a: 30.0 GiB free, needs 34.0 GiB (image 20.0 GiB x 1.2 + 10 GiB)" in f.evidence
    (g,) = check_cluster([HostReport("a", disk_free_bytes=19 * GIB),
                          HostReport("b", disk_free_bytes=21 * GIB)])
    assert g.host == "a" and "needs 20.0 GiB (20 GiB, image size unknown)" in g.evidence


def test_vllm_host_ip_differs_from_ray_node_ip():
    fs = check_cluster([HostReport("w1", vllm_host_ip="192.168.1.12", ray_node_ip="10.0.0.12"),
                        HostReport("w2", vllm_host_ip="10.0.0.13", ray_node_ip="10.0.0.13")])
    (f,) = fs
    assert (f.id, f.host, f.severity) == ("ray-ip-mismatch", "w1", "error")
    assert "VLLM_HOST_IP=192.168.1.12, Ray node IP=10.0.0.12" in f.evidence
    assert "--node-ip-address=10.0.0.12" in f.fix


def test_socket_ifname_naming_a_missing_interface_proposes_the_one_holding_the_ip():
    r = HostReport("w1", ip="192.0.2.2", interfaces=IFACES, socket_env=(("NCCL_SOCKET_IFNAME", "ens5"),))
    (f,) = check_cluster([r])
    assert (f.id, f.host, f.severity) == ("socket-ifname-missing", "w1", "error")
    assert f.evidence.startswith("NCCL_SOCKET_IFNAME=ens5 matches no interface; interfaces: lo (127.0.0.1), "
                                 "eth0 (192.0.2.2)")
    assert "NCCL_SOCKET_IFNAME=eth0" in f.fix and "192.0.2.2" in f.fix


def test_socket_ifname_on_an_interface_without_the_node_ip():
    r = HostReport("w1", ip="192.0.2.2", interfaces=IFACES,
                   socket_env=(("GLOO_SOCKET_IFNAME", "docker0"), ("NCCL_SOCKET_IFNAME", "eth")))
    (f,) = check_cluster([r])  # NCCL's prefix "eth" selects eth0, which holds the IP: fine
    assert (f.id, f.host, f.severity) == ("socket-ifname-wrong-ip", "w1", "warning")
    assert "GLOO_SOCKET_IFNAME=docker0 selects docker0 (172.17.0.1), not the interface holding 192.0.2.2" \
        in f.evidence
    assert "GLOO_SOCKET_IFNAME=eth0" in f.fix


def test_socket_ifname_syntax_per_variable():
    base = dict(ip="192.0.2.2", interfaces=IFACES)
    # NCCL: exclusion list and exact match
    exclude = (("NCCL_SOCKET_IFNAME", "^lo,docker,br-,veth"),)
    assert check_cluster([HostReport("a", **base, socket_env=exclude)]) == []
    assert only(check_cluster([HostReport("a", **base, socket_env=(("NCCL_SOCKET_IFNAME", "=eth"),))]),
                "socket-ifname-missing")
    # an exclusion list that leaves only the wrong networks
    (w,) = check_cluster([HostReport("a", **base, socket_env=(("NCCL_SOCKET_IFNAME", "^lo,eth"),))])
    assert w.id == "socket-ifname-wrong-ip"
    # Gloo takes plain names: NCCL's syntax is a missing interface (aws-samples/aws-do-eks#51)
    (g,) = check_cluster([HostReport("a", **base, socket_env=(("GLOO_SOCKET_IFNAME", "^lo,docker"),))])
    assert g.id == "socket-ifname-missing" and "GLOO_SOCKET_IFNAME=^lo,docker" in g.evidence
    assert "plain interface names" in g.fix
    # without interface facts nothing is checked
    assert check_cluster([HostReport("a", ip="192.0.2.2", socket_env=(("NCCL_SOCKET_IFNAME", "x"),))]) == []


def test_cluster_findings_are_ordered_errors_first():
    fs = check_cluster([
        HostReport("a", gpu_count=8, clock_epoch=0.0, disk_free_bytes=100 * GIB),
        HostReport("b", gpu_count=8, clock_epoch=5.0, disk_free_bytes=1 * GIB),
        HostReport("c", gpu_count=4, clock_epoch=0.0, disk_free_bytes=100 * GIB,
                   vllm_host_ip="1.1.1.1", ray_node_ip="2.2.2.2"),
    ])
    assert [(f.severity, f.host, f.id) for f in fs] == [
        ("error", "b", "disk-low"), ("error", "c", "ray-ip-mismatch"),
        ("warning", "b", "clock-skew"), ("warning", "c", "gpu-count-mismatch")]


def test_root_cause_of_a_refused_command_line_is_vllms_usage_error():
    log = ("[bootstrap-member] starting vllm serve /opt/models/tiny-llama ...\n"
           "usage: vllm [-h] [-v] {chat,complete,serve,bench} ...\n"
           "vllm: error: unrecognized arguments: --no-such-vllm-flag\n")
    assert root_cause(log) == "vllm: error: unrecognized arguments: --no-such-vllm-flag"
    assert root_cause("INFO all good\nerror: something else\n") is None


def test_a_password_in_a_url_is_masked_in_evidence():
    line = "ERROR proxy http://bob:Hunter2pw@proxy.corp:3128 refused; retry https://:tok3n@reg.local/v2 and http://h:80/"
    masked = mask_secrets(line)
    assert "Hunter2pw" not in masked and "tok3n" not in masked
    assert "http://bob:***@proxy.corp:3128" in masked and "https://:***@reg.local/v2" in masked
    assert "http://h:80/" in masked and mask_secrets(masked) == masked
