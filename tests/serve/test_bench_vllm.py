"""bootstrap.bench against a REAL vLLM server: the sandbox's CPU vLLM image serving its tiny model.

Starts one container (`bench-vllm`, published on a free 127.0.0.1 port), waits for /health, runs
the benchmark and removes the container. Needs the image `bootstrap-sandbox/vllm-cpu` (built by
`bootstrap sandbox up`); skipped without a running Docker engine, a failure instead when
BOOTSTRAP_REQUIRE_SANDBOX=1. Startup takes about a minute on a small CPU machine.
"""
from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from bootstrap.serve import bench as B

pytestmark = pytest.mark.sandbox

IMAGE_REPO = "bootstrap-sandbox/vllm-cpu"
MODEL = "/opt/models/tiny-llama"
CONTAINER = "bench-vllm"
#: How long vLLM may take to answer /health (it took ~50 s on a 2-core machine).
HEALTH_DEADLINE_S = 420


def _docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def _require_docker() -> None:
    if shutil.which("docker") and _docker("info", timeout=60).returncode == 0:
        return
    if os.environ.get("BOOTSTRAP_REQUIRE_SANDBOX") == "1":
        pytest.fail("the vLLM bench test needs a running Docker engine (scripts/dev-setup.sh starts one)")
    pytest.skip("no Docker engine (set BOOTSTRAP_REQUIRE_SANDBOX=1 to make this a failure)")


def _newest_image() -> str:
    """The sandbox's vLLM CPU image, built (cached) by the sandbox's own recipe when missing."""
    from bootstrap.sandbox import ensure_images

    return ensure_images(log=lambda m: print(f"sandbox: {m}", flush=True)).vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(port: int) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    _require_docker()
    image = _newest_image()
    port = _free_port()
    log_path = tmp_path_factory.mktemp("bench-vllm") / "vllm.log"
    _docker("rm", "-f", CONTAINER)  # a leftover from an interrupted run
    run = _docker(
        "run", "-d", "--rm", "--name", CONTAINER, "-p", f"127.0.0.1:{port}:8000",
        # vLLM 0.32's engine core needs ~160 MiB of /dev/shm; Docker's default is 64 MiB.
        "--shm-size", "1g", "-e", "VLLM_CPU_KVCACHE_SPACE=1", image,
        "vllm", "serve", MODEL, "--enforce-eager", "--max-model-len", "256", "--port", "8000",
        timeout=300,
    )
    assert run.returncode == 0, f"docker run failed: {run.stderr.strip()}"
    # --rm deletes the container when it exits: keep its output in a file for the failure message.
    log_file = open(log_path, "w")
    logs = subprocess.Popen(["docker", "logs", "-f", CONTAINER], stdout=log_file, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        deadline = started + HEALTH_DEADLINE_S
        while True:
            if _health(port) == 200:
                print(f"vLLM ({image}) healthy after {time.monotonic() - started:.0f} s on port {port}")
                break
            state = _docker("inspect", "--format", "{{.State.Running}}", CONTAINER).stdout.strip()
            if state != "true":
                time.sleep(1)  # let `docker logs -f` drain
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                pytest.fail(f"the vLLM container exited before /health answered:\n{tail}")
            if time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                pytest.fail(f"vLLM /health did not answer 200 within {HEALTH_DEADLINE_S} s:\n{tail}")
            time.sleep(1)
        yield f"http://127.0.0.1:{port}"
    finally:
        _docker("rm", "-f", CONTAINER)
        logs.terminate()
        try:
            logs.wait(timeout=10)
        except subprocess.TimeoutExpired:
            logs.kill()
        log_file.close()


def test_raw_stream_parses(vllm_url):
    """The exact lines vLLM sends parse into text chunks, a usage chunk and [DONE]."""
    port = int(vllm_url.rsplit(":", 1)[1])
    body = json.dumps({"model": MODEL, "prompt": "The head starts first;", "max_tokens": 4,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:500]
    raw = resp.read().decode()
    conn.close()
    print("raw vLLM stream:\n" + raw)
    parsed = [B.parse_sse_line(ln) for ln in raw.splitlines()]
    objs = [p for p in parsed if isinstance(p, dict)]
    assert parsed[-1] == B.DONE or parsed[-2] == B.DONE
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] == 4
    for obj in objs[:-1]:
        assert obj["object"] == "text_completion" and set(obj["choices"][0]) >= {"index", "text", "finish_reason"}
    timer = B.StreamTimer(0.0)
    for i, ln in enumerate(raw.splitlines()):
        timer.feed(ln, 0.001 * i)
    sample = timer.sample(1.0)
    assert sample.ok and sample.output_tokens == 4 and sample.ttft is not None


def test_bench_against_real_vllm(vllm_url, tmp_path):
    cfg = B.BenchConfig(url=vllm_url, model=None, requests=16, concurrency=4, max_tokens=16,
                        ignore_eos=True, timeout=180)
    seen: list[int] = []
    r = B.run_bench(cfg, progress=lambda done, total: seen.append(done))
    print(B.format_result(r))
    print(json.dumps(r.to_dict(), indent=1))
    assert seen == list(range(1, 17))
    assert r.model == MODEL
    assert (r.requests, r.ok, r.failed) == (16, 16, 0), r.errors
    for st in (r.ttft, r.itl, r.e2e):
        assert st is not None and st.count > 0
        assert 0 < st.p50 <= st.p95 <= st.p99 <= st.max
    assert r.ttft.count == 16 and r.e2e.count == 16
    assert r.output_tokens == 16 * 16      # ignore_eos: every request generates max_tokens
    assert r.itl.count >= 16               # at least one gap per request (16 tokens each)
    assert r.requests_per_s > 0 and r.output_tokens_per_s > 0
    assert r.ttft.p50 <= r.e2e.p50
    png = tmp_path / "bench.png"
    B.write_png(r, png)
    assert png.stat().st_size > 0 and png.read_bytes()[:4] == b"\x89PNG"
