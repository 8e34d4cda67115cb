"""The KV transfer check of a disaggregated fleet, without a host: which heads check against which,
what each side runs, and what real output of checks/kv_check.py means (tests/data/kv: one NVIDIA
H200 with both sides on loopback, GPU memory; see tests/data/kv/README.md). The sandbox runs it
between two nodes (tests/sandbox/test_sandbox_zfleet.py) and the script itself on CPU below."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.fleet import kvcheck as KV
from tests.support.fleet_inventories import fleet_yaml, load

DATA = Path(__file__).resolve().parents[1] / "data" / "kv"
ROOT = Path(__file__).resolve().parents[2]
PD = """
router:
  prefill: [0]
"""


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_every_decode_node_checks_against_every_prefill_node(tmp_path):
    inv = load(tmp_path, fleet_yaml(3, 3, cluster="router:\n  prefill: [0, 2]\n"))
    got = [(p.source.name, p.reader.name, p.source_replica, p.reader_replica) for p in KV.pairs(inv)]
    heads = [g[0].name for g in inv.replicas]
    assert got == [(heads[0], heads[1], 0, 1), (heads[2], heads[1], 2, 1)]
    # replicas of two nodes, or of different sizes: every decode worker reads the prefill workers
    two = load(tmp_path, fleet_yaml(4, 2, cluster="router:\n  prefill: [0]\n"))
    (p0, p1), (d0, d1) = ([h.name for h in g] for g in two.replicas)
    assert [(p.source.name, p.reader.name) for p in KV.pairs(two)] == [(p0, d0), (p0, d1), (p1, d0), (p1, d1)]
    uneven = load(tmp_path, fleet_yaml(3, 2, cluster="router:\n  prefill: [0]\n",
                                       extra={0: "replica: 0", 1: "replica: 1", 2: "replica: 1"}))
    assert [(p.source.name, p.reader.name, p.reader_replica) for p in KV.pairs(uneven)] == [
        ("h0", "h1", 1), ("h0", "h2", 1)]
    assert KV.pairs(load(tmp_path, fleet_yaml(4, 2))) == []  # no disaggregation, no check


def test_each_side_gets_its_own_ip_the_side_channel_port_and_the_members_ucx_variables(tmp_path):
    text = fleet_yaml(2, 2, cluster=PD + "gpus_per_node: 8\ninfiniband: true\n")
    inv = load(tmp_path, text.replace("accelerator: none", "accelerator: gpu", 1))
    (pair,) = KV.pairs(inv)
    ucx = {"UCX_NET_DEVICES": "mlx5_0:1"}
    src = KV.source_args(inv, pair, ucx)
    rdr = KV.reader_args(inv, pair, ucx)
    assert src[:3] == ["source", "--ip", pair.source.ip]
    assert rdr[:5] == ["reader", "--ip", pair.reader.ip, "--peer", pair.source.ip]
    for args in (src, rdr):
        assert args[args.index("--port") + 1] == str(inv.cluster.ports.kv_transfer)
        assert args[args.index("--device") + 1] == "cuda"  # the KV buffer where vLLM keeps it on GPU nodes
        assert "UCX_NET_DEVICES=mlx5_0:1" in args
    # the reader says which transport, on stderr (its stdout is the script's JSON lines)
    assert {"UCX_PROTO_INFO=y", "UCX_LOG_FILE=stderr"} <= set(rdr) and "UCX_PROTO_INFO=y" not in src
    cpu = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    args = KV.source_args(cpu, KV.pairs(cpu)[0], {})
    assert args[args.index("--device") + 1] == "cpu"


def _pair(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2, cluster=PD))
    return KV.pairs(inv)[0]


def test_a_real_gpu_read_parses_to_its_figures_and_the_transport_ucx_chose(tmp_path):
    pair = _pair(tmp_path)
    res = KV.parse(pair, read("h200-cuda-source.txt"), 0, read("h200-cuda-reader.txt"), 0)
    assert res.ok and res.error == ""
    assert (res.device, res.bytes, res.gbps) == ("cuda", 16777216, 0.441)
    assert res.best_s == pytest.approx(0.038024) and res.first_s == pytest.approx(0.0418)
    # one GPU, two processes, under gVisor: UCX emulated the GPU-memory read over TCP on loopback
    assert res.via == ("tcp/lo (software emulation)",) and res.rdma is False
    line = res.describe()
    assert line.startswith(f"{pair.reader.name} (decode) read 16 MiB of cuda memory from {pair.source.name} "
                           "(prefill) over NIXL via tcp/lo (software emulation): 0.441 GB/s"), line
    assert res.to_dict()["via"] == ["tcp/lo (software emulation)"]


def test_the_final_scripts_gpu_run_with_ucx_on_stderr_parses_the_same_way(tmp_path):
    pair = _pair(tmp_path)
    res = KV.parse(pair, read("h200-stderr-source.out"), 0, read("h200-stderr-reader.out"), 0,
                   read("h200-stderr-reader.err"))
    assert res.ok and (res.device, res.gbps, res.via) == ("cuda", 0.578, ("tcp/lo (software emulation)",)), res
    assert KV.parse(pair, read("h200-stderr-source.out"), 0, read("h200-stderr-reader.out"), 0).via == ()


def test_reads_over_tcp_are_a_warning_only_where_the_inventory_says_infiniband(tmp_path):
    pair = _pair(tmp_path)
    res = KV.parse(pair, read("h200-cuda-source.txt"), 0, read("h200-cuda-reader.txt"), 0)
    assert res.warning(False) is None
    w = res.warning(True)
    assert w and "read over tcp/lo (software emulation), not InfiniBand" in w and "/dev/infiniband" in w
    rdma = KV.PairResult("a", "b", True, via=("rc_mlx5/mlx5_0:1 (zero-copy)",))
    assert rdma.rdma is True and rdma.warning(True) is None
    assert KV.PairResult("a", "b", True).rdma is None  # UCX said nothing: no claim either way


def test_ucx_protocol_tables_other_than_the_read_are_not_taken_for_it():
    table = """\
[1.1] [vm:5  :0]   +--------+-------------+----------------+
[1.1] [vm:5  :0]   | kvcheck-reader-1 intra-node cfg#2    |
[1.1] [vm:5  :0]   | active message by ucp_am_send*(egr) from host memory |
[1.1] [vm:5  :0]   +--------+-------------+----------------+
[1.1] [vm:5  :0]   |  Range | Description |     Config     |
[1.1] [vm:5  :0]   +--------+-------------+----------------+
[1.1] [vm:5  :0]   | 0..inf | zero-copy   | tcp/eth0       |
[1.1] [vm:5  :0]   +--------+-------------+----------------+
[1.2] [vm:5  :0]   | kvcheck-reader-1 inter-node cfg#3    |
[1.2] [vm:5  :0]   | remote memory read by ucp_get*(multi) into cuda/GPU0 from cuda/dev[0] |
[1.2] [vm:5  :0]   +------------+-------------+-------------------+
[1.2] [vm:5  :0]   |   Range    | Description |      Config       |
[1.2] [vm:5  :0]   +------------+-------------+-------------------+
[1.2] [vm:5  :0]   |  0..8192   | short       | rc_mlx5/mlx5_0:1  |
[1.2] [vm:5  :0]   | 8193..inf  | zero-copy   | rc_mlx5/mlx5_0:1  |
[1.2] [vm:5  :0]   +------------+-------------+-------------------+
{"event":"result","ok":true}
"""
    assert KV.read_protocols(table) == ("rc_mlx5/mlx5_0:1 (short)", "rc_mlx5/mlx5_0:1 (zero-copy)")
    assert KV.read_protocols("no tables here") == ()


@pytest.mark.parametrize("case, reader_rc, source_rc, expect", [
    ("hidden", 1, 1, "buffer on the decode side: --device cuda but CUDA is not available in this container"),
    ("wrongdev", 1, 1, "agent on the decode side: nixlBackendError: NIXL_ERR_BACKEND"),
])
def test_real_failures_name_the_phase_the_side_and_the_cause(tmp_path, case, reader_rc, source_rc, expect):
    pair = _pair(tmp_path)
    res = KV.parse(pair, read(f"h200-{case}-source.txt"), source_rc, read(f"h200-{case}-reader.txt"), reader_rc)
    assert not res.ok and res.error == expect, res.error
    assert res.describe() == f"{pair.reader.name} could not read KV from {pair.source.name}: {expect}"


def test_the_transport_is_read_from_the_readers_stderr_and_a_line_glued_to_a_table_still_counts(tmp_path):
    pair = _pair(tmp_path)
    text = read("h200-cuda-reader.txt")
    events = "\n".join(ln for ln in text.splitlines() if ln.startswith("{"))
    tables = "\n".join(ln for ln in text.splitlines() if not ln.startswith("{"))
    res = KV.parse(pair, read("h200-cuda-source.txt"), 0, events, 0, tables)
    assert res.ok and res.via == ("tcp/lo (software emulation)",)
    # seen on the sandbox before UCX wrote to stderr: UCX's table row and the script's line on one line
    row = "[1.1] [node2:581  :0]   | Range  | Description | Config   "
    glued = events.replace('{"event":"result"', row + '{"event":"result"')
    assert KV.parse(pair, read("h200-cuda-source.txt"), 0, glued, 0).ok


def test_the_lines_shown_under_a_failure_leave_out_ucxs_tables_and_nixls_info():
    lines = KV.log_lines(read("h200-wrongdev-reader.txt"))
    assert any("network device 'mlx5_9:1' is not available" in ln for ln in lines), lines
    assert lines[-1].startswith('{"event":"result","ok":false'), lines
    assert not [ln for ln in KV.log_lines(read("h200-cuda-reader.txt"), 50) if "|" in ln or "NIXL INFO" in ln]


def test_a_side_that_died_without_a_result_is_named_with_its_last_line(tmp_path):
    pair = _pair(tmp_path)
    ok_reader = read("h200-cuda-reader.txt")
    res = KV.parse(pair, '{"event":"phase","phase":"import","ok":true}\nKilled\n', 137, ok_reader, 0)
    assert not res.ok and res.error == "the prefill side stopped after import (exit 137): Killed", res.error
    res = KV.parse(pair, "", None, "", None)
    assert res.error == "the decode side stopped (exit None): no output"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_script_reports_an_unreachable_prefill_side_and_a_missing_nixl_in_one_line_each():
    """The script itself, on this machine (no NIXL, no torch here or NIXL without a peer): every
    failure is a phase line and a result line on stdout, exit 1, no traceback alone."""
    port = _free_port()
    r = subprocess.run([sys.executable, str(ROOT / "checks" / "kv_check.py"), "reader", "--ip", "127.0.0.1",
                        "--peer", "127.0.0.1", "--port", str(port), "--timeout", "3"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r
    events = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert events[-1]["event"] == "result" and events[-1]["ok"] is False, r.stdout
    assert events[-2]["event"] == "phase" and events[-2]["ok"] is False
    # without torch or NIXL (this machine) the import fails; with both, nobody listens on the port
    assert events[-2]["phase"] in ("import", "exchange"), events
    if events[-2]["phase"] == "exchange":
        assert f"could not reach the prefill side 127.0.0.1:{port}" in events[-2]["error"]


def test_check_kv_without_disaggregation_is_refused_in_one_line_before_any_host_is_reached(tmp_path, no_hosts):
    from click.testing import CliRunner

    from bootstrap.cli import main
    from tests.support.fleet_inventories import write

    path = write(tmp_path, fleet_yaml(4, 2))
    r = CliRunner().invoke(main, ["check-kv", "-i", str(path)], env={"HF_TOKEN": "x"})
    assert r.exit_code == 2, r.output
    assert "check-kv checks the KV path between prefill and decode replicas" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


@pytest.mark.parametrize("port, words", [
    ("8000", "8000 is cluster.ports.vllm"), ("30000", "30000 is cluster.router.port"),
    ("15000", "15000 is in Ray's worker ports"), ("22", "22 is the hosts' SSH port"),
    ("40000", "40000 is in the hosts' ephemeral ports"),
])
def test_check_kv_on_a_port_the_cluster_holds_is_refused_before_any_host_is_reached(tmp_path, no_hosts, port, words):
    from click.testing import CliRunner

    from bootstrap.cli import main
    from tests.support.fleet_inventories import write

    path = write(tmp_path, fleet_yaml(4, 2, cluster=PD))
    r = CliRunner().invoke(main, ["check-kv", "-i", str(path), "--port", port], env={"HF_TOKEN": "x"})
    assert r.exit_code == 2, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "--port" in lines[0] and words in lines[0], r.output


def test_check_kv_prints_each_pair_and_the_verdict_and_exits_1_on_a_failed_pair(tmp_path, capsys):
    from bootstrap.cli import render

    pair = _pair(tmp_path)
    good = KV.parse(pair, read("h200-cuda-source.txt"), 0, read("h200-cuda-reader.txt"), 0)
    bad = KV.parse(pair, read("h200-wrongdev-source.txt"), 1, read("h200-wrongdev-reader.txt"), 1)
    render.kv_check([good], True, False)
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == "KV transfer check: PASS (1 pair(s))", out
    assert "kv-check: " in out.out and "warning: the KV transfer check" in out.err  # TCP with infiniband: true
    render.kv_check([good, bad], False, True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and [p["ok"] for p in doc["pairs"]] == [True, False] and doc["warnings"] == []
