"""Unit tests for bootstrap.bench: percentiles, summaries, the coordinator hint, histograms, SSE parsing.

Everything here is pure or talks to an in-process stdlib HTTP server on 127.0.0.1; no Docker, no vLLM.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bootstrap.errors import UsageError
from bootstrap.serve import bench as B
from bootstrap.serve import benchload as BL
from bootstrap.serve import benchstats as BS
from bootstrap.serve import workloads as W

# -- real vLLM stream lines ----------------------------------------------------------------------
# What vLLM's OpenAI server writes for POST /v1/completions with "stream": true and
# "stream_options": {"include_usage": true}. Source: vllm-project/vllm,
# vllm/entrypoints/openai/serving_completion.py (commit 00463e627b4cbe549b5e9815a2bdb0100ae88ea9),
# OpenAIServingCompletion.completion_stream_generator:
#   * one `yield f"data: {response_json}\n\n"` per engine output, response_json being a
#     CompletionStreamResponse (id, object "text_completion", created, model, choices) whose choice
#     is a CompletionResponseStreamChoice (index, text, logprobs, finish_reason, stop_reason,
#     prompt_token_ids, token_ids; vllm/entrypoints/openai/protocol.py) with the nulls written out;
#     `text` can be "" (the detokenizer holds back an incomplete UTF-8 sequence) and the last
#     chunk carries finish_reason;
#   * with include_usage, a last chunk with `"choices": []` and the usage (dumped with
#     exclude_none=True);
#   * on an exception, `data: {create_streaming_error_response(...)}`; then always `data: [DONE]`.
# The stream below is verbatim what vLLM 0.32.0 (bootstrap-sandbox/vllm-cpu image, tiny-llama)
# sent for {"prompt": "The head starts first;", "max_tokens": 4, "temperature": 0,
# "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}, printed by
# tests/sandbox/test_sandbox_serve.py (raw_stream, against the 2-node endpoint). Note the random-weight model's "\ufffd ".
VLLM_STREAM = """\
data: {"id":"cmpl-9f604b68dedc3e4a","object":"text_completion","created":1795227727,"model":"/opt/models/tiny-llama","choices":[{"index":0,"text":" F","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-9f604b68dedc3e4a","object":"text_completion","created":1795227727,"model":"/opt/models/tiny-llama","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-9f604b68dedc3e4a","object":"text_completion","created":1795227727,"model":"/opt/models/tiny-llama","choices":[{"index":0,"text":"\ufffd ","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-9f604b68dedc3e4a","object":"text_completion","created":1795227727,"model":"/opt/models/tiny-llama","choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}

data: {"id":"cmpl-9f604b68dedc3e4a","object":"text_completion","created":1795227727,"model":"/opt/models/tiny-llama","choices":[],"usage":{"prompt_tokens":9,"total_tokens":13,"completion_tokens":4},"system_fingerprint":"vllm-0.32.0-ec36f8bb"}

data: [DONE]

"""

#: vLLM's streaming error event: create_streaming_error_response dumps an ErrorResponse,
#: {"error": {message, type, param, code}} (same source file/commit; shape from the source, not
#: captured: a live server only sends it when the engine fails mid-stream).
VLLM_ERROR_LINE = ('data: {"error":{"message":"The decoder prompt (length 300) is longer than the '
                   'maximum model length of 256.","type":"BadRequestError","param":null,"code":400}}')


def lines_of(stream: str) -> list[str]:
    return [ln + "\n" for ln in stream.split("\n")]


# -- percentiles ---------------------------------------------------------------------------------


def test_percentile_nearest_rank_on_1_to_100():
    data = list(range(1, 101))
    assert BS.percentile(data, 50) == 50
    assert BS.percentile(data, 95) == 95
    assert BS.percentile(data, 99) == 99
    assert BS.percentile(data, 100) == 100
    assert BS.percentile(data, 0) == 1


def test_percentile_nearest_rank_small_sets():
    data = [0.5, 0.1, 0.4, 0.2, 0.3, 0.9, 0.8, 0.7, 0.6, 1.0]  # unsorted on purpose
    assert BS.percentile(data, 50) == 0.5      # rank ceil(5.0) = 5
    assert BS.percentile(data, 95) == 1.0      # rank ceil(9.5) = 10
    assert BS.percentile(data, 99) == 1.0      # p99 of < 100 values is the maximum
    assert BS.percentile([7.0], 50) == 7.0
    assert BS.percentile([1, 2, 3, 4], 50) == 2  # nearest rank, not the interpolated 2.5
    assert BS.percentile([1, 2, 3, 4], 51) == 3


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError):
        BS.percentile([], 50)
    with pytest.raises(ValueError):
        BS.percentile([1.0], 101)


def test_latency_stats():
    st = BS.LatencyStats.of([0.001 * i for i in range(1, 201)])
    assert st.count == 200
    assert st.p50 == pytest.approx(0.100)
    assert st.p95 == pytest.approx(0.190)
    assert st.p99 == pytest.approx(0.198)
    assert st.max == pytest.approx(0.200) and st.min == pytest.approx(0.001)
    assert st.mean == pytest.approx(0.1005)
    assert st.to_dict() == {"count": 200, "p50": 100.0, "p95": 190.0, "p99": 198.0,
                            "mean": 100.5, "max": 200.0, "min": 1.0}
    assert BS.LatencyStats.of([]) is None


# -- summarize -----------------------------------------------------------------------------------


def ok_sample(ttft: float, itl: float, tokens: int) -> BS.Sample:
    gaps = (itl,) * (tokens - 1)
    return BS.Sample(ok=True, ttft=ttft, itl=gaps, e2e=ttft + sum(gaps), output_tokens=tokens, error=None)


def bad_sample(error: str, e2e: float = 0.01) -> BS.Sample:
    return BS.Sample(ok=False, ttft=None, itl=(), e2e=e2e, output_tokens=0, error=error)


def test_summarize_counts_throughput_and_percentiles():
    samples = [ok_sample(0.1, 0.02, 11) for _ in range(8)] + [
        bad_sample("HTTP 500: boom"), bad_sample("HTTP 500: boom"), bad_sample("timeout")]
    r = BS.summarize(samples, wall_seconds=2.0)
    assert (r.requests, r.ok, r.failed) == (11, 8, 3)
    assert r.requests_per_s == pytest.approx(4.0)
    assert r.output_tokens == 88
    assert r.output_tokens_per_s == pytest.approx(44.0)
    assert r.ttft.p50 == pytest.approx(0.1) and r.ttft.count == 8
    assert r.itl.count == 80 and r.itl.p99 == pytest.approx(0.02)
    assert r.e2e.p50 == pytest.approx(0.3)
    assert r.errors == (("HTTP 500: boom", 2), ("timeout", 1))
    assert any("3 of 11 requests failed" in h and "HTTP 500: boom" in h for h in r.hints)
    assert r.in_flight == pytest.approx((8 * 0.3 + 3 * 0.01) / 2.0)
    assert r.stream_efficiency == pytest.approx(88 / 2.4 * 0.02)
    d = r.to_dict()
    json.dumps(d)
    assert d["ttft_ms"]["p50"] == pytest.approx(100.0)
    assert d["percentile_method"] == "nearest-rank"
    assert d["errors"][0] == {"error": "HTTP 500: boom", "count": 2}
    assert "samples" not in d


def test_summarize_empty_and_all_failed():
    r = BS.summarize([], 0.0)
    assert (r.requests, r.ok, r.failed, r.requests_per_s) == (0, 0, 0, 0.0)
    assert r.ttft is None and r.itl is None and r.e2e is None and r.stream_efficiency is None
    r = BS.summarize([bad_sample("connection refused")] * 3, 1.0)
    assert r.ok == 0 and r.failed == 3 and r.ttft is None
    assert any("no request succeeded" in h for h in r.hints)
    json.dumps(r.to_dict())
    assert "p99" in BS.format_result(r) or "TTFT" in BS.format_result(r)


def test_summarize_ok_sample_without_text():
    # A request that finished at once (EOS first) is ok but has no TTFT and no ITL.
    s = BS.Sample(ok=True, ttft=None, itl=(), e2e=0.05, output_tokens=1, error=None)
    r = BS.summarize([s, ok_sample(0.1, 0.01, 3)], 1.0)
    assert r.ok == 2 and r.ttft.count == 1 and r.e2e.count == 2 and r.output_tokens == 4


# -- the coordinator hint, both ways -------------------------------------------------------------


def coordinator_hints(result: BS.BenchResult) -> list[str]:
    return [h for h in result.hints if h.startswith(BS.COORDINATOR_HINT)]


def test_hint_fires_on_ttft_spike_with_low_throughput():
    # 18 requests stream normally; 2 wait 2 s before their first token (gated by a front end),
    # then stream at the normal 10 ms pace. p99/p50 TTFT = 40x; the in-flight requests got
    # 320 tokens / 7.9 s = 40.5 tok/s against 100 tok/s while streaming: efficiency 0.405 < 0.5.
    samples = [ok_sample(0.05, 0.01, 16) for _ in range(18)] + [ok_sample(2.0, 0.01, 16)] * 2
    r = BS.summarize(samples, 2.5)
    assert r.stream_efficiency == pytest.approx(320 / 7.9 * 0.01)
    hints = coordinator_hints(r)
    assert len(hints) == 1
    assert "TTFT p99/p50 40.0x" in hints[0] and "E2E p99/p50" in hints[0]
    assert "multi-node chapter" in hints[0]


def test_hint_fires_on_e2e_spike_alone():
    # Same TTFT everywhere; 2 requests stall mid-stream for 3 s (one huge gap), the rest fine.
    normal = [ok_sample(0.05, 0.01, 16) for _ in range(18)]
    stalled = BS.Sample(ok=True, ttft=0.05, itl=(0.01,) * 14 + (3.0,), e2e=0.05 + 0.14 + 3.0,
                       output_tokens=16, error=None)
    r = BS.summarize(normal + [stalled, stalled], 3.5)
    assert r.ttft.p99 / r.ttft.p50 == pytest.approx(1.0)
    hints = coordinator_hints(r)
    assert len(hints) == 1 and "E2E p99/p50" in hints[0] and "TTFT p99/p50" not in hints[0]


def test_hint_silent_when_spike_but_throughput_fine():
    # Long outputs: 2 requests wait 0.5 s for the first token, but every request streams 100
    # tokens at 10 ms, so in flight they still got 95% of the streaming rate: not a bottleneck.
    samples = [ok_sample(0.01, 0.01, 100) for _ in range(18)] + [ok_sample(0.5, 0.01, 100)] * 2
    r = BS.summarize(samples, 3.0)
    assert r.ttft.p99 / r.ttft.p50 > BS.SPIKE_RATIO
    assert r.stream_efficiency > BS.LOW_EFFICIENCY
    assert coordinator_hints(r) == []


def test_hint_silent_when_slow_but_no_spike():
    # Uniformly slow (every request waits 1 s): low efficiency, but p99 == p50 -- no spike.
    r = BS.summarize([ok_sample(1.0, 0.01, 16) for _ in range(20)], 4.0)
    assert r.stream_efficiency < BS.LOW_EFFICIENCY
    assert coordinator_hints(r) == []


def test_hint_silent_when_gpu_bound():
    # GPU-bound: every step slows, ITL grows with TTFT; the tail is close to the median.
    samples = [ok_sample(0.2 + 0.01 * i, 0.05 + 0.001 * i, 16) for i in range(20)]
    r = BS.summarize(samples, 5.0)
    assert r.stream_efficiency > BS.LOW_EFFICIENCY
    assert coordinator_hints(r) == []


def test_hint_silent_with_too_few_samples_or_no_itl():
    few = [ok_sample(0.05, 0.01, 16) for _ in range(7)] + [ok_sample(2.0, 0.01, 16)] * 2
    assert coordinator_hints(BS.summarize(few, 2.5)) == []
    one_token = [ok_sample(0.05, 0.01, 1) for _ in range(18)] + [ok_sample(2.0, 0.01, 1)] * 2
    r = BS.summarize(one_token, 2.5)
    assert r.itl is None and r.stream_efficiency is None and coordinator_hints(r) == []


def test_hint_rule_threshold_is_strict():
    st = BS.LatencyStats(count=20, p50=1.0, p95=2.0, p99=3.0, mean=1.2, max=3.0, min=1.0)
    assert BS.coordinator_hint(20, st, st, 0.1) is None           # ratio 3.0 is not > 3.0
    st2 = BS.LatencyStats(count=20, p50=1.0, p95=2.0, p99=3.01, mean=1.2, max=3.01, min=1.0)
    assert BS.coordinator_hint(20, st2, None, 0.1) is not None
    assert BS.coordinator_hint(20, st2, None, BS.LOW_EFFICIENCY) is None  # 0.5 is not < 0.5
    assert BS.coordinator_hint(BS.MIN_HINT_SAMPLES - 1, st2, None, 0.1) is None


# -- histogram_text ------------------------------------------------------------------------------


def test_histogram_text_shape():
    values = [0.001 * i for i in range(1, 101)] + [0.050] * 20
    text = BS.histogram_text(values, bins=10, width=30)
    lines = text.splitlines()
    assert len(lines) == 10
    counts = [int(ln.rsplit("|", 1)[1]) for ln in lines]
    assert sum(counts) == len(values)
    bars = [ln.split("|")[1] for ln in lines]
    assert all(len(b) == 30 for b in bars)                    # padded to width
    assert max(b.count("#") for b in bars) == 30               # the peak bucket fills it
    assert all((b.count("#") > 0) == (n > 0) for b, n in zip(bars, counts))
    assert lines[0].lstrip().startswith("1.00 - ") and " ms |" in lines[0]
    assert lines[-1].split(" ms")[0].endswith("100.00")        # the last bucket ends at the max
    # all columns aligned
    assert len({ln.index("|") for ln in lines}) == 1


def test_histogram_text_edge_cases():
    assert BS.histogram_text([]) == "(no samples)"
    one = BS.histogram_text([0.25, 0.25, 0.25])
    assert one.splitlines() == ["250.00 - 250.00 ms |" + "#" * 50 + "| 3"]
    default = BS.histogram_text([0.001 * i for i in range(50)])
    assert len(default.splitlines()) == 20
    with pytest.raises(ValueError):
        BS.histogram_text([1.0], bins=0)


# -- SSE parsing ---------------------------------------------------------------------------------


def test_parse_sse_line_on_vllm_lines():
    parsed = [BL.parse_sse_line(ln) for ln in lines_of(VLLM_STREAM)]
    objs = [p for p in parsed if isinstance(p, dict)]
    assert len(objs) == 5
    assert parsed.count(BL.DONE) == 1 and parsed[-3] == BL.DONE
    assert [o["choices"][0]["text"] for o in objs[:4]] == [" F", "", "\ufffd ", ""]
    assert objs[3]["choices"][0]["finish_reason"] == "length"
    assert objs[4]["choices"] == [] and objs[4]["usage"]["completion_tokens"] == 4
    assert BL.parse_sse_line(b'data: [DONE]\r\n') == BL.DONE
    assert BL.parse_sse_line("data:[DONE]") == BL.DONE
    assert BL.parse_sse_line(": keep-alive comment") is None
    assert BL.parse_sse_line("event: ping") is None
    assert BL.parse_sse_line("\n") is None
    with pytest.raises(ValueError):
        BL.parse_sse_line("data: {not json")


def test_stream_timer_on_vllm_stream():
    # One time per line (blank separators included): the chunks arrive at 10.10 (" F"),
    # 10.12 (""), 10.15 ("\ufffd "), 10.20 ("" + finish_reason), 10.21 (usage), 10.22 ([DONE]).
    t = BL.StreamTimer(start=10.0)
    times = iter([10.10, 10.10, 10.12, 10.12, 10.15, 10.15, 10.20, 10.20, 10.21, 10.21, 10.22, 10.22, 10.3])
    for ln in lines_of(VLLM_STREAM):
        t.feed(ln, next(times))
    s = t.sample(10.25)
    assert s.ok and s.error is None
    assert s.ttft == pytest.approx(0.10)
    # chunks with empty text are not content: the one gap is 10.15 - 10.10
    assert s.itl == pytest.approx((0.05,))
    assert s.e2e == pytest.approx(0.25)
    assert s.output_tokens == 4                    # from the usage chunk, not the 2 text chunks


def test_stream_timer_without_usage_counts_chunks():
    t = BL.StreamTimer(0.0)
    for i, ln in enumerate(lines_of(VLLM_STREAM)):
        if '"usage":{' in ln:
            continue
        t.feed(ln, 0.01 * i)
    assert t.sample(1.0).output_tokens == 2      # the chunks with text (an undercount here)


def test_stream_timer_errors():
    t = BL.StreamTimer(0.0)
    t.feed(lines_of(VLLM_STREAM)[0], 0.1)
    t.feed(VLLM_ERROR_LINE, 0.2)
    t.feed("data: [DONE]", 0.3)
    s = t.sample(0.3)
    assert not s.ok and s.error.startswith("stream error 400: The decoder prompt")
    old = BL.StreamTimer(0.0)
    old.feed('data: {"object":"error","message":"bad","type":"x","code":500}', 0.1)
    assert old.sample(0.1).error == "stream error 500: bad"
    cut = BL.StreamTimer(0.0)
    cut.feed(lines_of(VLLM_STREAM)[0], 0.1)
    s = cut.sample(0.2)
    assert not s.ok and "before data: [DONE]" in s.error and s.ttft == pytest.approx(0.1)
    garbage = BL.StreamTimer(0.0)
    garbage.feed("data: <html>", 0.1)
    assert "bad stream line" in garbage.sample(0.1).error


# -- config --------------------------------------------------------------------------------------


def test_config_validation_and_url():
    BL.BenchConfig(url="http://127.0.0.1:8000", model=None)
    for bad in (dict(requests=0), dict(concurrency=0), dict(max_tokens=0), dict(timeout=0)):
        with pytest.raises(UsageError):
            BL.BenchConfig(url="http://127.0.0.1:8000", model=None, **bad)
    with pytest.raises(UsageError):
        BL.BenchConfig(url="127.0.0.1:8000", model=None)
    assert BL.split_url("http://h:8000/v1/") == ("http", "h", 8000, "")
    assert BL.split_url("https://h/proxy/v1") == ("https", "h", 443, "/proxy")
    body = BL.request_body(BL.BenchConfig(url="http://h:1", model="m", max_tokens=5, ignore_eos=True), "m")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 5 and body["ignore_eos"] is True and body["model"] == "m"
    assert "ignore_eos" not in BL.request_body(BL.BenchConfig(url="http://h:1", model="m"), "m")


def test_max_tokens_has_an_upper_bound():
    BL.BenchConfig(url="http://127.0.0.1:8000", model=None, max_tokens=BL.MAX_TOKENS)
    for bad in (BL.MAX_TOKENS + 1, 10 ** 30):
        with pytest.raises(UsageError, match=f"max_tokens must be an integer from 1 to {BL.MAX_TOKENS}"):
            BL.BenchConfig(url="http://127.0.0.1:8000", model=None, max_tokens=bad)


# -- run_bench against an in-process fake server -------------------------------------------------


class FakeVLLM(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), FakeHandler)
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.completions = 0
        self.bodies: list[dict] = []
        #: each request's X-Session-ID header (None: none sent)
        self.sessions: list[str | None] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class FakeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # body ends when the connection closes

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())
        else:
            self.send_error(404)

    def do_POST(self):
        srv: FakeVLLM = self.server
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with srv.lock:
            srv.completions += 1
            n = srv.completions
            srv.bodies.append(req)
            srv.sessions.append(self.headers.get("X-Session-ID"))
            srv.active += 1
            srv.max_active = max(srv.max_active, srv.active)
        counted = True
        try:
            prompt = req["prompt"]
            if prompt == "fail" and n % 2 == 0:
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b'{"error": "' + b"x" * 500 + b'"}')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if prompt == "stall" or (prompt == "hang" and n > 1):
                time.sleep(1.5 if prompt == "stall" else 10)
                return
            for i in range(req["max_tokens"]):
                time.sleep(0.005)
                chunk = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": req["model"],
                         "choices": [{"index": 0, "text": f" t{i}", "logprobs": None,
                                      "finish_reason": None, "stop_reason": None}], "usage": None}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            usage = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": req["model"],
                     "choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 3 + req["max_tokens"],
                                              "completion_tokens": req["max_tokens"]}}
            with srv.lock:  # done before the client can see [DONE] and send its next request
                srv.active -= 1
                counted = False
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        finally:
            with srv.lock:
                if counted:
                    srv.active -= 1


@pytest.fixture
def fake():
    srv = FakeVLLM()
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_run_bench_bounded_and_counted(fake):
    seen = []
    cfg = BL.BenchConfig(url=fake.url + "/v1", model=None, requests=12, concurrency=3, max_tokens=5, timeout=10)
    r = B.run_bench(cfg, progress=lambda done, total: seen.append((done, total)))
    assert fake.completions == 12 and 1 <= fake.max_active <= 3
    assert seen == [(i, 12) for i in range(1, 13)]
    assert (r.requests, r.ok, r.failed) == (12, 12, 0)
    assert r.model == "fake-model" and all(b["model"] == "fake-model" for b in fake.bodies)
    assert r.output_tokens == 60 and r.itl.count == 12 * 4
    assert r.ttft.p50 <= r.ttft.p95 <= r.ttft.p99 <= r.e2e.max
    assert r.requests_per_s > 0 and r.output_tokens_per_s > 0
    assert r.concurrency == 3 and r.max_tokens == 5


def test_run_bench_counts_http_errors(fake):
    cfg = BL.BenchConfig(url=fake.url, model="m", requests=6, concurrency=2, max_tokens=2, prompt="fail")
    r = B.run_bench(cfg)
    assert r.requests == 6 and r.ok == 3 and r.failed == 3
    (err, n), = r.errors
    assert n == 3 and err.startswith('HTTP 500: {"error": "xxx') and len(err) == len("HTTP 500: ") + 200


def test_run_bench_timeout_is_per_request(fake):
    cfg = BL.BenchConfig(url=fake.url, model="m", requests=2, concurrency=2, max_tokens=2,
                        prompt="stall", timeout=0.3)
    t0 = time.monotonic()
    r = B.run_bench(cfg)
    assert time.monotonic() - t0 < 1.4
    assert r.failed == 2 and r.errors[0][0].startswith("timeout")


def test_run_bench_unreachable():
    cfg = BL.BenchConfig(url="http://127.0.0.1:9", model="m", requests=3, concurrency=2, timeout=2)
    r = B.run_bench(cfg)
    assert r.failed == 3 and r.ok == 0 and "ConnectionRefusedError" in r.errors[0][0]
    with pytest.raises(B.BenchError, match="cannot list models"):
        B.run_bench(BL.BenchConfig(url="http://127.0.0.1:9", model=None, timeout=2))


def test_run_bench_interrupt_cuts_in_flight(fake):
    # The first request streams at once, every later one hangs 10 s; progress raises (as Ctrl-C
    # would) after the first: the queued requests are dropped and the hanging ones cut at once.
    cfg = BL.BenchConfig(url=fake.url, model="m", requests=50, concurrency=2, max_tokens=2,
                        prompt="hang", timeout=30)

    def boom(done, total):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        B.run_bench(cfg, progress=boom)
    assert time.monotonic() - t0 < 5
    assert fake.completions <= 3


def test_write_png(tmp_path):
    pytest.importorskip("matplotlib")
    r = BS.summarize([ok_sample(0.05 + 0.001 * i, 0.01, 8) for i in range(30)], 1.0)
    out = tmp_path / "bench.png"
    B.write_png(r, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 1000
    empty = tmp_path / "empty.png"
    B.write_png(BS.summarize([bad_sample("x")], 1.0), empty)
    assert empty.stat().st_size > 0


def test_format_result_mentions_everything():
    r = BS.summarize([ok_sample(0.05, 0.01, 16) for _ in range(18)] + [ok_sample(2.0, 0.01, 16)] * 2, 2.5)
    text = BS.format_result(r)
    for word in ("TTFT", "ITL", "E2E", "p50", "p95", "p99", "req/s", "tok/s", "hint:", "ms |"):
        assert word in text


def test_run_bench_sends_a_workloads_own_requests_in_order_with_their_sessions_and_times(fake):
    """A workload's requests (serve/workloads.py) replace the one prompt: their prompts, max_tokens and
    X-Session-ID headers are what the server got, one at a time in the given order; a trace's `at`
    holds a request back until that many seconds after the start."""
    reqs = [W.Req("first prompt", 2, "s-1"), W.Req("second prompt", 3, None), W.Req("third", None, "s-2", at=0.4)]
    cfg = BL.BenchConfig(url=fake.url, model="m", requests=1, concurrency=1, max_tokens=4, timeout=10)
    t0 = time.monotonic()
    r = B.run_bench(cfg, requests=reqs, clock=time.monotonic)
    assert (r.requests, r.ok) == (3, 3)
    assert [b["prompt"] for b in fake.bodies] == ["first prompt", "second prompt", "third"]
    assert [b["max_tokens"] for b in fake.bodies] == [2, 3, 4]  # None: the config's
    assert fake.sessions == ["s-1", None, "s-2"]
    assert r.output_tokens == 9
    third = max(r.samples, key=lambda s: s.started)
    assert third.started - t0 >= 0.4  # sent no sooner than 0.4 s after the start (which is after t0)
    assert min(s.started for s in r.samples) - t0 < 0.4  # the others were not held back
