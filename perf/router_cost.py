#!/usr/bin/env python3
"""The router's own cost, without bootstrap, vLLM or Docker: vllm-router in front of a stub server that
answers at once (two of them, as two replicas), against one stub alone, in one run (issue 53.3).

The stub (`python -m perf.router_cost stub PORT`) speaks just enough of vLLM's OpenAI server: GET /health,
GET /v1/models, POST /v1/completions streamed as server-sent events (a few chunks, the usage chunk and
`data: [DONE]`, each written as soon as the request is read), HTTP/1.1 keep-alive, chunked transfer. One
vllm-router per setting under test runs on loopback in front of it. The client sends single streaming
requests (concurrency 1, a new connection per request as `bootstrap bench` does, or one kept-alive
connection), interleaved over the arms in blocks so that the machine's noise falls on every arm alike, and
prints per arm TTFT (first `data:` line) and total time, p50/p90/p99/max, and the difference to the stub
alone at each percentile.

Example (vllm-router from the package index in a venv):
  python -m perf.router_cost --router /tmp/vr/bin/vllm-router --requests 2000
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from perf import verdict as V

CHUNKS = 4
#: What the stub was asked besides completions (path -> count), served at GET /stub_counts.
SEEN: dict[str, int] = {}


# ----------------------------------------------------------------------------------------------- stub
def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, nodelay: bool, itl: float) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if nodelay else 0)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
            n = int(headers.get("content-length", "0") or 0)
            if n:
                await reader.readexactly(n)
            if path != "/stub_counts" and not (method == "POST" and path.startswith("/v1/")):
                SEEN[f"{method} {path}"] = SEEN.get(f"{method} {path}", 0) + 1
            if method == "POST" and path.startswith("/v1/"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"transfer-encoding: chunked\r\n\r\n")
                await writer.drain()
                for i in range(CHUNKS):
                    if itl:  # tokens one at a time, as an engine decodes: each its own write
                        await asyncio.sleep(itl)
                    writer.write(_chunk(_sse({"id": "cmpl-stub", "object": "text_completion", "model": "stub",
                                              "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]})))
                    await writer.drain()
                writer.write(_chunk(_sse({"id": "cmpl-stub", "object": "text_completion", "model": "stub",
                                          "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": CHUNKS,
                                                                   "total_tokens": 4 + CHUNKS}})))
                writer.write(_chunk(_sse(b"[DONE]")) + b"0\r\n\r\n")
            else:
                body = (json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode()
                        if path.startswith("/v1/models") else json.dumps(SEEN).encode()
                        if path == "/stub_counts" else b"{}")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def stub_main(port: int, nodelay: bool, itl: float) -> None:
    async def serve() -> None:
        server = await asyncio.start_server(lambda r, w: _handle(r, w, nodelay, itl), "127.0.0.1", port)
        async with server:
            await server.serve_forever()
    asyncio.run(serve())


# --------------------------------------------------------------------------------------------- client
@dataclass
class Arm:
    name: str
    port: int
    argv: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    failed: int = 0


BODY = json.dumps({"model": "stub", "prompt": "hello", "max_tokens": CHUNKS, "stream": True,
                   "stream_options": {"include_usage": True}}).encode()


def set_body(model: str, tokens: int) -> None:
    """The request every arm sends (real engines: `ignore_eos` so that each answer is `tokens` long)."""
    global BODY
    BODY = json.dumps({"model": model, "prompt": "hello", "max_tokens": tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0, "stream_options": {"include_usage": True}}).encode()


def one(port: int, conn: http.client.HTTPConnection | None, host: str = "127.0.0.1") -> tuple[float, float]:
    """TTFT and total of one streamed completion, in seconds (a new connection unless one is given)."""
    t0 = time.perf_counter()
    c = conn or http.client.HTTPConnection(host, port, timeout=10)
    c.request("POST", "/v1/completions", body=BODY,
              headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}")
    first = None
    while True:
        line = r.readline()
        if not line:
            raise RuntimeError("stream ended without [DONE]")
        if line.startswith(b"data:") and first is None:
            first = time.perf_counter()
        if line.strip() == b"data: [DONE]":
            break
    if conn is None:
        c.close()
    else:
        r.read()
    return first - t0, time.perf_counter() - t0


def wait_ready(port: int, deadline_s: float = 60, host: str = "127.0.0.1") -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            one(port, None, host)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            time.sleep(0.3)
    raise SystemExit(f"nothing answers a completion on {host}:{port} within {deadline_s:g} s")


#: The arm of a pool's router: the same vllm-router behind checks/router_entry.py's front, which a pool's
#: router container runs on the router's address (vllm-router itself on loopback, the same port).
FRONT = "router + pool's front"
FRONT_HOST = "127.0.0.3"


def front_main(port: int) -> None:
    """checks/router_entry.py's front on FRONT_HOST:PORT, passing on to vllm-router on 127.0.0.1:PORT."""
    import importlib.util
    import threading

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "checks", "router_entry.py")
    spec = importlib.util.spec_from_file_location("router_entry", path)
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    entry.run_front(entry.Front("127.0.0.1", port, "[]"), FRONT_HOST, threading.Event())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * len(xs) + 0.5) - 1))] if xs else float("nan")


def table(arms: list[Arm], what: str) -> str:
    qs = (50, 90, 99)
    base = arms[0]
    head = f"{what} in ms{'':8}" + "".join(f"{'p' + str(q):>9}" for q in qs) + f"{'max':>9}" + "".join(
        f"{'+p' + str(q):>9}" for q in qs) + f"{'>20ms':>7}{'failed':>8}"
    rows = [head]
    for a in arms:
        xs = getattr(a, what)
        bs = getattr(base, what)
        row = f"{a.name:<22}" + "".join(f"{pct(xs, q) * 1e3:9.2f}" for q in qs) + f"{max(xs) * 1e3:9.2f}"
        row += "".join(f"{(pct(xs, q) - pct(bs, q)) * 1e3:+9.2f}" for q in qs)
        slow = sum(1 for x in xs if x - pct(bs, 50) > 0.020)
        rows.append(row + f"{slow:7d}{a.failed:8d}")
    return "\n".join(rows)


def router_argv(binary: str, port: int, stubs: list[int], extra: tuple[str, ...]) -> tuple[str, ...]:
    """The router as bootstrap starts it (fleet/plan.py router_run_argv), on loopback, before `extra`."""
    return (binary, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *(f"http://127.0.0.1:{s}" for s in stubs),
            "--policy", "power_of_two", "--health-check-interval-secs", "2", "--health-check-timeout-secs", "5",
            "--health-failure-threshold", "3", "--health-success-threshold", "1",
            "--health-check-endpoint", "/health", "--worker-startup-timeout-secs", "30",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), *extra)


#: The settings tried, named for the table: what bootstrap runs, then one change each.
SETTINGS: dict[str, tuple[str, ...]] = {
    "router (bootstrap's)": (),
    "round_robin": ("--policy", "round_robin"),
    "cache_aware": ("--policy", "cache_aware"),
    "health every 60 s": ("--health-check-interval-secs", "60"),
    "no retries": ("--disable-retries",),
    "no circuit breaker": ("--disable-circuit-breaker",),
    "log warning": ("--log-level", "warning"),
}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    st = sub.add_parser("stub")
    st.add_argument("port", type=int)
    st.add_argument("--no-nodelay", action="store_true")
    st.add_argument("--itl-ms", type=float, default=0.0)
    fr = sub.add_parser("front")
    fr.add_argument("port", type=int)
    ap.add_argument("--router", default="vllm-router", help="the vllm-router executable")
    ap.add_argument("--requests", type=int, default=1000, help="per arm")
    ap.add_argument("--block", type=int, default=25, help="requests per arm before the next arm's turn")
    ap.add_argument("--keepalive", action="store_true", help="one connection per arm (default: one per request)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names of SETTINGS")
    ap.add_argument("--stub-no-nodelay", action="store_true", help="the stub turns Nagle's algorithm on")
    ap.add_argument("--itl-ms", type=float, default=0.0,
                    help="the stub's time between tokens (0: the whole answer at once)")
    ap.add_argument("--workers", nargs=2, metavar="PORT",
                    help="two servers already listening on 127.0.0.1 (e.g. vllm serve) instead of the stubs")
    ap.add_argument("--model", default="stub", help="the model name the requests carry (with --workers)")
    ap.add_argument("--tokens", type=int, default=CHUNKS, help="tokens per answer (with --workers)")
    return ap.parse_args(argv)


def start(a: argparse.Namespace, procs: list[subprocess.Popen]) -> tuple[list[int], list[Arm]]:
    """The workers (two stubs, or the ports given) and one router per setting, each answering."""
    if a.workers:
        set_body(a.model, a.tokens)
    stubs = [int(x) for x in a.workers] if a.workers else [free_port(), free_port()]  # power_of_two needs 2
    for stub_port in () if a.workers else stubs:
        stub_cmd = [sys.executable, "-m", "perf.router_cost", "stub", str(stub_port)]
        stub_cmd += ["--itl-ms", str(a.itl_ms)] + (["--no-nodelay"] if a.stub_no_nodelay else [])
        procs.append(subprocess.Popen(stub_cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for stub_port in stubs:
        wait_ready(stub_port)
    arms = [Arm("worker alone" if a.workers else "stub alone", stubs[0])]
    for name in a.settings.split(","):
        port = free_port()
        argv_ = router_argv(a.router, port, stubs, SETTINGS[name])
        procs.append(subprocess.Popen(argv_, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        arms.append(Arm(name, port, argv_))
        if name == "router (bootstrap's)":  # and the same router behind a pool's front
            argv_ = (sys.executable, "-m", "perf.router_cost", "front", str(port))
            procs.append(subprocess.Popen(argv_, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
            arms.append(Arm(FRONT, port, argv_, FRONT_HOST))
    for arm in arms[1:]:
        wait_ready(arm.port, host=arm.host)
    return stubs, arms


def measure(a: argparse.Namespace, arms: list[Arm]) -> float:
    """Warm every arm alike, then a.requests per arm in blocks of a.block, arm after arm; the seconds it took."""
    def conn(arm: Arm) -> http.client.HTTPConnection | None:
        return http.client.HTTPConnection(arm.host, arm.port, timeout=10) if a.keepalive else None

    conns = {arm.name: conn(arm) for arm in arms}
    for arm in arms:
        for _ in range(20):
            one(arm.port, conns[arm.name], arm.host)
    t0 = time.monotonic()
    while len(arms[-1].total) + arms[-1].failed < a.requests:
        for arm in arms:
            for _ in range(min(a.block, a.requests - len(arm.total) - arm.failed)):
                try:
                    f, t = one(arm.port, conns[arm.name], arm.host)
                    arm.ttft.append(f)
                    arm.total.append(t)
                except (OSError, RuntimeError, http.client.HTTPException):
                    arm.failed += 1
                    conns[arm.name] = conn(arm)
    return time.monotonic() - t0


#: Issue 53.3's targets for the router's own cost (TTFT through it minus alone, per percentile), ms.
TARGETS = ((50, 2.0), (99, 10.0))
#: Issue 67's for the pool's front (TTFT through router and front minus the router alone, p50), ms.
FRONT_TARGET = 1.0


def checks(arms: list[Arm]) -> list[V.Check]:
    """The targets, measured on the router as bootstrap runs it (the first arm after the alone one)."""
    router = next((x for x in arms[1:] if x.name == "router (bootstrap's)"), None)
    out = []
    for q, limit in TARGETS:
        name = f"router TTFT +p{q} (through it minus alone)"
        if router is None or not router.ttft or not arms[0].ttft:
            out.append(V.not_measured(name, "<=", limit, "the router as bootstrap runs it was not among --settings",
                                      unit=" ms"))
        else:
            out.append(V.Check(name, "<=", limit, (pct(router.ttft, q) - pct(arms[0].ttft, q)) * 1e3, unit=" ms"))
    front = next((x for x in arms if x.name == FRONT), None)
    name = "pool's front TTFT +p50 (router and front minus router)"
    if router is None or front is None or not front.ttft or not router.ttft:
        out.append(V.not_measured(name, "<=", FRONT_TARGET, "the router as bootstrap runs it was not among --settings",
                                  unit=" ms"))
    else:
        out.append(V.Check(name, "<=", FRONT_TARGET, (pct(front.ttft, 50) - pct(router.ttft, 50)) * 1e3, unit=" ms"))
    return out


def report(a: argparse.Namespace, stubs: list[int], arms: list[Arm], wall: float) -> int:
    mode = "one kept-alive connection per arm" if a.keepalive else "a new connection per request"
    print(f"{a.requests} requests per arm, concurrency 1, {mode}, interleaved in blocks of {a.block}; "
          + (f"workers :{stubs[0]} :{stubs[1]}, {a.tokens} tokens; " if a.workers
             else f"stub: {CHUNKS} tokens {a.itl_ms:g} ms apart; ")
          + f"{wall:.0f} s; {os.cpu_count()} cores; router {a.router}")
    print(table(arms, "ttft"))
    print()
    print(table(arms, "total"))
    print(f"\nmedian of the stub alone: {statistics.median(arms[0].total) * 1e3:.2f} ms")
    for s in () if a.workers else stubs:
        with urllib.request.urlopen(f"http://127.0.0.1:{s}/stub_counts", timeout=5) as r:
            seen = json.loads(r.read())
        print(f"stub :{s} was asked, besides completions, by {len(arms) - 1} router(s) in {wall:.0f} s: "
              + (", ".join(f"{k} x{v}" for k, v in sorted(seen.items())) or "nothing"))
    found = checks(arms)
    print("\n".join(V.lines(found)))
    return V.exit_status(found)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    if a.cmd == "stub":
        stub_main(a.port, not a.no_nodelay, a.itl_ms / 1e3)
        return 0
    if a.cmd == "front":
        front_main(a.port)
        return 0
    procs: list[subprocess.Popen] = []
    try:
        stubs, arms = start(a, procs)
        return report(a, stubs, arms, measure(a, arms))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
