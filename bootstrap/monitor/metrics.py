"""What `bootstrap top` shows, from raw samples (pure: no SSH, no clock of its own).

A sample of a host is what `checks/top_probe.py` printed inside its container: the node's
`/proc/stat` CPU line, `/proc/meminfo`, `nvidia-smi` rows, and the text of vLLM's `/metrics` on a
replica's head. This module parses them (Prometheus' own parser, prometheus_client), turns two
samples into rates, and a window of samples into latency percentiles the way PromQL's
`histogram_quantile` does over `increase(..._bucket[1m])`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

#: vLLM's metric names (v1 engine); counters are exported with a _total suffix.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
SUCCESS = "vllm:request_success"
GEN_TOKENS = "vllm:generation_tokens"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
ITL_OLD = "vllm:time_per_output_token_seconds"  # before vLLM 0.11
QUEUE = "vllm:request_queue_time_seconds"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
KV = "vllm:kv_cache_usage_perc"
KV_OLD = "vllm:gpu_cache_usage_perc"

#: seconds of history the latency percentiles cover
WINDOW = 60.0

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), sorted, +Inf last


@dataclass(frozen=True)
class VllmSample:
    running: float | None = None
    waiting: float | None = None
    success: float | None = None
    gen_tokens: float | None = None
    kv: float | None = None
    ttft: Buckets = ()
    itl: Buckets = ()
    #: time in the engine's queue before the first step (vllm:request_queue_time_seconds)
    queue: Buckets = ()
    #: the prefix cache's token queries and hits (counters)
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    #: the time to first token's and the inter-token latency's sums (seconds; the histograms' _sum)
    ttft_sum: float | None = None
    itl_sum: float | None = None


@dataclass(frozen=True)
class GpuSample:
    util: float | None  # %
    mem_used: float | None  # MiB
    mem_total: float | None  # MiB


@dataclass(frozen=True)
class HostSample:
    """One look at one host. `error` set: the host or its container did not answer."""
    t: float
    cpu: tuple[float, float] | None = None  # (busy, total) jiffies since boot
    mem: tuple[float, float] | None = None  # (used, total) bytes
    gpus: tuple[GpuSample, ...] = ()
    vllm: VllmSample | None = None
    vllm_error: str | None = None
    error: str | None = None


def parse_vllm(text: str) -> VllmSample:
    """vLLM's /metrics text: each metric summed over its label sets (engines, models)."""
    sums: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith("vllm:") or math.isnan(s.value):
                continue
            if s.name.endswith("_bucket"):
                le = float(s.labels.get("le", "nan"))
                per = buckets.setdefault(s.name[:-len("_bucket")], {})
                per[le] = per.get(le, 0.0) + s.value
            else:
                sums[s.name] = sums.get(s.name, 0.0) + s.value

    def counter(name: str) -> float | None:
        return sums.get(name + "_total", sums.get(name))

    def hist(*names: str) -> Buckets:
        for n in names:
            if n in buckets:
                return tuple(sorted(buckets[n].items()))
        return ()

    kv = sums.get(KV, sums.get(KV_OLD))
    return VllmSample(running=sums.get(RUNNING), waiting=sums.get(WAITING), success=counter(SUCCESS),
                      gen_tokens=counter(GEN_TOKENS), kv=kv, ttft=hist(TTFT), itl=hist(ITL, ITL_OLD),
                      queue=hist(QUEUE), prefix_queries=counter(PREFIX_QUERIES), prefix_hits=counter(PREFIX_HITS),
                      ttft_sum=sums.get(TTFT + "_sum"), itl_sum=sums.get(ITL + "_sum", sums.get(ITL_OLD + "_sum")))


def parse_cpu(line: str) -> tuple[float, float] | None:
    """`cpu  user nice system idle iowait irq softirq steal ...` -> (busy, total) jiffies."""
    parts = line.split()
    if len(parts) < 5 or parts[0] != "cpu":
        return None
    try:
        vals = [float(x) for x in parts[1:9]]
    except ValueError:
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
    total = sum(vals)
    return total - idle, total


def parse_meminfo(text: str) -> tuple[float, float] | None:
    """(used, total) bytes; used = MemTotal - MemAvailable."""
    kb: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("MemTotal", "MemAvailable") and rest.split():
            try:
                kb[name] = float(rest.split()[0])
            except ValueError:
                pass
    if "MemTotal" not in kb or "MemAvailable" not in kb:
        return None
    return (kb["MemTotal"] - kb["MemAvailable"]) * 1024, kb["MemTotal"] * 1024


def parse_gpus(csv: str) -> tuple[GpuSample, ...]:
    """`nvidia-smi --query-gpu=utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits`."""
    def num(x: str) -> float | None:
        try:
            return float(x.strip())
        except ValueError:  # "[N/A]", "[Not Supported]"
            return None

    out = []
    for line in csv.splitlines():
        cols = line.split(",")
        if len(cols) >= 3:
            out.append(GpuSample(num(cols[0]), num(cols[1]), num(cols[2])))
    return tuple(out)


def parse_probe(doc: Mapping, t: float) -> HostSample:
    """What checks/top_probe.py printed (one JSON object) -> a HostSample taken at `t`."""
    vllm, verr = None, doc.get("metrics_error")
    if isinstance(doc.get("metrics"), str):
        try:
            vllm = parse_vllm(doc["metrics"])
        except ValueError as exc:  # not Prometheus text
            verr = f"unreadable /metrics: {exc}"[:200]
    return HostSample(t=t, cpu=parse_cpu(doc.get("stat") or ""), mem=parse_meminfo(doc.get("meminfo") or ""),
                      gpus=parse_gpus(doc.get("gpus") or ""), vllm=vllm, vllm_error=verr)


def histogram_quantile(q: float, old: Buckets, new: Buckets) -> float | None:
    """The q-quantile of the observations between two cumulative histograms (PromQL's
    histogram_quantile over the increase): linear inside the bucket it falls in; the highest
    finite bound when it falls in +Inf. None when nothing was observed."""
    before = dict(old)
    inc = [(le, max(0.0, c - before.get(le, 0.0))) for le, c in new]
    if not inc or inc[-1][1] <= 0:
        return None
    rank = q * inc[-1][1]
    lower, below = 0.0, 0.0
    for le, c in inc:
        if c >= rank:
            if math.isinf(le):
                return lower
            if c == below:
                return le
            return lower + (le - lower) * (rank - below) / (c - below)
        lower, below = le, c
    return lower


def window_mean(old_sum: float | None, old: Buckets, new_sum: float | None, new: Buckets) -> float | None:
    """A histogram's mean over the observations between two samples (its _sum's increase over its
    count's, the +Inf bucket); since the start when there is no earlier sample or the server restarted."""
    if new_sum is None or not new:
        return None
    n0 = old[-1][1] if old else 0.0
    s0 = old_sum if old_sum is not None and old else 0.0
    if new[-1][1] < n0 or new_sum < s0:
        n0 = s0 = 0.0
    n = new[-1][1] - n0
    return (new_sum - s0) / n if n > 0 else None


def _rate(old: float | None, new: float | None, dt: float) -> float | None:
    if old is None or new is None or dt <= 0:
        return None
    return max(0.0, new - old) / dt  # a restarted server starts its counters again: not negative


@dataclass(frozen=True)
class Row:
    """One line of `top`: a replica's vLLM (kind "replica") or a node (kind "node")."""
    kind: str
    name: str
    replica: int | None
    up: bool
    error: str | None = None
    running: float | None = None
    waiting: float | None = None
    req_s: float | None = None
    tok_s: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    itl_p50: float | None = None
    itl_p95: float | None = None
    kv: float | None = None  # %
    #: the median wait in the engine's queue (seconds) and the prefix cache's hit rate (% of the tokens
    #: queried), over the window
    queue_p50: float | None = None
    prefix_hit: float | None = None
    #: the engine's mean time to first token and inter-token latency over the window (seconds): what
    #: a client's end-to-end time is made of, less the router and the network
    ttft_mean: float | None = None
    itl_mean: float | None = None
    cpu: float | None = None  # %
    mem: float | None = None  # %
    gpu_util: float | None = None  # % (mean over the node's GPUs)
    gpu_mem: float | None = None  # % of the node's GPU memory used
    hosts: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["hosts"] = list(self.hosts)
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def _pair(history: Sequence[HostSample], window: float) -> tuple[HostSample | None, HostSample | None,
                                                                 HostSample | None]:
    """(previous, latest, oldest within the window) among the answered samples."""
    ok = [s for s in history if s.error is None]
    if not ok:
        return None, None, None
    latest = ok[-1]
    prev = ok[-2] if len(ok) > 1 else None
    inside = [s for s in ok if latest.t - s.t <= window]
    return prev, latest, inside[0] if inside and inside[0] is not latest else prev


def replica_row(name: str, replica: int | None, hosts: Sequence[str], history: Sequence[HostSample],
                window: float = WINDOW) -> Row:
    """A replica's vLLM from its head's samples: load now, rates over the last interval,
    percentiles over the window (since the server started when there is one sample only)."""
    last = history[-1] if history else None
    if last is None:
        return Row("replica", name, replica, False, "no sample yet", hosts=tuple(hosts))
    if last.error or last.vllm is None:
        return Row("replica", name, replica, False, last.error or last.vllm_error or "no /metrics",
                   hosts=tuple(hosts))
    prev, latest, oldest = _pair([s for s in history if s.vllm is not None], window)
    v = latest.vllm
    pv, ov = (prev.vllm if prev else None), (oldest.vllm if oldest else None)
    dt = latest.t - prev.t if prev else 0.0
    base_ttft, base_itl, base_queue = (ov.ttft, ov.itl, ov.queue) if ov else ((), (), ())
    return Row(
        "replica", name, replica, True, None, v.running, v.waiting,
        _rate(pv.success if pv else None, v.success, dt), _rate(pv.gen_tokens if pv else None, v.gen_tokens, dt),
        histogram_quantile(0.5, base_ttft, v.ttft), histogram_quantile(0.95, base_ttft, v.ttft),
        histogram_quantile(0.5, base_itl, v.itl), histogram_quantile(0.95, base_itl, v.itl),
        None if v.kv is None else v.kv * 100, histogram_quantile(0.5, base_queue, v.queue),
        hit_rate(ov.prefix_queries if ov else None, ov.prefix_hits if ov else None, v.prefix_queries, v.prefix_hits),
        ttft_mean=window_mean(ov.ttft_sum if ov else None, base_ttft, v.ttft_sum, v.ttft),
        itl_mean=window_mean(ov.itl_sum if ov else None, base_itl, v.itl_sum, v.itl),
        hosts=tuple(hosts))


def hit_rate(q0: float | None, h0: float | None, q1: float | None, h1: float | None) -> float | None:
    """The prefix cache's hits over its queries between two samples, in % (since the start when there is
    no earlier sample or the counters restarted); None: not exported or nothing queried."""
    if q1 is None or h1 is None:
        return None
    if q0 is None or h0 is None or q1 < q0 or h1 < h0:
        q0 = h0 = 0.0
    dq = q1 - q0
    return 100 * (h1 - h0) / dq if dq > 0 else None


def node_row(name: str, replica: int | None, history: Sequence[HostSample]) -> Row:
    """A node: CPU over the last interval, memory and GPUs now."""
    last = history[-1] if history else None
    if last is None or last.error:
        return Row("node", name, replica, False, last.error if last else "no sample yet")
    prev, latest, _ = _pair(history, WINDOW)
    cpu = None
    if prev and prev.cpu and latest.cpu and latest.cpu[1] > prev.cpu[1]:
        cpu = 100 * (latest.cpu[0] - prev.cpu[0]) / (latest.cpu[1] - prev.cpu[1])
    mem = 100 * latest.mem[0] / latest.mem[1] if latest.mem and latest.mem[1] else None
    utils = [g.util for g in latest.gpus if g.util is not None]
    used = sum(g.mem_used or 0 for g in latest.gpus)
    total = sum(g.mem_total or 0 for g in latest.gpus)
    return Row("node", name, replica, True, None, cpu=cpu, mem=mem,
               gpu_util=sum(utils) / len(utils) if utils else None,
               gpu_mem=100 * used / total if total else None)


# -- the same rows from Prometheus (when `bootstrap monitor` runs) ----------------------------------

#: PromQL per column, by the `host` label bootstrap puts on every target; {q} is a quantile.
PROMQL = {
    "up_vllm": 'max by (host) (up{job="vllm"})',
    "running": "sum by (host) (vllm:num_requests_running)",
    "waiting": "sum by (host) (vllm:num_requests_waiting)",
    "req_s": "sum by (host) (rate(vllm:request_success_total[1m]))",
    "tok_s": "sum by (host) (rate(vllm:generation_tokens_total[1m]))",
    "ttft_p50": "histogram_quantile(0.5, sum by (host, le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
    "ttft_p95": "histogram_quantile(0.95, sum by (host, le) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
    "itl_p50": "histogram_quantile(0.5, sum by (host, le) (rate(vllm:inter_token_latency_seconds_bucket[1m])))",
    "itl_p95": "histogram_quantile(0.95, sum by (host, le) (rate(vllm:inter_token_latency_seconds_bucket[1m])))",
    "kv": "100 * max by (host) (vllm:kv_cache_usage_perc)",
    "queue_p50": "histogram_quantile(0.5, sum by (host, le) (rate(vllm:request_queue_time_seconds_bucket[1m])))",
    "prefix_hit": "100 * sum by (host) (rate(vllm:prefix_cache_hits_total[1m])) / sum by (host) "
                  "(rate(vllm:prefix_cache_queries_total[1m]))",
    "ttft_mean": "sum by (host) (rate(vllm:time_to_first_token_seconds_sum[1m])) / sum by (host) "
                 "(rate(vllm:time_to_first_token_seconds_count[1m]))",
    "itl_mean": "sum by (host) (rate(vllm:inter_token_latency_seconds_sum[1m])) / sum by (host) "
                "(rate(vllm:inter_token_latency_seconds_count[1m]))",
    "up_node": 'max by (host) (up{job="node"})',
    "cpu": '100 * (1 - avg by (host) (rate(node_cpu_seconds_total{mode="idle"}[1m])))',
    "mem": "100 * (1 - max by (host) (node_memory_MemAvailable_bytes) / max by (host) (node_memory_MemTotal_bytes))",
    "gpu_util": "avg by (host) (DCGM_FI_DEV_GPU_UTIL)",
    "gpu_mem": "100 * sum by (host) (DCGM_FI_DEV_FB_USED) / sum by (host) (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)",
}


def by_host(result: Sequence[Mapping]) -> dict[str, float]:
    """An instant vector (Prometheus' /api/v1/query result) -> host -> value; NaN left out."""
    out = {}
    for item in result:
        host = item.get("metric", {}).get("host")
        try:
            v = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if host is not None and not math.isnan(v):
            out[host] = v
    return out


def rows_from_prometheus(values: Mapping[str, Mapping[str, float]],
                         groups: Sequence[tuple[str, int | None, Sequence[str]]],
                         replica_of: Mapping[str, int | None]) -> tuple[Row, ...]:
    """The rows of `top` from PROMQL's answers (`values[column][host]`). groups: (row name,
    replica, hosts with the head first) per serving group."""
    def get(col: str, host: str) -> float | None:
        return values.get(col, {}).get(host)

    rows = []
    for name, replica, hosts in groups:
        head = hosts[0]
        up = get("up_vllm", head)
        if up != 1.0:
            why = "no vLLM target in Prometheus" if up is None else "Prometheus cannot scrape vLLM (up == 0)"
            rows.append(Row("replica", name, replica, False, why, hosts=tuple(hosts)))
            continue
        cols = ("running", "waiting", "req_s", "tok_s", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "kv",
                "queue_p50", "prefix_hit", "ttft_mean", "itl_mean")
        rows.append(Row("replica", name, replica, True, None, hosts=tuple(hosts), **{c: get(c, head) for c in cols}))
    for host, replica in replica_of.items():
        up = get("up_node", host)
        if up != 1.0:
            why = "no node exporter target" if up is None else "Prometheus cannot scrape its node exporter (up == 0)"
            rows.append(Row("node", host, replica, False, why))
            continue
        rows.append(Row("node", host, replica, True, None, cpu=get("cpu", host), mem=get("mem", host),
                        gpu_util=get("gpu_util", host), gpu_mem=get("gpu_mem", host)))
    return tuple(rows)
