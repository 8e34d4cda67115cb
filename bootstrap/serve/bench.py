"""Load test of an OpenAI-compatible vLLM endpoint over HTTP: the requests in flight, the run, the PNG.

TTFT, inter-token latency, end-to-end latency, throughput, and a hint when the latency tail points
at a coordinator rather than at the GPUs. A pure core (benchload.py: the configuration, the request
and the timing of one stream; benchstats.py: the statistics and the report), this small I/O part:

* `run_bench(cfg)` sends exactly `cfg.requests` streaming completions, at most `cfg.concurrency`
  in flight (a thread pool; stdlib `http.client` only), each bounded by `cfg.timeout`, and
  summarizes them. A failed request (connection refused, HTTP error, error event in the stream,
  timeout, stream cut short) becomes a failed `Sample` with its error text; it never stops the run.
* `write_png(result, path)` draws the TTFT/ITL/E2E histograms into one PNG (needs matplotlib).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Callable, Sequence

from bootstrap.errors import BenchError
from bootstrap.serve.benchload import (
    ERROR_BODY_CHARS,
    BenchConfig,
    StreamTimer,
    request_body,
    split_url,
)
from bootstrap.serve.benchstats import (
    BenchResult,
    Sample,
    summarize,
)
from bootstrap.serve.workloads import Req

#: Cap on what is read of an error response body.
_ERROR_BODY_READ = 64 * 1024

Clock = Callable[[], float]


# -- HTTP ----------------------------------------------------------------------------------------


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    scheme, host, port, base = split_url(url)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    return cls(host, port, timeout=timeout), base


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"timeout: {exc}" if str(exc) else "timeout"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:ERROR_BODY_CHARS + 40]


def _http_error(status: int, body: bytes) -> str:
    return f"HTTP {status}: {body.decode('utf-8', 'replace').strip()[:ERROR_BODY_CHARS]}"


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def discover_model(url: str, timeout: float = 30, api_key: str | None = None) -> str:
    """The model GET {url}/v1/models lists (an adapter, which names its `parent`, is not one); BenchError
    when there is none, or when a pool's router lists several (its front's OpenAI list, or vllm-router's
    own {"models": [names]} from a router made before the front)."""
    conn, base = _connection(url, timeout)
    try:
        conn.request("GET", f"{base}/v1/models", headers={"Accept": "application/json", **auth_headers(api_key)})
        resp = conn.getresponse()
        body = resp.read(_ERROR_BODY_READ)
        if resp.status != 200:
            raise BenchError(f"bench: GET {url.rstrip('/')}/v1/models: {_http_error(resp.status, body)}")
        data = json.loads(body)
        pool = data.get("models") if isinstance(data.get("models"), list) else None
        models = ([m for m in pool if isinstance(m, str) and m] if pool is not None else
                  [m.get("id") for m in data.get("data", []) if isinstance(m, dict) and m.get("id")
                   and not m.get("parent")])
    except BenchError:
        raise
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise BenchError(f"bench: cannot list models at {url}: {_describe(exc)}") from None
    finally:
        conn.close()
    if not models:
        raise BenchError(f"bench: {url} serves no model (GET /v1/models listed none); pass --model")
    if len(models) > 1:  # a pool's router: no first one
        raise BenchError(f"bench: {url} serves several models ({', '.join(models)}): pass --model NAME")
    return models[0]



class _InFlight:
    """The sockets of the requests in flight, so that an interrupt can cut them at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self.cancelled = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self.cancelled:
                raise ConnectionAbortedError("benchmark cancelled")
            self._socks.add(sock)

    def discard(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            socks = list(self._socks)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by its request: nothing left to cancel
                pass


def one_request(
    cfg: BenchConfig, model: str, clock: Clock = time.perf_counter, inflight: _InFlight | None = None,
    req: Req | None = None,
) -> Sample:
    """Send one streaming completion and time it (req: a workload's request, else cfg's prompt). Never
    raises (except KeyboardInterrupt & co)."""
    payload = json.dumps(request_body(cfg, model, req and req.prompt, req and req.max_tokens)).encode()
    session = {"X-Session-ID": req.session} if req is not None and req.session else {}
    deadline = time.monotonic() + cfg.timeout
    timer = StreamTimer(clock())
    conn = sock = None
    try:
        conn, base = _connection(cfg.url, cfg.timeout)
        conn.connect()
        # Kept apart: http.client drops conn.sock when the response is read to the close.
        sock = conn.sock
        if inflight is not None:
            inflight.add(sock)
        conn.request("POST", f"{base}/v1/completions", body=payload, headers={
            "Content-Type": "application/json", "Accept": "text/event-stream", **session,
            **auth_headers(cfg.api_key)})
        resp = conn.getresponse()
        if resp.status != 200:
            return timer.sample(clock(), _http_error(resp.status, resp.read(_ERROR_BODY_READ)))
        while True:
            if inflight is not None and inflight.cancelled:
                return timer.sample(clock(), "cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                return timer.sample(clock(), f"timeout: no [DONE] within {cfg.timeout:g} s")
            sock.settimeout(left)
            line = resp.readline()
            now = clock()
            if not line:
                break
            timer.feed(line, now)
            if timer.done or timer.error:
                break
        return timer.sample(clock())
    except (socket.timeout, TimeoutError):
        return timer.sample(clock(), f"timeout: no [DONE] within {cfg.timeout:g} s")
    except Exception as exc:  # noqa: BLE001 -- a failed request is a data point, not a crash
        return timer.sample(clock(), _describe(exc))
    finally:
        if sock is not None and inflight is not None:
            inflight.discard(sock)
        if conn is not None:
            conn.close()


def run_bench(
    cfg: BenchConfig,
    *,
    clock: Clock = time.perf_counter,
    progress: Callable[[int, int], None] | None = None,
    requests: Sequence[Req] | None = None,
) -> BenchResult:
    """Send cfg.requests streaming completions, cfg.concurrency at a time, and summarize them.

    requests: a workload's (workloads.py), sent in their order instead of cfg.requests alike ones; one
    with `at` is sent no sooner than `at` seconds after the start (a trace).

    Raises BenchError only when the model cannot be discovered; request failures are counted.
    `progress(done, total)` is called from the calling thread after each request finishes. On an
    exception in the calling thread (Ctrl-C, or one raised by `progress`) the queued requests are
    dropped, the connections in flight are cut, and the exception propagates.
    """
    model = cfg.model or discover_model(cfg.url, cfg.timeout, cfg.api_key)
    samples: list[Sample] = []
    inflight = _InFlight()
    start = clock()
    todo: Sequence[Req | None] = requests if requests is not None else [None] * cfg.requests
    pool = ThreadPoolExecutor(max_workers=min(cfg.concurrency, len(todo)), thread_name_prefix="bench")
    try:
        futures = []
        for req in todo:
            if req is not None and req.at is not None and clock() - start < req.at:
                time.sleep(req.at - (clock() - start))
            futures.append(pool.submit(one_request, cfg, model, clock, inflight, req))
        for fut in as_completed(futures):
            samples.append(fut.result())
            if progress is not None:
                progress(len(samples), len(todo))
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        inflight.cancel()
        raise
    finally:
        pool.shutdown(wait=True)
    wall = clock() - start
    return replace(summarize(samples, wall), url=cfg.url, model=model,
                   concurrency=cfg.concurrency, max_tokens=cfg.max_tokens)


# -- PNG -----------------------------------------------------------------------------------------


def write_png(result: BenchResult, path) -> None:
    """TTFT, ITL and E2E histograms (ms) side by side in one PNG, p50/p95/p99 marked."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("bench: writing a PNG needs matplotlib: pip install matplotlib, or pip install '.[png]'"
                         " in the clone") from None

    panels = (("TTFT", result.ttft_values, result.ttft), ("ITL", result.itl_values, result.itl),
              ("E2E", result.e2e_values, result.e2e))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    try:
        for ax, (name, values, stats) in zip(axes, panels):
            ax.set_title(f"{name} (n={len(values)})")
            ax.set_xlabel("ms")
            ax.set_ylabel("requests" if name != "ITL" else "gaps")
            if not values:
                ax.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax.transAxes)
                continue
            ax.hist([v * 1000 for v in values], bins=30, color="#4C72B0")
            if stats is not None:
                for q, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
                    v = getattr(stats, q) * 1000
                    ax.axvline(v, color="#C44E52", linestyle=style, label=f"{q} {v:.1f} ms")
                ax.legend(fontsize=8)
        title = (f"{result.ok}/{result.requests} ok, {result.requests_per_s:.2f} req/s, "
                 f"{result.output_tokens_per_s:.1f} output tok/s")
        if result.concurrency is not None:
            title += f", concurrency {result.concurrency}"
        if result.model:
            title += f", {result.model}"
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(str(path), dpi=100)
    finally:
        plt.close(fig)


def write_ab_png(rows, workload: str, path) -> None:
    """An A/B's rows (serve/abtest.py) as bars side by side: requests/s and goodput, TTFT p50/p99,
    ITL p50/p99, the prefix cache's hit rate."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("bench: writing a PNG needs matplotlib: pip install matplotlib, or pip install '.[png]'"
                         " in the clone") from None
    names = [r.policy for r in rows]
    panels = (("requests/s (goodput hatched)", [("requests/s", "requests_per_s"), ("goodput", "goodput")]),
              ("TTFT ms", [("p50", "ttft_p50_ms"), ("p99", "ttft_p99_ms")]),
              ("ITL ms", [("p50", "itl_p50_ms"), ("p99", "itl_p99_ms")]),
              ("prefix cache hit %", [("hit %", "prefix_hit_pct")]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4.5))
    try:
        for ax, (title, series) in zip(axes, panels):
            ax.set_title(title)
            width = 0.8 / len(series)
            for j, (label, key) in enumerate(series):
                vals = [getattr(r, key) or 0.0 for r in rows]
                xs = [i + j * width for i in range(len(rows))]
                ax.bar(xs, vals, width, label=label, hatch="//" if j else None, color=("#4C72B0", "#C44E52")[j % 2])
            ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(rows))], names, rotation=30, ha="right")
            if len(series) > 1:
                ax.legend(fontsize=8)
        fig.suptitle(f"router policies on the {workload} workload, {rows[0].requests if rows else 0} requests each")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise BenchError(f"bench: cannot write {path}: {exc}") from None
    finally:
        plt.close(fig)
