"""The statistics of a load test (pure): percentiles, a run's result, the coordinator hint, the text report.

`summarize(samples, wall_seconds)` turns per-request `Sample`s into a `BenchResult` (percentiles,
throughput, hints); `percentile` and `histogram_text` are pure too. The unit tests drive them with
synthetic samples. What each sample measures is in benchload.py, the run in bench.py.


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

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Sequence

#: p99/p50 (of TTFT or E2E) above this is a "high-percentile spike".
SPIKE_RATIO = 3.0
#: stream_efficiency below this is "low throughput per in-flight request" (see the module doc).
LOW_EFFICIENCY = 0.5
#: Fewer successful requests than this and the coordinator hint stays silent (p99 means nothing).
MIN_HINT_SAMPLES = 10
#: Below this many values the nearest-rank p99 is the maximum; a hint says so.
STABLE_P99_SAMPLES = 100

COORDINATOR_HINT = (
    "high-percentile latency spikes with low throughput: likely a coordinator/front-end bottleneck "
    "rather than GPU throughput (see the multi-node chapter)"
)


# -- samples ---------------------------------------------------------------------------------------


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
