"""A router-policy A/B (pure): the order of the arms, what each measured, the table side by side.

`bench --ab P1,P2,...` runs one arm per policy and repeat: the routers restarted with the policy (and its
settings, `cache_aware:cache_threshold=0.8`: arm_router),
the arm's warm-up requests, then the measured ones. Arms are interleaved (repeat 1 in the given
order, repeat 2 reversed, ...) so that neither policy always runs on a warmer or a cooler machine.

Every arm sends the same workload built from its own seed: the same shape (lengths, shared parts,
sessions) with other words. Reusing the words would let a later arm hit the prefixes an earlier arm
left in the engines' caches (vLLM's /reset_prefix_cache is a development endpoint, not served in
production), which favours whichever policy runs second.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from bootstrap.errors import UsageError
from bootstrap.model import ROUTER_POLICIES, ROUTER_SETTINGS, idle_setting
from bootstrap.serve.benchstats import BenchResult, Sample, percentile

#: what the router answers when it sheds a request (no worker can take it, or its rate limit)
SHED_STATUSES = ("HTTP 429", "HTTP 503")


def order(policies: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, policy) of every arm: each repeat runs every policy, every other repeat in reverse."""
    return [(r, p) for r in range(repeats) for p in (policies if r % 2 == 0 else list(reversed(policies)))]


def arm_router(label: str) -> tuple[str, dict[str, float]]:
    """An A/B arm's policy and its settings: `POLICY` or `POLICY:NAME=VALUE[:NAME=VALUE...]` (ROUTER_SETTINGS,
    e.g. cache_aware:cache_threshold=0.8); a bad one refused in one line (UsageError)."""
    policy, *pairs = label.split(":")
    if policy not in ROUTER_POLICIES:
        raise UsageError(f"no policy {policy!r} (one of: {', '.join(ROUTER_POLICIES)})")
    settings: dict[str, float] = {}
    for pair in pairs:
        name, eq, text = pair.partition("=")
        if name not in ROUTER_SETTINGS or not eq:
            raise UsageError(f"{label!r}: {pair!r} is not NAME=VALUE of a policy's setting "
                             f"({', '.join(ROUTER_SETTINGS)})")
        _, kind, lo, hi, _ = ROUTER_SETTINGS[name]
        try:
            value = kind(text)
        except ValueError:
            raise UsageError(f"{label!r}: {name} takes {'an integer' if kind is int else 'a number'}, "
                             f"got {text!r}") from None
        if not lo <= value <= hi:
            raise UsageError(f"{label!r}: {name} must be from {lo:g} to {hi:g}, got {text}")
        why = idle_setting(name, {policy})
        if why is not None:  # an arm that measures the policy alone, under the settings' name
            raise UsageError(f"{label!r}: {name} {why}")
        settings[name] = value
    return policy, settings


@dataclass(frozen=True)
class Arm:
    policy: str
    repeat: int
    result: BenchResult
    #: prompt tokens the engines looked up in their prefix cache over the arm, and found (vLLM's
    #: vllm:prefix_cache_queries / _hits, summed over replicas; None: not exported)
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    #: replica -> requests it finished over the arm (vllm:request_success_total)
    per_replica: dict[int, int] = field(default_factory=dict)
    #: the engines' own mean time to first token and inter-token latency over the arm (ms; their
    #: histograms' sums and counts, all replicas; None: not exported): what the client measured
    #: less the router and the network
    engine_ttft_ms: float | None = None
    engine_itl_ms: float | None = None
    #: kv_aware's lookups in the routers' KV index over the arm, and those that found a replica holding a
    #: prefix of the prompt (vllm_router_kv_placement_lookups_total; None: no kv_aware decision)
    kv_lookups: float | None = None
    kv_hits: float | None = None


@dataclass(frozen=True)
class Row:
    """One policy over all its arms (their requests pooled)."""

    policy: str
    arms: int
    requests: int
    ok: int
    failed: int
    shed: int
    requests_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    #: requests/s that met the TTFT objective (ok, first token within slo_ms)
    goodput: float
    slo_ms: float
    prefix_hit_pct: float | None
    per_replica: dict[int, int]
    #: kv_aware: the share of its lookups that found a cached prefix in its index (None: other policies)
    kv_index_hit_pct: float | None = None

    @property
    def spread(self) -> float | None:
        """Most requests on one replica over fewest (None: a replica got none, or no replicas read)."""
        vals = list(self.per_replica.values())
        return max(vals) / min(vals) if vals and min(vals) > 0 else None

    def to_dict(self) -> dict:
        return {"policy": self.policy, "arms": self.arms, "requests": self.requests, "ok": self.ok,
                "failed": self.failed, "shed": self.shed, "requests_per_s": round(self.requests_per_s, 4),
                "ttft_ms": {"p50": _r(self.ttft_p50_ms), "p99": _r(self.ttft_p99_ms)},
                "itl_ms": {"p50": _r(self.itl_p50_ms), "p99": _r(self.itl_p99_ms)},
                "goodput": round(self.goodput, 4), "slo_ttft_ms": self.slo_ms,
                "prefix_hit_pct": _r(self.prefix_hit_pct), "per_replica": {str(k): v for k, v in
                                                                          sorted(self.per_replica.items())},
                "spread": _r(self.spread), "kv_index_hit_pct": _r(self.kv_index_hit_pct)}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _p(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q) * 1000 if values else None


def tpot_ms(samples: Sequence[Sample]) -> float | None:
    """The client's mean time per output token after the first (ms): (E2E - TTFT) / (tokens - 1) over
    the requests that streamed two tokens or more; what the engines' inter-token latency is comparable
    with (the client's ITL gaps span two tokens where a chunk carried no text)."""
    per = [(s.e2e - s.ttft) / (s.output_tokens - 1) for s in samples
           if s.ok and s.ttft is not None and s.output_tokens > 1]
    return 1000 * sum(per) / len(per) if per else None


def _shed(s: Sample) -> bool:
    return not s.ok and (s.error or "").startswith(SHED_STATUSES)


def row(policy: str, arms: Sequence[Arm], slo_ms: float) -> Row:
    samples = [s for a in arms for s in a.result.samples]
    ok = [s for s in samples if s.ok]
    wall = sum(a.result.wall_seconds for a in arms)
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [g for s in ok for g in s.itl]
    good = sum(1 for t in ttft if t * 1000 <= slo_ms)
    queries = [a.prefix_queries for a in arms if a.prefix_queries is not None]
    hits = [a.prefix_hits for a in arms if a.prefix_hits is not None]
    hit = 100 * sum(hits) / sum(queries) if queries and len(hits) == len(queries) and sum(queries) > 0 else None
    per: dict[int, int] = {}
    for a in arms:
        for k, n in a.per_replica.items():
            per[k] = per.get(k, 0) + n
    looked = sum(a.kv_lookups or 0 for a in arms)
    kv_hit = 100 * sum(a.kv_hits or 0 for a in arms) / looked if looked else None
    return Row(policy, len(arms), len(samples), len(ok), len(samples) - len(ok), sum(map(_shed, samples)),
               len(ok) / wall if wall > 0 else 0.0, _p(ttft, 50), _p(ttft, 99), _p(itl, 50), _p(itl, 99),
               good / wall if wall > 0 else 0.0, slo_ms, hit, per, kv_hit)


def table(policies: Sequence[str], arms: Sequence[Arm], slo_ms: float) -> list[Row]:
    """One row per policy, in the order given."""
    return [row(p, [a for a in arms if a.policy == p], slo_ms) for p in policies]


def best(rows: Sequence[Row]) -> dict[str, str]:
    """Which policy did best on each measure (higher requests/s, goodput and hit rate; lower TTFT
    and ITL); a measure no row has, or a tie, is left out."""
    out = {}
    for name, key, high in (("requests/s", "requests_per_s", True), ("goodput", "goodput", True),
                            ("TTFT p50", "ttft_p50_ms", False), ("TTFT p99", "ttft_p99_ms", False),
                            ("prefix hit", "prefix_hit_pct", True)):
        vals = [(getattr(r, key), r.policy) for r in rows if getattr(r, key) is not None]
        if len(vals) < 2:
            continue
        vals.sort(reverse=high)
        if vals[0][0] != vals[1][0]:
            out[name] = vals[0][1]
    return out


@dataclass(frozen=True)
class AbResult:
    workload: str
    policies: list[str]
    arms: list[Arm]
    rows: list[Row]
    #: the policy the routers were given back (the inventory's)
    restored: str
    png: str | None = None

    @property
    def best(self) -> dict[str, str]:
        return best(self.rows)

    def to_dict(self) -> dict:
        return {"workload": self.workload, "policies": self.policies, "rows": [r.to_dict() for r in self.rows],
                "best": self.best, "restored_policy": self.restored,
                "arms": [{"policy": a.policy, "repeat": a.repeat + 1, **a.result.to_dict(),
                          "prefix_queries": a.prefix_queries, "prefix_hits": a.prefix_hits,
                          "engine_ttft_ms": _r(a.engine_ttft_ms), "engine_itl_ms": _r(a.engine_itl_ms),
                          "tpot_ms": _r(tpot_ms(a.result.samples)), "kv_lookups": a.kv_lookups,
                          "kv_hits": a.kv_hits,
                          "per_replica": {str(k): v for k, v in sorted(a.per_replica.items())}} for a in self.arms],
                "png": self.png}
