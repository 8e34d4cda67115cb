"""Pure parts of serve: which variables must not be copied from the head, how commands are launched."""
import subprocess

from bootstrap.serve.argv import per_node_env_names
from bootstrap.serve.run import _DETACH, LOG, PIDFILE, _detached
from tests.support.plan_fixtures import gpu_inventory


def test_per_node_nccl_variables_are_kept_from_the_head():
    inv = gpu_inventory()  # NCCL_SOCKET_IFNAME differs (ens5/ens6), NCCL_DEBUG is the same everywhere
    assert per_node_env_names(inv) == ["NCCL_SOCKET_IFNAME"]


def test_detached_launch_keeps_every_argument_whole(tmp_path):
    argv = ("vllm", "serve", "/models/my model $(touch /tmp/pwned)", "--max-model-len", "256")
    cmd = _detached("bootstrap-vllm", argv)
    assert cmd[:4] == ("docker", "exec", "-d", "bootstrap-vllm")
    assert cmd[-len(argv):] == argv
    # Run the same sh -c program locally with printf standing in for vllm: arguments arrive intact.
    log, pid = tmp_path / "log", tmp_path / "pid"
    prog = _DETACH.replace(LOG, str(log)).replace(PIDFILE, str(pid))
    subprocess.run(["sh", "-c", prog, "sh", "printf", "%s\\n", *argv[2:]], check=True)
    assert log.read_text().splitlines() == list(argv[2:])
    assert pid.read_text().strip().isdigit()


def test_backend_follows_the_cluster_and_impossible_pairs_are_refused():
    import pytest

    from bootstrap.errors import UsageError
    from bootstrap.serve.run import choose_backend

    assert choose_backend("gpu", "ray", None) == ("ray", "GPU cluster running Ray")
    assert choose_backend("none", "ray", None) == ("native", "CPU cluster: vLLM's Ray executor needs GPUs")
    assert choose_backend("gpu", "none", None) == (
        "native", "the containers run without Ray (cluster.runtime: none, or an image without Ray)")
    assert choose_backend("gpu", "ray", "native") == ("native", "--backend native")
    with pytest.raises(UsageError, match="cannot serve on a CPU cluster.*current platform cpu does not support ray"):
        choose_backend("none", "ray", "ray")
    with pytest.raises(UsageError, match="runs without it .cluster.runtime: none, or an image without Ray.*native"):
        choose_backend("gpu", "none", "ray")
    # runtime unset and not read yet: --backend ray waits for what the containers run
    assert choose_backend("gpu", None, "ray") == ("ray", "--backend ray")


def test_serving_state_from_the_head_probe():
    from bootstrap.serve.state import parse_serving

    assert parse_serving({"serving": False, "state": None}) is None
    probe = {"serving": True, "uptime_s": 207.5, "process": True, "health": "ok", "models": ["m"],
             "kv_lines": ["(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
                          "Maximum concurrency for 1,024 tokens per request: 512.00x"],
             "state": {"model": "/opt/models/m", "backend": "native", "tp": 1, "pp": 3,
                       "endpoint": "http://10.0.0.1:8000/v1", "nodes": ["a", "b", "c"],
                       "split_reason": "TP=1 PP=3: 4 attention heads do not divide by 3 nodes"}}
    st = parse_serving(probe)
    assert (st.model, st.served, st.backend, st.tp, st.pp, st.health, st.uptime_s) == (
        "/opt/models/m", ["m"], "native", 1, 3, "healthy", 207.5)
    assert st.kv.tokens == 524288 and st.to_dict()["kv_cache_tokens"] == 524288
    assert parse_serving({**probe, "health": None}).health == "starting"
    down = parse_serving({**probe, "process": False, "health": "URLError: <urlopen error [Errno 111]>"})
    assert down.health.startswith("down: the vLLM server process has exited (URLError")
    assert (st.ep, st.all2all) == (1, None)
    ep = parse_serving({**probe, "state": {**probe["state"], "tp": 1, "pp": 1, "dp": 16, "ep": 16,
                                           "all2all": "deepep_low_latency"}})
    assert (ep.dp, ep.ep, ep.all2all) == (16, 16, "deepep_low_latency")
    assert parse_serving({**probe, "state": {**probe["state"], "ep": "x", "all2all": 3}}).ep == 1


def test_serve_state_payload_reads_state_health_and_kv(tmp_path):
    """checks/serve_state.py run for real: a state file, a live pid, a local HTTP server as vLLM."""
    import http.server
    import json
    import os
    import sys
    import threading
    from pathlib import Path

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = b"" if self.path == "/health" else json.dumps({"data": [{"id": "tiny"}]}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        state, pid, log = tmp_path / "s.json", tmp_path / "pid", tmp_path / "log"
        state.write_text(json.dumps({"model": "tiny", "url_in": f"http://127.0.0.1:{srv.server_port}"}))
        pid.write_text(str(os.getpid()))
        log.write_text("noise\nCPU KV cache size: 1,024 tokens\n")
        script = Path(__file__).resolve().parents[2] / "checks" / "serve_state.py"
        out = subprocess.run([sys.executable, str(script), str(state), str(pid), str(log)], capture_output=True,
                             text=True, timeout=30).stdout
        got = json.loads(out)
        assert got["serving"] and got["process"] and got["health"] == "ok" and got["models"] == ["tiny"]
        assert got["kv_lines"] == ["CPU KV cache size: 1,024 tokens"] and got["uptime_s"] >= 0
        state.unlink()
        assert json.loads(subprocess.run([sys.executable, str(script), str(state), str(pid), str(log)],
                                         capture_output=True, text=True, timeout=30).stdout)["serving"] is False
    finally:
        srv.shutdown()


def test_model_info_payload_reads_a_path(tmp_path):
    import json
    import sys
    from pathlib import Path

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 4}))
    script = Path(__file__).resolve().parents[2] / "checks" / "model_info.py"
    got = json.loads(subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                                    timeout=30).stdout)
    shown = {k: v for k, v in got.items() if k not in ("engine", "kind", "elsewhere")}
    assert shown == {"config": {"num_attention_heads": 4}, "index": None, "source": "path", "error": None}
    assert got["kind"] is None and got["elsewhere"] is None
    assert set(got["engine"]) == {"version", "all2all", "modules", "nixl_connector"}
    missing = json.loads(subprocess.run([sys.executable, str(script), str(tmp_path / "nope")], capture_output=True,
                                        text=True, timeout=30).stdout)
    assert missing["config"] is None and "no config.json" in missing["error"]
