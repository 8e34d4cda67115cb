"""Load test for an OpenAI-compatible vLLM endpoint: TTFT, inter-token latency, end-to-end latency,
throughput, and a hint when the latency tail points at a coordinator rather than at the GPUs.

Pure core, small I/O part:

* `summarize(samples, wall_seconds)` turns per-request `Sample`s into a `BenchResult` (percentiles,
  throughput, hints). `percentile`, `histogram_text`, `parse_sse_line` and `StreamTimer` are pure
  too; the unit tests drive them with synthetic samples and real vLLM stream lines.
* `run_bench(cfg)` sends exactly `cfg.requests` streaming completions, at most `cfg.concurrency`
  in flight (a thread pool; stdlib `http.client` only), each bounded by `cfg.timeout`, and
  summarizes them. A failed request (connection refused, HTTP error, error event in the stream,
  timeout, stream cut short) becomes a failed `Sample` with its error text; it never stops the run.
* `write_png(result, path)` draws the TTFT/ITL/E2E histograms into one PNG (needs matplotlib).

What is measured, per request (all on the `clock` passed to `run_bench`):

* the request is `POST {url}/v1/completions` with `"stream": true` and
  `"stream_options": {"include_usage": true}`; the answer is server-sent events, one
  `data: {json}` line per chunk, then `data: [DONE]`;
* TTFT: from just before the connection is opened to the first chunk whose `text` is non-empty;
* ITL (inter-token latency): the gaps between successive chunks with non-empty text. vLLM sends
  one chunk per engine step; a chunk with empty text (the detokenizer holding back an incomplete
  UTF-8 sequence) is not content, so the gap around it spans two tokens. Times are taken when a
  line is read on the client, so chunks that arrive in one TCP read get near-zero gaps;
* E2E: from just before the connection is opened to `[DONE]`;
* output tokens: `usage.completion_tokens` from the final usage chunk when the server sends one,
  else the number of chunks with non-empty text.

Aggregation (`summarize`): TTFT and E2E have one value per successful request; ITL pools the gaps
of all successful requests. Percentiles use the **nearest-rank** method (`percentile`): the p-th
percentile of n sorted values is the value at 1-based rank ceil(p/100 * n). It is always an
observed value, never interpolated, and p50 <= p95 <= p99 <= max holds by construction; with fewer
than 100 values p99 is the maximum. requests/s counts successful requests over the wall time of
the whole run; output tokens/s counts the output tokens of successful requests over that wall time.

The coordinator hint (`coordinator_hint`), after the multi-node chapter ("latency spikes at higher
percentiles indicate coordinator or load balancer bottleneck rather than GPU throughput issues";
"latency spikes without corresponding increased GPU utilization"). It fires when all hold:

1. at least `MIN_HINT_SAMPLES` (10) requests succeeded;
2. a spike: p99/p50 of TTFT or of E2E is above `SPIKE_RATIO` (3.0);
3. low throughput per in-flight request: `stream_efficiency` is below `LOW_EFFICIENCY` (0.5), where,
   over the successful requests,

       requests in flight = sum(E2E) / wall                                   (Little's law)
       per_request_tok_s  = output_tokens_per_s / requests in flight = sum(tokens) / sum(E2E)
       stream_efficiency  = per_request_tok_s * p50(ITL) = per_request_tok_s / (1 / p50(ITL))

   i.e. the token rate each in-flight request actually got, as a fraction of the rate a request
   gets once it is streaming. When the GPUs are the limit, every step slows down, ITL grows with
   the load and the efficiency stays near 1 (and the tail stays near the median); when a
   coordinator/front end gates requests, they sit in flight without streaming, so the efficiency
   drops while the tokens, once they come, still come at the normal pace. Without ITL values (one
   token per request) the efficiency is undefined and the hint does not fire. Short outputs weigh
   TTFT heavily (with 16 tokens, a TTFT of about 16 ITLs alone halves the efficiency: one healthy
   CPU vLLM at concurrency 4 and max_tokens 16 measured 0.55), which is why a spike is required too.
"""
from __future__ import annotations

import http.client
import json
import math
import socket
import threading
import time
import urllib.parse
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from bootstrap.errors import BenchError, UsageError
from bootstrap.signatures.engine import URL_PASSWORD

DEFAULT_PROMPT = (
    "A cluster is a set of machines that work together as one. Explain in a few sentences how a "
    "model server spreads one large model over several machines."
)

#: p99/p50 (of TTFT or E2E) above this is a "high-percentile spike".
SPIKE_RATIO = 3.0
#: stream_efficiency below this is "low throughput per in-flight request" (see the module doc).
LOW_EFFICIENCY = 0.5
#: Fewer successful requests than this and the coordinator hint stays silent (p99 means nothing).
MIN_HINT_SAMPLES = 10
#: Below this many values the nearest-rank p99 is the maximum; a hint says so.
STABLE_P99_SAMPLES = 100
#: An error keeps this many characters of the response body.
ERROR_BODY_CHARS = 200
#: The most tokens one request may ask for (max_tokens): 2**20, beyond the longest context a served model
#: has; more is a typo, which every request would spend minutes on or vLLM refuse one by one.
MAX_TOKENS = 1 << 20
#: Cap on what is read of an error response body.
_ERROR_BODY_READ = 64 * 1024

COORDINATOR_HINT = (
    "high-percentile latency spikes with low throughput: likely a coordinator/front-end bottleneck "
    "rather than GPU throughput (see the multi-node chapter)"
)

Clock = Callable[[], float]


# -- configuration and samples -------------------------------------------------------------------


@dataclass(frozen=True)
class BenchConfig:
    #: Base URL of the OpenAI-compatible server, e.g. http://10.0.0.1:8000 (a trailing /v1 is fine).
    url: str
    #: Model name to request; None: the first id that GET /v1/models lists.
    model: str | None = None
    requests: int = 64
    concurrency: int = 8
    prompt: str = DEFAULT_PROMPT
    max_tokens: int = 64
    #: Seconds one request may take, connect to [DONE]; also the /v1/models timeout.
    timeout: float = 120
    temperature: float = 0.0
    #: Send vLLM's `ignore_eos: true` so every request generates exactly max_tokens tokens.
    ignore_eos: bool = False
    #: sent as `Authorization: Bearer ...` (the secret cluster.router.api_key names); never shown
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.requests, int) or self.requests < 1:
            raise UsageError(f"bench: requests must be an integer >= 1 (got {self.requests!r})")
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise UsageError(f"bench: concurrency must be an integer >= 1 (got {self.concurrency!r})")
        if not isinstance(self.max_tokens, int) or not 1 <= self.max_tokens <= MAX_TOKENS:
            raise UsageError(f"bench: max_tokens must be an integer from 1 to {MAX_TOKENS} (got {self.max_tokens!r})")
        if not self.timeout > 0:
            raise UsageError(f"bench: timeout must be > 0 seconds (got {self.timeout!r})")
        split_url(self.url)  # raises UsageError on a bad URL


@dataclass(frozen=True)
class Sample:
    """One request. Times are in seconds; ttft is None when no text arrived."""

    ok: bool
    ttft: float | None
    itl: tuple[float, ...]
    e2e: float
    output_tokens: int
    error: str | None
    #: when the request was sent, on run_bench's clock
    started: float = 0.0


# -- statistics ----------------------------------------------------------------------------------


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank percentile: the value at 1-based rank ceil(p/100 * n) of the sorted values.

    p in [0, 100]; p=0 gives the minimum, p=100 the maximum. Raises ValueError on no values.
    """
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"percentile p must be within [0, 100] (got {p})")
    # The epsilon keeps float noise (e.g. 95 * 100 / 100 -> 95.00000000000001) from moving a rank.
    rank = max(1, math.ceil(p * len(data) / 100 - 1e-9))
    return data[rank - 1]


@dataclass(frozen=True)
class LatencyStats:
    """Distribution of one latency, in seconds (nearest-rank percentiles)."""

    count: int
    p50: float
    p95: float
    p99: float
    mean: float
    max: float
    min: float

    @classmethod
    def of(cls, values: Sequence[float]) -> "LatencyStats | None":
        if not values:
            return None
        data = sorted(values)
        return cls(
            count=len(data),
            p50=percentile(data, 50),
            p95=percentile(data, 95),
            p99=percentile(data, 99),
            mean=sum(data) / len(data),
            max=data[-1],
            min=data[0],
        )

    def to_dict(self) -> dict[str, float | int]:
        """Milliseconds, rounded to the microsecond."""
        ms = {k: round(v * 1000, 3) for k, v in asdict(self).items() if k != "count"}
        return {"count": self.count, **ms}


@dataclass(frozen=True)
class BenchResult:
    requests: int
    ok: int
    failed: int
    wall_seconds: float
    #: Successful requests per second of wall time.
    requests_per_s: float
    #: Output tokens of the successful requests.
    output_tokens: int
    output_tokens_per_s: float
    ttft: LatencyStats | None
    itl: LatencyStats | None
    e2e: LatencyStats | None
    #: Mean number of requests in flight: sum of all E2E / wall (Little's law).
    in_flight: float
    #: sum(tokens)/sum(E2E) * p50(ITL) over successful requests; None without ITL values.
    stream_efficiency: float | None
    #: Distinct error texts with their counts, most common first.
    errors: tuple[tuple[str, int], ...]
    hints: list[str]
    samples: tuple[Sample, ...] = field(default=(), repr=False, compare=False)
    #: Filled in by run_bench: what was measured.
    url: str | None = None
    model: str | None = None
    concurrency: int | None = None
    max_tokens: int | None = None

    @property
    def ttft_values(self) -> list[float]:
        return [s.ttft for s in self.samples if s.ok and s.ttft is not None]

    @property
    def itl_values(self) -> list[float]:
        return [g for s in self.samples if s.ok for g in s.itl]

    @property
    def e2e_values(self) -> list[float]:
        return [s.e2e for s in self.samples if s.ok]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready document (latencies in milliseconds); samples are left out."""
        return {
            "url": self.url,
            "model": self.model,
            "concurrency": self.concurrency,
            "max_tokens": self.max_tokens,
            "requests": self.requests,
            "ok": self.ok,
            "failed": self.failed,
            "wall_seconds": round(self.wall_seconds, 6),
            "requests_per_s": round(self.requests_per_s, 6),
            "output_tokens": self.output_tokens,
            "output_tokens_per_s": round(self.output_tokens_per_s, 6),
            "percentile_method": "nearest-rank",
            "ttft_ms": self.ttft.to_dict() if self.ttft else None,
            "itl_ms": self.itl.to_dict() if self.itl else None,
            "e2e_ms": self.e2e.to_dict() if self.e2e else None,
            "in_flight": round(self.in_flight, 6),
            "stream_efficiency": None if self.stream_efficiency is None else round(self.stream_efficiency, 6),
            "errors": [{"error": e, "count": n} for e, n in self.errors],
            "hints": list(self.hints),
        }


def _ratio(stats: LatencyStats | None) -> float | None:
    if stats is None or stats.p50 <= 0:
        return None
    return stats.p99 / stats.p50


def coordinator_hint(
    ok: int, ttft: LatencyStats | None, e2e: LatencyStats | None, stream_efficiency: float | None
) -> str | None:
    """The coordinator/front-end hint when the rule in the module doc holds, else None."""
    if ok < MIN_HINT_SAMPLES or stream_efficiency is None or stream_efficiency >= LOW_EFFICIENCY:
        return None
    spikes = [
        f"{name} p99/p50 {r:.1f}x"
        for name, r in (("TTFT", _ratio(ttft)), ("E2E", _ratio(e2e)))
        if r is not None and r > SPIKE_RATIO
    ]
    if not spikes:
        return None
    return (
        f"{COORDINATOR_HINT}: {', '.join(spikes)} > {SPIKE_RATIO:g}x while in-flight requests got "
        f"{stream_efficiency:.2f} of the streaming token rate (< {LOW_EFFICIENCY:g}); check that the "
        "load balancer spreads requests over all serving nodes and that the API server is not "
        "CPU-bound"
    )


def summarize(samples: Sequence[Sample], wall_seconds: float) -> BenchResult:
    """Aggregate samples into a BenchResult (pure)."""
    samples = tuple(samples)
    good = [s for s in samples if s.ok]
    failed = len(samples) - len(good)
    wall = max(float(wall_seconds), 0.0)

    ttft = LatencyStats.of([s.ttft for s in good if s.ttft is not None])
    itl = LatencyStats.of([g for s in good for g in s.itl])
    e2e = LatencyStats.of([s.e2e for s in good])
    tokens = sum(s.output_tokens for s in good)

    requests_per_s = len(good) / wall if wall > 0 else 0.0
    tokens_per_s = tokens / wall if wall > 0 else 0.0
    in_flight = sum(s.e2e for s in samples) / wall if wall > 0 else 0.0
    busy = sum(s.e2e for s in good)
    efficiency = (tokens / busy) * itl.p50 if itl is not None and busy > 0 else None

    errors = tuple(Counter(s.error or "unknown error" for s in samples if not s.ok).most_common())

    hints: list[str] = []
    hint = coordinator_hint(len(good), ttft, e2e, efficiency)
    if hint:
        hints.append(hint)
    if samples and not good:
        hints.append("no request succeeded; the errors say why (is the URL right, is the model loaded?)")
    elif failed:
        err, n = errors[0]
        hints.append(f"{failed} of {len(samples)} requests failed; most common ({n}x): {err}")
    if 0 < len(good) < STABLE_P99_SAMPLES:
        hints.append(
            f"p99 of {len(good)} successful requests is their maximum (nearest rank); "
            f"run {STABLE_P99_SAMPLES} or more requests for a stable tail"
        )

    return BenchResult(
        requests=len(samples),
        ok=len(good),
        failed=failed,
        wall_seconds=wall,
        requests_per_s=requests_per_s,
        output_tokens=tokens,
        output_tokens_per_s=tokens_per_s,
        ttft=ttft,
        itl=itl,
        e2e=e2e,
        in_flight=in_flight,
        stream_efficiency=efficiency,
        errors=errors,
        hints=hints,
        samples=samples,
    )


# -- text output ---------------------------------------------------------------------------------


def histogram_text(values: Sequence[float], bins: int = 20, width: int = 50) -> str:
    """A text histogram of values given in seconds: one line per bucket, range in ms, bar, count.

    `bins` equal-width buckets from min to max (the last one includes max); one line when all values
    are equal; "(no samples)" for no values. The longest bar is `width` characters; a non-empty
    bucket always shows at least one `#`.
    """
    if bins < 1 or width < 1:
        raise ValueError("histogram_text: bins and width must be >= 1")
    data = sorted(values)
    if not data:
        return "(no samples)"
    lo, hi = data[0], data[-1]
    if hi <= lo:
        edges = [(lo, hi)]
        counts = [len(data)]
    else:
        step = (hi - lo) / bins
        edges = [(lo + i * step, hi if i == bins - 1 else lo + (i + 1) * step) for i in range(bins)]
        counts = [0] * bins
        for v in data:
            counts[min(int((v - lo) / step), bins - 1)] += 1
    peak = max(counts)
    labels = [(f"{a * 1000:.2f}", f"{b * 1000:.2f}") for a, b in edges]
    wa = max(len(a) for a, _ in labels)
    wb = max(len(b) for _, b in labels)
    wc = len(str(peak))
    lines = []
    for (a, b), n in zip(labels, counts):
        bar = "#" * (max(1, round(n / peak * width)) if n else 0)
        lines.append(f"{a:>{wa}} - {b:>{wb}} ms |{bar:<{width}}| {n:>{wc}}")
    return "\n".join(lines)


def format_result(result: BenchResult, *, histograms: bool = True) -> str:
    """A human-readable report: throughput, the latency table, hints, optionally histograms."""
    out = []
    head = f"{result.requests} requests, {result.ok} ok, {result.failed} failed"
    if result.concurrency is not None:
        head += f", concurrency {result.concurrency}"
    if result.model:
        head += f", model {result.model}"
    out.append(head)
    out.append(
        f"wall {result.wall_seconds:.2f} s   {result.requests_per_s:.2f} req/s   "
        f"{result.output_tokens_per_s:.1f} output tok/s   ({result.output_tokens} tokens, "
        f"{result.in_flight:.1f} in flight on average)"
    )
    out.append(f"{'':6}{'p50':>10}{'p95':>10}{'p99':>10}{'mean':>10}{'max':>10}   (ms, nearest rank)")
    for name, st in (("TTFT", result.ttft), ("ITL", result.itl), ("E2E", result.e2e)):
        if st is None:
            out.append(f"{name:<6}{'-':>10}")
            continue
        cells = "".join(f"{v * 1000:>10.1f}" for v in (st.p50, st.p95, st.p99, st.mean, st.max))
        out.append(f"{name:<6}{cells}   n={st.count}")
    for err, n in result.errors[:5]:
        out.append(f"error ({n}x): {err}")
    for hint in result.hints:
        out.append(f"hint: {hint}")
    if histograms and result.samples:
        for name, values in (("TTFT", result.ttft_values), ("ITL", result.itl_values),
                             ("E2E", result.e2e_values)):
            out.append(f"\n{name}")
            out.append(histogram_text(values))
    return "\n".join(out)


# -- server-sent events --------------------------------------------------------------------------

#: What parse_sse_line returns for `data: [DONE]`.
DONE = "[DONE]"


def parse_sse_line(line: str | bytes) -> dict[str, Any] | str | None:
    """One line of an SSE stream: its JSON object for `data: {...}`, DONE for `data: [DONE]`,
    None for anything else (blank separator lines, comments, `event:`/`id:` fields).

    Raises ValueError when a data line is not JSON.
    """
    if isinstance(line, bytes):
        line = line.decode("utf-8", "replace")
    line = line.rstrip("\r\n")
    if not line.startswith("data:"):
        return None
    payload = line[5:]
    if payload.startswith(" "):
        payload = payload[1:]
    if payload.strip() == DONE:
        return DONE
    if not payload.strip():
        return None
    obj = json.loads(payload)
    if not isinstance(obj, dict):
        raise ValueError(f"SSE data is not a JSON object: {payload[:ERROR_BODY_CHARS]}")
    return obj


def _chunk_error(obj: dict[str, Any]) -> str | None:
    """The error an SSE chunk reports: {"error": {...}} (vLLM, OpenAI) or {"object": "error", ...}."""
    err = obj.get("error")
    if err:
        if isinstance(err, dict):
            msg = err.get("message") or json.dumps(err)
            code = err.get("code")
            return f"stream error{f' {code}' if code is not None else ''}: {msg}"
        return f"stream error: {err}"
    if obj.get("object") == "error":
        code = obj.get("code")
        return f"stream error{f' {code}' if code is not None else ''}: {obj.get('message', '')}"
    return None


def _chunk_text(obj: dict[str, Any]) -> str:
    parts = []
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict):
            text = choice.get("text")
            if text is None and isinstance(choice.get("delta"), dict):  # chat-style chunk
                text = choice["delta"].get("content")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts)


class StreamTimer:
    """Times one streamed completion from its SSE lines (pure: the caller passes the times).

    `StreamTimer(start)`, then `feed(line, now)` for every line received, then `sample(end)`.
    """

    def __init__(self, start: float):
        self.start = start
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.done = False
        self.error: str | None = None

    def feed(self, line: str | bytes, now: float) -> None:
        if self.done or self.error:
            return
        try:
            obj = parse_sse_line(line)
        except ValueError as exc:
            text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            self.error = f"bad stream line ({exc}): {text.strip()[:ERROR_BODY_CHARS]}"
            return
        if obj is None:
            return
        if obj == DONE:
            self.done = True
            return
        assert isinstance(obj, dict)
        err = _chunk_error(obj)
        if err:
            self.error = err[:ERROR_BODY_CHARS + 40]
            return
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if _chunk_text(obj):
            if self.first is None:
                self.first = now
            else:
                self.gaps.append(now - self.last)  # type: ignore[operator]
            self.last = now
            self.chunks += 1

    def sample(self, end: float, error: str | None = None) -> Sample:
        """The finished request; `error` (transport trouble) overrides what the stream said."""
        error = error or self.error
        if error is None and not self.done:
            error = "stream ended before data: [DONE]"
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        return Sample(
            ok=error is None,
            ttft=None if self.first is None else self.first - self.start,
            itl=tuple(self.gaps),
            e2e=end - self.start,
            output_tokens=tokens,
            error=error,
            started=self.start,
        )


# -- HTTP ----------------------------------------------------------------------------------------


def split_url(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, base path without a trailing / or /v1) of a server URL.

    A UsageError for anything else: no http(s) scheme or host, a space or control character
    (urlsplit would silently drop a newline), a broken IPv6 bracket, a port outside 1-65535."""
    text = url.strip()
    url = URL_PASSWORD.sub(r"\1***@", url)  # never echoed with its password
    bad = f"bench: the URL must look like http://HOST:PORT (got {url!r})"
    if not text.isprintable() or " " in text:
        raise UsageError(f"{bad}: no spaces or control characters")
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as exc:  # Invalid IPv6 URL
        raise UsageError(f"{bad}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(bad)
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"bench: the URL carries a user or a password ({url!r}): bench would not send them, and on "
                         "a command line they are in ps and your shell's history; the fleet's API key is read from "
                         "the secret cluster.router.api_key names")
    try:
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"bench: bad port in {url!r}: {exc}") from None
    if port == 0:
        raise UsageError(f"bench: bad port in {url!r}: 0 (a port is 1-65535)")
    port = port or (443 if parts.scheme == "https" else 80)
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return parts.scheme, parts.hostname, port, path


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
    """The first model id that GET {url}/v1/models lists; BenchError when there is none."""
    conn, base = _connection(url, timeout)
    try:
        conn.request("GET", f"{base}/v1/models", headers={"Accept": "application/json", **auth_headers(api_key)})
        resp = conn.getresponse()
        body = resp.read(_ERROR_BODY_READ)
        if resp.status != 200:
            raise BenchError(f"bench: GET {url.rstrip('/')}/v1/models: {_http_error(resp.status, body)}")
        data = json.loads(body)
        models = [m.get("id") for m in data.get("data", []) if isinstance(m, dict) and m.get("id")]
    except BenchError:
        raise
    except (OSError, http.client.HTTPException, ValueError, AttributeError) as exc:
        raise BenchError(f"bench: cannot list models at {url}: {_describe(exc)}") from None
    finally:
        conn.close()
    if not models:
        raise BenchError(f"bench: {url} serves no model (GET /v1/models listed none); pass --model")
    return models[0]


def request_body(cfg: BenchConfig, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": cfg.prompt,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    return body


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
    cfg: BenchConfig, model: str, clock: Clock = time.perf_counter, inflight: _InFlight | None = None
) -> Sample:
    """Send one streaming completion and time it. Never raises (except KeyboardInterrupt & co)."""
    payload = json.dumps(request_body(cfg, model)).encode()
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
            "Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers(cfg.api_key)})
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
) -> BenchResult:
    """Send cfg.requests streaming completions, cfg.concurrency at a time, and summarize them.

    Raises BenchError only when the model cannot be discovered; request failures are counted.
    `progress(done, total)` is called from the calling thread after each request finishes. On an
    exception in the calling thread (Ctrl-C, or one raised by `progress`) the queued requests are
    dropped, the connections in flight are cut, and the exception propagates.
    """
    model = cfg.model or discover_model(cfg.url, cfg.timeout, cfg.api_key)
    samples: list[Sample] = []
    inflight = _InFlight()
    start = clock()
    pool = ThreadPoolExecutor(max_workers=min(cfg.concurrency, cfg.requests),
                              thread_name_prefix="bench")
    try:
        futures = [pool.submit(one_request, cfg, model, clock, inflight) for _ in range(cfg.requests)]
        for fut in as_completed(futures):
            samples.append(fut.result())
            if progress is not None:
                progress(len(samples), cfg.requests)
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
