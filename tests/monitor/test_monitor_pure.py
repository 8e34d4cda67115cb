"""`bootstrap monitor` without a host: cluster.monitor in the inventory, the generated scrape
configuration, the containers' argv, Prometheus' targets answer (a real capture), the dashboard."""
from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from bootstrap.monitor import plan as MP
from bootstrap.monitor.run import MonitorResult, TargetState, parse_targets
from tests.support.dashboards import DASHBOARD, dashboard_queries
from tests.support.fleet_inventories import check, error, fleet_yaml, load

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


def test_defaults(tmp_path):
    inv = load(tmp_path, fleet_yaml(n=2, replicas=1))
    m = inv.cluster.monitor
    assert (m.host, m.port, m.node_exporter_port, m.scrape_interval, m.retention, m.dcgm) == \
        (None, 9090, 9100, 5, "15d", False)
    assert MP.monitor_host(inv).name == "h0" and MP.prometheus_url(inv) == "http://10.0.0.1:9090"
    assert inv.cluster.ports.ray_metrics == 8080


def test_settings_are_read(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="""
        monitor: {host: h3, port: 9191, retention: 2w, scrape_interval: 10, image: "reg.local/prom:2"}
        """))
    m = inv.cluster.monitor
    assert (m.host, m.port, m.retention, m.scrape_interval, m.image) == ("h3", 9191, "2w", 10, "reg.local/prom:2")
    assert MP.prometheus_url(inv) == "http://10.0.0.4:9191"


@pytest.mark.parametrize("snippet, line, field, word1, word2", [
    ("monitor: {host: nope}", 4, "cluster.monitor.host", "'nope' is not a host of this inventory", ""),
    ("monitor: {port: 8000}", 4, "cluster.monitor.port", "8000 is also cluster.ports.vllm", ""),
    ("monitor: {node_exporter_port: 30000}", 4, "cluster.monitor.node_exporter_port",
     "30000 is also cluster.router.port", ""),
    ("monitor: {port: 9100}", 4, "cluster.monitor", "9100 is also cluster.monitor.port",
     "(set cluster.monitor.node_exporter_port)"),
    ("monitor: {retention: forever}", 4, "cluster.monitor.retention", "a duration such as 15d", ""),
    ("monitor: {retention: 101y}", 4, "cluster.monitor.retention", "more than 100 years", "would not start"),
    ("monitor: {retention: 99999999999999999999999999999w}", 4, "cluster.monitor.retention",
     "more than 100 years", ""),
    ("gpus_per_node: 65", 4, "cluster.gpus_per_node", "must be between 0 and 64, got 65", ""),
    ("monitor: {scrape_interval: 0}", 4, "cluster.monitor.scrape_interval", "", ""),
    ("monitor: {prometheus_port: 1}", 4, "cluster.monitor", "unknown key 'prometheus_port'", ""),
    ("ports: {ray_metrics: 9090}", 2, "cluster.monitor", "9090 is also cluster.ports.ray_metrics",
     "(set cluster.monitor.port)"),
])
def test_refusals_name_the_field(tmp_path, snippet, line, field, word1, word2):
    err = error(tmp_path, fleet_yaml(cluster=snippet))
    check(err, tmp_path / "inventory.yaml", line, field, word1, word2)


def test_a_retention_up_to_a_century_is_taken_in_any_unit(tmp_path):
    for value in ("5256000m", "100y", "5200w"):
        assert load(tmp_path, fleet_yaml(cluster=f"monitor: {{retention: {value}}}")).cluster.monitor.retention == value


def test_fleet_scrape_config(tmp_path):
    inv = load(tmp_path, fleet_yaml(cluster="name: demo\nruntime: ray"))
    doc = yaml.safe_load(MP.scrape_config(inv))
    assert doc["global"]["scrape_interval"] == "5s" and doc["global"]["external_labels"] == {"cluster": "demo"}
    jobs = {j["job_name"]: j["static_configs"] for j in doc["scrape_configs"]}
    assert list(jobs) == ["vllm", "vllm-router", "ray", "node"]
    assert [(c["targets"], c["labels"]) for c in jobs["vllm"]] == [
        (["10.0.0.1:8000"], {"host": "h0", "replica": "0"}), (["10.0.0.3:8000"], {"host": "h2", "replica": "1"})]
    assert jobs["vllm-router"][0]["targets"] == ["10.0.0.1:29000"]
    assert [c["targets"][0] for c in jobs["node"]] == [f"10.0.0.{i}:9100" for i in range(1, 5)]
    assert [c["labels"]["replica"] for c in jobs["ray"]] == ["0", "0", "1", "1"]


def test_one_cluster_without_ray_scrapes_the_head_and_the_nodes(tmp_path):
    inv = load(tmp_path, fleet_yaml(n=3, replicas=1, cluster="runtime: none"))
    targets = MP.scrape_targets(inv)
    assert [(t.job, t.address) for t in targets] == [
        ("vllm", "10.0.0.1:8000"), ("node", "10.0.0.1:9100"), ("node", "10.0.0.2:9100"), ("node", "10.0.0.3:9100")]
    assert all("replica" not in dict(t.labels) for t in targets)


def test_dcgm_on_every_host_when_asked(tmp_path):
    gpu = fleet_yaml(n=2, replicas=1, cluster="monitor: {dcgm: true}").replace(
        "accelerator: none", "accelerator: gpu\n  gpus_per_node: 8")
    inv = load(tmp_path, gpu)
    assert [t.address for t in MP.scrape_targets(inv) if t.job == "dcgm"] == ["10.0.0.1:9400", "10.0.0.2:9400"]
    argv = MP.dcgm_run_argv(inv, inv.hosts[1])
    assert "DCGM_EXPORTER_LISTEN=10.0.0.2:9400" in argv and "--gpus" in argv


def test_containers_bind_the_data_plane_ip_with_least_privilege(tmp_path):
    inv = load(tmp_path, fleet_yaml(n=2, replicas=1))
    plan = MP.containers(inv)
    assert [(h.name, n) for h, n, _ in plan] == [
        ("h0", "bootstrap-vllm-node-exporter"), ("h1", "bootstrap-vllm-node-exporter"),
        ("h0", "bootstrap-vllm-prometheus")]
    for h, _name, argv in plan:
        joined = " ".join(argv)
        assert "--cap-drop ALL" in joined and "--user 65534:65534" in joined and "no-new-privileges" in joined
        assert f"--web.listen-address={h.ip}:" in joined and "0.0.0.0" not in joined
        assert "--restart unless-stopped" in joined and "--privileged" not in joined
    prom = plan[-1][2]
    assert prom[:2] == ("docker", "create") and f"--config.file={MP.CONFIG_PATH}" in prom
    assert "--storage.tsdb.retention.time=15d" in prom and f"bootstrap-vllm-prometheus-data:{MP.DATA_PATH}" in prom
    node = plan[0][2]
    assert "/proc:/host/proc:ro" in node and "--read-only" in node


def test_ipv6_targets_are_bracketed(tmp_path):
    inv = load(tmp_path, "cluster: {accelerator: none, runtime: ray}\nhosts:\n  - {name: a, address: 'fd00::1'}\n")
    assert [t.address for t in MP.scrape_targets(inv)][:2] == ["[fd00::1]:8000", "[fd00::1]:8080"]


def test_parse_real_targets_answer():
    # Captured from the sandbox: `curl http://172.31.240.11:9090/api/v1/targets?state=active` after
    # `bootstrap monitor up` and before `serve` (vLLM's target down, the rest up).
    targets = parse_targets((DATA / "prometheus-targets.json").read_bytes())
    assert [(t.job, t.host, t.health) for t in targets] == [
        ("node", "node1", "up"), ("node", "node2", "up"), ("node", "node3", "up"),
        ("ray", "node1", "up"), ("ray", "node2", "up"), ("ray", "node3", "up"), ("vllm", "node1", "down")]
    assert "connection refused" in targets[-1].error
    res = MonitorResult("http://x:9090", "node1", targets)
    assert [t.job for t in res.down] == ["vllm"] and res.down_infrastructure == []


def test_a_down_exporter_is_infrastructure():
    res = MonitorResult("u", "h", [TargetState("node", "h", "u", "down", "refused")])
    assert res.down_infrastructure == res.down


def test_dashboard_queries_cover_what_users_ask():
    doc = json.loads(DASHBOARD.read_text())
    qs = dashboard_queries(doc)
    text = " ".join(q.expr for q in qs)
    for needle in ("vllm:request_success_total", "vllm:generation_tokens_total", "time_to_first_token",
                   "inter_token_latency", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                   "by (replica, host)", "node_cpu_seconds_total", "node_memory_MemAvailable_bytes",
                   "DCGM_FI_DEV_GPU_UTIL", "vllm_router_processed_requests_total"):
        assert needle in text, needle
    assert {q.panel for q in qs if q.gpu} == {"GPU utilisation", "GPU memory used"}
    assert all(p["datasource"]["uid"] == "${datasource}" for p in doc["panels"])
    assert len({p["id"] for p in doc["panels"]}) == len(doc["panels"])


def test_exposure_warnings_for_the_monitoring_ports(tmp_path):
    from bootstrap import exposure

    inv = load(tmp_path, "cluster: {accelerator: none, runtime: ray}\nhosts:\n  - {name: a, address: 10.0.0.1}\n"
                         "  - {name: b, address: 34.90.0.7}\n")
    addrs = {"a": ("10.0.0.1", "34.90.0.3"), "b": ("34.90.0.7",)}
    w = exposure.monitor_warnings(inv, addrs, "a")
    # a: private data-plane ip, but a public address reaches Ray's metrics agent (every interface)
    assert any(x.startswith("a: Ray's metrics export (port 8080") and "34.90.0.3" in x for x in w)
    assert not any(x.startswith("a: the node exporter") or x.startswith("a: Prometheus") for x in w)
    # b: its data-plane ip is public: the node exporter would answer there
    assert any(x.startswith("b: the node exporter (port 9100) would listen on public address 34.90.0.7")
               for x in w)
    # no public address on the hosts: only b's public data-plane ip itself is named
    quiet = exposure.monitor_warnings(inv, {"a": ("10.0.0.1",), "b": ()}, "a")
    assert [x.split(" (")[0] for x in quiet] == ["b: the node exporter"]


def test_dcgm_on_a_cpu_cluster_is_refused_not_ignored(tmp_path):
    err = error(tmp_path, fleet_yaml(n=2, replicas=1, cluster="monitor: {dcgm: true}"))
    assert err.field == "cluster.monitor.dcgm" and "does nothing with accelerator: none" in str(err)
