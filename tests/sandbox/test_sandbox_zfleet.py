"""Replicas behind one endpoint on the sandbox: 4 nodes, 2 replicas x 2 nodes (CPU, native mode),
vllm-router in front. One fleet is shared by every test here (and this module runs last: it needs
4 nodes, the others 3).

What a user meets is real: sshd, Docker in each node, vLLM (CPU build) in each serve container,
vllm-router, `docker kill`.
"""
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.support.dashboards import DASHBOARD, dashboard_queries
from tests.support.fleet_load import MODEL, Load, complete, status, wait_healthy
from tests.support.sandbox import (
    CONTAINER,
    ROOT,
    cli,
    on_node,
    stranger_post,
    stranger_scan,
    up_serve_down,
    writable_layers,
    write_inventory,
)

pytestmark = pytest.mark.sandbox
FLAGS = ["--enforce-eager", "--max-model-len", "256"]
SERVE = "bootstrap-vllm-serve"
#: the fleet's API key (cluster.router.api_key names the secret FLEET_KEY; set in the fixture)
KEY = "sk-sandbox-" + os.urandom(6).hex()
#: node name -> what its Docker and /tmp held before the fleet came up (what_is_on): the last test
#: shows that `down` leaves nothing beyond it
BEFORE = {}
PROMPT = "The quick brown fox"


def what_is_on(node):
    """The node's containers (all; those with a bootstrap label), volumes and networks, and the
    secrets bootstrap keeps on the host's tmpfs (/run/bootstrap/<cluster>, cluster/secretstore.py)."""
    def words(*argv):
        return sorted(on_node(node, *argv).stdout.split())
    return {"containers": words("docker", "ps", "-a", "--format", "{{.Names}}"),
            "labelled": words("docker", "ps", "-a", "--filter", "label=bootstrap.cluster", "--format", "{{.Names}}"),
            "volumes": words("docker", "volume", "ls", "-q"),
            "networks": words("docker", "network", "ls", "--format", "{{.Name}}"),
            "secrets": words("find", "/run", "-maxdepth", "2", "-path", "/run/bootstrap*")}


@pytest.fixture(scope="module")
def fleet(_sandbox_session, tmp_path_factory):
    from bootstrap import sandbox as S

    before = S.sandbox_info()
    ids = {}
    if before is not None and len(before.nodes) < 4:  # the 3-node sandbox of the other modules grows
        ids = {n.name: subprocess.run(["docker", "inspect", "--format", "{{.Id}}", n.container],
                                      capture_output=True, text=True).stdout for n in before.nodes}
    from tests.support.sandbox import shared_sandbox

    sb = S.sandbox_up(4, log=lambda m: print(f"sandbox: {m}", flush=True), **shared_sandbox())
    for n in sb.nodes[:len(ids)]:  # grown, not recreated: the running nodes (and their images) stayed
        assert subprocess.run(["docker", "inspect", "--format", "{{.Id}}", n.container], capture_output=True,
                              text=True).stdout == ids[n.name], n.name

    def mutate(doc):
        doc["cluster"]["replicas"] = 2
        # kv_events: the engines publish their KV cache events, so that bench --ab can try kv_aware
        doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2, "api_key": "FLEET_KEY",
                                    "kv_events": True}
        doc["cluster"]["secrets"] = [*doc["cluster"].get("secrets", []), "FLEET_KEY"]
    os.environ["FLEET_KEY"] = KEY  # the CLI reads secrets from its environment
    inv = write_inventory(sb.inventory, tmp_path_factory.mktemp("fleet") / "fleet.yaml", mutate)
    BEFORE.update({n.name: what_is_on(n) for n in sb.nodes})
    for r in up_serve_down(sb, inv, MODEL, "--", *FLAGS):
        yield sb, inv, r
    os.environ.pop("FLEET_KEY", None)


def endpoint_of(serve_out):
    line = next(ln for ln in serve_out.splitlines() if ln.startswith("serving "))
    return line.split(" on ", 1)[1].split(" ", 1)[0]


def test_serve_puts_both_replicas_behind_the_router_and_spreads_requests(fleet):
    sb, inv, served = fleet
    lines = served.stdout.splitlines()
    assert "replica 0: node1, node2 -> http://172.31.240.11:8000" in lines or any(
        ln.startswith("replica 0: node1, node2 -> ") for ln in lines), served.stdout
    assert any(ln.startswith("replica 1: node3, node4 -> ") for ln in lines), served.stdout
    endpoint = endpoint_of(served.stdout)
    assert endpoint == f"http://{sb.nodes[0].ip}:30000/v1"  # the router, on replica 0's head, data-plane IP
    body = json.dumps({"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0})
    # the API key: the curl shown names the variable, never the value; without the key the router's
    # answer is the replica's 401, with it a completion
    assert 'Authorization: Bearer $FLEET_KEY' in served.stdout and KEY not in served.stdout + served.stderr
    for url, key in ((endpoint, None), ("http://" + sb.nodes[2].ip + ":8000/v1", "wrong-key")):
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        req = urllib.request.Request(url + "/completions", body.encode(), headers)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=60)
        assert refused.value.code == 401, url
    assert complete(endpoint, PROMPT, KEY)
    for n in sb.nodes:  # the key reached the containers through files on a tmpfs, never a command line
        cmdlines = on_node(n, "sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '", check=False).stdout
        assert cmdlines and KEY not in cmdlines, n.name
    assert_secret_rests_nowhere_in_docker(sb, KEY)

    # both replicas answer: bench through the router reports the spread from their own counters
    r = cli("bench", "-i", inv, "-n", "20", "--concurrency", "4", "--max-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout)
    assert doc["ok"] == 20
    per = doc["spread"]["per_replica"]
    assert set(per) == {"0", "1"} and all(v >= 5 for v in per.values()), per
    st = status(inv)
    assert [r["health"] for r in st["replicas"]] == ["healthy", "healthy"]
    assert all(r["in_rotation"] for r in st["replicas"])
    assert [r["router_healthy"] for r in st["replicas"]] == [True, True]  # the router's own health view
    assert sorted(st["router_workers"]) == sorted(r["url"] for r in st["replicas"])  # the router's own order


def assert_secret_rests_nowhere_in_docker(sb, value):
    """cluster.secrets (FLEET_KEY, and the API key under VLLM_API_KEY): no `docker inspect` of any
    container holds the value, nor Docker's or containerd's records under /var/lib/docker (configs,
    volumes, metadata, every container's writable layer); it is on each host's /run (a tmpfs) as
    0400 files, and the processes that need it have it in their environment."""
    for n in sb.nodes:
        names = on_node(n, "docker", "ps", "-aq").stdout.split()
        assert names, n.name
        inspect = on_node(n, "docker", "inspect", *names).stdout
        assert value not in inspect and "VLLM_API_KEY=" not in inspect, n.name
        uppers = writable_layers(n, names)  # the image layers left out where the store allows
        found = on_node(n, "grep", "-rlF", "--exclude-dir=overlay2", "--exclude-dir=rootfs", value, "/var/lib/docker",
                        *[u for u in uppers if u != "/var/lib/docker/containerd"], check=False)
        assert found.returncode == 1 and not found.stdout, f"{n.name}: the secret is in {found.stdout}"
        files = on_node(n, "sh", "-c", "stat -f -c %T /run; cd /run/bootstrap/sandbox && stat -c '%a %n' . serve "
                        "serve/* router/* 2>/dev/null").stdout.split("\n")
        assert files[0] == "tmpfs", (n.name, files)
        assert {"700 .", "700 serve", "400 serve/VLLM_API_KEY"} <= set(files), (n.name, files)
        assert not [f for f in files if f.endswith("/FLEET_KEY")], (n.name, files)  # the key as VLLM_API_KEY only
        # the serve container's PID 1 (the member supervisor) has it once; the count only, never the value
        env = on_node(n, "docker", "exec", "bootstrap-vllm-serve", "sh", "-c",
                      f"tr '\\0' '\\n' < /proc/1/environ | grep -cxF -e 'FLEET_KEY={value}' -e 'VLLM_API_KEY={value}'",
                      check=False).stdout.strip()
        assert env == "1", (n.name, env)
    router = on_node(sb.nodes[0], "sh", "-c", "ls /run/bootstrap/sandbox/router").stdout.split()
    assert router == ["VLLM_API_KEY"], router  # the router's set: the key only


def top_once(inv):
    r = cli("top", "-i", inv, "--once", "--json", "--interval", "2")
    return r.returncode, json.loads(r.stdout)


def test_top_shows_every_replica_and_node_under_load_and_in_a_terminal(fleet):
    sb, inv, served = fleet
    with Load(endpoint_of(served.stdout), key=KEY, concurrency=4):
        time.sleep(4)
        rc, doc = top_once(inv)
        # as a person sees it: the live view in a real terminal (tmux), the pane captured
        session = f"top-{os.getpid()}"
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "40",
                        f"cd {ROOT} && {sys.executable} -m bootstrap top -i {inv} --interval 1"],
                       check=True, env={**os.environ, "TERM": "xterm-256color"})
        rows = ("replica 0", "replica 1", *(n.name for n in sb.nodes))
        try:  # wait for a whole frame drawn from two looks (rates need two), bounded: a capture can land
            # while the frame is being written (seen in a fresh-clone run: the node table's rows not yet there)
            for _ in range(60):
                time.sleep(1)
                pane = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                      text=True, check=True).stdout
                drawn = all(any(ln.strip("│ ").startswith(r) for ln in pane.splitlines()) for r in rows)
                if "latency over the last" in pane and "latency over the last 0s" not in pane and drawn:
                    break
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], check=False)
    print(f"top --once --json: {json.dumps(doc)}\ntmux pane:\n{pane}")
    assert rc == 0 and doc["source"] == "probe"
    reps = {r["name"]: r for r in doc["replicas"]}
    assert set(reps) == {"replica 0", "replica 1"} and all(r["up"] for r in reps.values())
    assert all(r["running"] is not None and r["waiting"] is not None and r["kv"] is not None for r in reps.values())
    assert sum(r["running"] + r["waiting"] for r in reps.values()) >= 1
    assert sum(r["tok_s"] or 0 for r in reps.values()) > 0
    # what vllm-router does not tell, from the engines' own metrics: the queue wait and the prefix cache's hits
    assert any(r["queue_p50"] is not None for r in reps.values()), reps
    assert any(r["prefix_hit"] is not None and 0 <= r["prefix_hit"] <= 100 for r in reps.values()), reps
    means = [r["means"] for r in status(inv)["replicas"]]
    assert all(m["ttft_ms"] > 0 and m["itl_ms"] > 0 and m["queue_ms"] is not None for m in means), means
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in sb.nodes]
    assert all(n["up"] and n["cpu"] is not None and 0 < n["mem"] < 100 for n in doc["nodes"])
    lines = pane.splitlines()
    for name in rows:
        row = next((ln for ln in lines if ln.strip("│ ").startswith(name)), None)
        assert row is not None and "DOWN" not in row, (name, pane)
    rep0 = next(ln for ln in lines if ln.strip("│ ").startswith("replica 0"))
    assert "node1, node2" in rep0 and any(c.isdigit() for c in rep0.split("│")[2]), rep0


def test_top_reads_the_replicas_latency_within_20_percent_of_what_bench_measured_meanwhile(fleet):
    """`top`'s per-replica figures over its window, from each engine's own histograms (what vllm-router does
    not export), against what `bench` measured through the router over the same load: each replica's mean
    time to first token plus one mean inter-token latency per further token, weighted by the requests each
    finished in the window, within 20 % of the client's mean end-to-end time (the router and the network are
    the difference). The window spans most of the load: over a 3.5 s window one replica read 833 ms against
    the client's 1336 ms mean while the other read 1250 ms (two requests in flight each, a 2-core machine).
    Not TTFT alone: the tiny model's byte-level tokens often end mid-character, so the client's first text
    comes a token after the engine's."""
    sb, inv, served = fleet
    load = subprocess.Popen([sys.executable, "-m", "bootstrap", "bench", "-i", inv, "-n", "64", "--concurrency", "4",
                             "--max-tokens", "16", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # the load is steady: every replica has requests in flight
        r = cli("top", "-i", inv, "--once", "--json", "--interval", "10")
    finally:
        out, err = load.communicate(timeout=600)
    assert r.returncode == 0 and load.returncode == 0, (r.stderr[-1000:], err[-2000:])
    doc, bench = json.loads(r.stdout), json.loads(out)
    print(f"bench: {json.dumps(bench)[-1500:]}")
    assert bench["ok"] == 64 and bench["wall_seconds"] > doc["window_seconds"] + 3, (bench, doc["window_seconds"])
    tokens = bench["output_tokens"] / bench["ok"]
    client = bench["e2e_ms"]["mean"]
    total = weighted = 0.0
    for rep in doc["replicas"]:
        assert rep["up"] and rep["ttft_mean"] and rep["itl_mean"] and rep["ttft_p50"] and rep["itl_p50"], rep
        assert rep["queue_p50"] is not None and rep["prefix_hit"] is not None and rep["req_s"], rep
        total += rep["req_s"]
        weighted += rep["req_s"] * 1000 * (rep["ttft_mean"] + (tokens - 1) * rep["itl_mean"])
    engine = weighted / total
    print(f"engines over top's window: {engine:.0f} ms a request; the client's mean: {client:.0f} ms")
    assert abs(engine - client) <= 0.2 * client, (engine, client)


def test_bench_ab_measures_three_policies_on_one_workload_and_gives_the_routers_their_policy_back(fleet, tmp_path):
    """`bench --ab`: a short A/B of three policies (kv_aware among them) on the shared-prefix workload through
    the real routers; every column of the table measured (the engines' own prefix-cache and request counters
    among them), round robin's spread even, the inventory's policy back on the router at the end."""
    sb, inv, served = fleet
    png = tmp_path / "ab.png"
    # 80 words: a shared part of ~150 tokens, more than one of vLLM-CPU's 128-token KV blocks (a prefix hits in
    # whole blocks), and the prompt within --max-model-len 256
    r = cli("bench", "-i", inv, "--ab", "round_robin,cache_aware,kv_aware", "--workload", "shared-prefix",
            "--prompt-words", "80", "-n", "12", "--concurrency", "3", "--max-tokens", "8", "--repeats", "1",
            "--warmup", "2", "--yes", "--json", "--png", str(png), timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = {row["policy"]: row for row in doc["rows"]}
    assert list(rows) == ["round_robin", "cache_aware", "kv_aware"] and doc["restored_policy"] == "round_robin"
    for row in rows.values():
        assert (row["requests"], row["ok"], row["failed"], row["shed"]) == (12, 12, 0, 0), row
        assert row["requests_per_s"] > 0 and 0 < row["goodput"] <= row["requests_per_s"], row
        assert 0 < row["ttft_ms"]["p50"] <= row["ttft_ms"]["p99"] and 0 < row["itl_ms"]["p50"], row
        assert row["prefix_hit_pct"] is not None and 0 < row["prefix_hit_pct"] <= 100, row  # a shared prefix hits
        assert sum(row["per_replica"].values()) == 12, row  # the engines counted every measured request
    assert rows["round_robin"]["per_replica"] == {"0": 6, "1": 6}
    # kv_aware routed by the engines' own KV events: its index (the BlockStored events of each engine, over
    # ZMQ) held the shared prefix for requests of its arm; the other policies made no such lookup
    assert rows["kv_aware"]["kv_index_hit_pct"] is not None and rows["kv_aware"]["kv_index_hit_pct"] > 0, rows
    assert rows["round_robin"]["kv_index_hit_pct"] is None
    # what the engines measured over the arms (the figures `top` and `status` show) agrees with what the client
    # measured through the router: a request's time to the first token and then one inter-token latency per
    # further token, against the client's end-to-end time, over all the arms. (Not TTFT alone: the tiny model's
    # random byte-level tokens often end mid-character, vLLM streams an empty text for them and the client's
    # first text comes a token or two after the engine's first token; 23 % apart in one run, its TPOT 28 % the
    # other way.) Per arm the difference includes that policy's own router cost: in a CI run cache_aware's arm
    # read 351 ms against the client's 463 ms (client TTFT 174 ms, the engines' 73 ms) while round robin's read
    # 745 against 756; so per arm the client is never faster than the engines by more than the noise.
    engine = client = 0.0
    for a in doc["arms"]:
        per_request = a["output_tokens"] / a["ok"]
        mine = a["engine_ttft_ms"] + (per_request - 1) * a["engine_itl_ms"]
        print(f"{a['policy']}: the engines {mine:.0f} ms a request, the client {a['e2e_ms']['mean']:.0f} ms")
        assert mine <= 1.2 * a["e2e_ms"]["mean"], (mine, a)
        engine, client = engine + mine, client + a["e2e_ms"]["mean"]
    assert abs(engine - client) <= 0.2 * client, (engine, client)
    assert png.stat().st_size > 10000
    args = on_node(sb.nodes[0], "docker", "inspect", "--format", "{{json .Args}}", f"{CONTAINER}-router").stdout
    assert '"--policy","round_robin"' in args.replace(" ", ""), args
    assert complete(endpoint_of(served.stdout), PROMPT, KEY)


def test_drain_takes_a_host_out_under_load_without_a_failed_request_until_undrain(fleet):
    """`drain HOST` under load: replica 1 (node3's) leaves the router, its engine reaches 0 running and
    waiting, no request fails, and while the load goes on it serves nothing more; `status` shows the host
    drained; draining the last replica in rotation is refused; `undrain` puts it back."""
    sb, inv, served = fleet
    host = sb.nodes[2].name
    with Load(endpoint_of(served.stdout), key=KEY, concurrency=3) as load:
        time.sleep(3)
        r = cli("drain", "-i", inv, host, "--timeout", "120", "--json", timeout=400)
        first = status(inv)["replicas"][1]
        time.sleep(6)  # the load goes on with the host drained
        second = status(inv)["replicas"][1]
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["done"] and doc["replica"] == 1 and "no request running or waiting" in doc["why"], doc
    assert load.samples and not load.failed(), load.failed()[:3]
    for rep in (first, second):
        assert rep["drained"] == [host] and rep["in_rotation"] is False and rep["health"] == "healthy", rep
        assert rep["running"] == 0 and rep["waiting"] == 0, rep
    assert second["succeeded"] == first["succeeded"], (first, second)  # nothing sent to it meanwhile
    st = status(inv)
    assert st["replicas"][1]["url"] not in st["router_workers"] and st["replicas"][0]["in_rotation"]
    text = cli("status", "-i", inv)
    assert f"(drained: {host})" in text.stdout, text.stdout
    last = cli("drain", "-i", inv, sb.nodes[0].name)
    assert last.returncode == 2 and "the only healthy one in the router's rotation" in last.stderr, last.stderr
    assert status(inv)["replicas"][0]["in_rotation"]  # the refusal changed nothing
    back = cli("undrain", "-i", inv, host, "--json")
    assert back.returncode == 0 and json.loads(back.stdout)["done"], back.stderr
    rep = status(inv)["replicas"][1]
    assert rep["drained"] == [] and rep["in_rotation"] is True, rep
    assert complete(endpoint_of(served.stdout), PROMPT, KEY)


def test_monitor_scrapes_every_target_counts_every_request_and_feeds_every_panel(fleet):
    """`monitor up` on the fleet: Prometheus and node exporters, every target up; vLLM's request
    counter in Prometheus grows by exactly the requests `bench` sent; every dashboard panel's
    query returns data (GPU panels excepted: no GPU here); `monitor down` leaves nothing."""
    from bootstrap.inventory import load_inventory
    from bootstrap.monitor import run as MON
    from bootstrap.remote.session import Session

    sb, inv, served = fleet
    r = cli("monitor", "up", "-i", inv, "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    up = json.loads(r.stdout)
    print(f"monitor up: {up['seconds']}s, all targets up after {up['all_up_after']}s")
    jobs = sorted((t["job"], t["host"]) for t in up["targets"])
    names = [n.name for n in sb.nodes]
    assert jobs == sorted([("vllm", "node1"), ("vllm", "node3"), ("vllm-router", "node1"),
                           *[("ray", n) for n in names], *[("node", n) for n in names]]), jobs
    assert all(t["health"] == "up" for t in up["targets"]) and up["all_up_after"] is not None
    assert cli("monitor", "status", "-i", inv).returncode == 0

    interval = 5  # cluster.monitor.scrape_interval's default
    with Session(load_inventory(inv, require_secrets=False)) as sess:
        def total():
            res = MON.query(sess, "sum(vllm:request_success_total)")
            return float(res[0]["value"][1]) if res else 0.0

        time.sleep(2 * interval)
        before = total()
        r = cli("bench", "-i", inv, "-n", "24", "--concurrency", "4", "--max-tokens", "8", "--json")
        assert r.returncode == 0 and json.loads(r.stdout)["ok"] == 24, r.stderr[-2000:]
        deadline = time.monotonic() + 6 * interval
        while total() < before + 24 and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(interval)  # one more scrape: nothing beyond the 24
        assert total() - before == 24

        doc = json.loads(DASHBOARD.read_text())
        empty = []
        for q in dashboard_queries(doc):
            values = [v["value"][1] for v in MON.query(sess, q.expr)]
            if q.gpu:
                assert values == [], (q.panel, values)  # no DCGM exporter off GPU: named, not faked
                continue
            if not [v for v in values if v not in ("NaN", "+Inf", "-Inf")]:
                empty.append((q.panel, q.expr))
        assert empty == [], empty

    # top reads Prometheus while it runs: the last minute's rates include the bench above
    rc, doc = top_once(inv)
    print(f"top from Prometheus: {json.dumps(doc)}")
    assert rc == 0 and doc["source"].startswith("http://") and doc["window_seconds"] == 60
    assert all(r["up"] for r in doc["replicas"]) and sum(r["req_s"] for r in doc["replicas"]) > 0
    assert all(n["up"] and n["cpu"] is not None and n["mem"] is not None for n in doc["nodes"])

    # The fence with the whole fleet and its monitor up: a stranger on the nodes' network reaches SSH
    # and the router (which wants the API key), nothing else; `status --exposure` agrees
    scan = stranger_scan(sb.nodes)
    router = (sb.nodes[0].ip, 30000)
    assert sorted(k for k, v in scan.items() if v == "open") == sorted([(n.ip, 22) for n in sb.nodes] + [router])
    assert all(v == "refused" for v in scan.values() if v != "open"), scan
    body = json.dumps({"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 4})
    assert stranger_post(sb.nodes, f"http://{router[0]}:{router[1]}/v1/completions", body) == 401
    rep = cli("status", "-i", inv, "--exposure", "--json")
    assert rep.returncode == 0, rep.stderr[-2000:]
    rows = json.loads(rep.stdout)["listeners"]
    assert {(x["host"], x["port"]) for x in rows if x["reach"] == "anyone"} == {
        *[(n.name, 22) for n in sb.nodes], (sb.nodes[0].name, 30000)}
    assert {x["port"] for x in rows if x["host"] == sb.nodes[0].name and x["reach"] == "members"} >= {9090, 9100, 8000}

    r = cli("monitor", "down", "-i", inv, "--purge")  # asks; no terminal here: refused before anything goes
    assert r.returncode == 2 and "No terminal to ask: pass --yes" in r.stderr, r.stderr[-2000:]
    vols = on_node(sb.nodes[0], "docker", "volume", "ls", "--format", "{{.Name}}").stdout.split()
    assert "bootstrap-vllm-prometheus-data" in vols  # nothing removed
    r = cli("monitor", "down", "-i", inv, "--purge", "--yes")
    assert r.returncode == 0, r.stderr[-2000:]
    for n in sb.nodes:
        left = on_node(n, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert not [c for c in left if "prometheus" in c or "exporter" in c], (n.name, left)
    vols = on_node(sb.nodes[0], "docker", "volume", "ls", "--format", "{{.Name}}").stdout.split()
    assert "bootstrap-vllm-prometheus-data" not in vols
    r = cli("monitor", "status", "-i", inv)
    assert r.returncode == 3 and "monitor up" in r.stderr, r.stderr


def test_a_rollout_vllm_refuses_is_rolled_back_and_the_fleet_keeps_serving(fleet):
    """Before the data parallel rollout below: rolling a TP x PP replica back is one group start
    (135 s in a CI run), a data parallel one's more (176-222 s)."""
    sb, inv, served = fleet
    old = status(inv)["replicas"]
    # an option the image's vLLM does not know is refused before any replica is touched
    r = cli("rollout", "-i", inv, "--", *FLAGS, "--no-such-vllm-flag")
    assert r.returncode == 2 and "--no-such-vllm-flag is not an option of vLLM" in r.stderr, r.stderr[-2000:]
    # a value vLLM takes as an option but refuses once it reads the model (the tiny model allows
    # 1024 positions): replica 0 fails to start and is rolled back
    with Load(endpoint_of(served.stdout), key=KEY, concurrency=2, pause=3) as load:
        r = cli("rollout", "-i", inv, "--timeout", "420", "--", *FLAGS, "--max-model-len", "4096", timeout=1500)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "replica 0 (node1, node2) did not serve" in err[0], r.stderr[-3000:]
    assert "rolled back" in err[0]
    assert "replica 1: old" in r.stderr
    assert load.failed() == [], [s.error for s in load.failed()]
    st = status(inv)
    assert [x["extra"] for x in st["replicas"]] == [x["extra"] for x in old]
    assert [x["health"] for x in st["replicas"]] == ["healthy", "healthy"]


def test_rollout_under_load_to_data_parallel_changes_every_replica_and_fails_no_request(fleet):
    """`rollout --dp 2` under load: each TP x PP replica becomes vLLM's data parallel (2 engines over
    its 2 nodes, behind its head's API server) with a new flag, one replica at a time behind the
    router, and no request fails. Afterwards each engine of each replica serves (the API server's
    per-engine counters in `status`). The tests after this one run on the data parallel replicas."""
    sb, inv, served = fleet
    new = [*FLAGS, "--max-num-seqs", "32"]
    # paced: 3 senders each waiting 3 s after an answer keep requests in flight at every step (about 200
    # over the rollout; at 1.5 s, 417 in one run, whose CPU the starting replicas wait for)
    with Load(endpoint_of(served.stdout), key=KEY, pause=3) as load:
        r = cli("rollout", "-i", inv, "--dp", "2", "--drain-timeout", "60", "--", *new, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"rollout: {len(load.samples)} requests during the rollout, {len(load.failed())} failed; "
          f"{r.stdout.strip()}")
    assert "(--dp 2)" in r.stdout, r.stdout
    assert len(load.samples) >= 20
    assert load.failed() == [], [s.error for s in load.failed()]
    st = status(inv)
    assert [r["extra"] for r in st["replicas"]] == [new, new]
    assert [r["dp"] for r in st["replicas"]] == [2, 2]
    assert [r["health"] for r in st["replicas"]] == ["healthy", "healthy"]
    assert all(r["in_rotation"] for r in st["replicas"])
    # each replica's head (node1, node3) runs a vLLM that finishes in-flight requests when stopped;
    # the other node of each runs its second engine headless
    for n, head in zip(sb.nodes, (True, False, True, False)):
        logs = on_node(n, "sh", "-c", f"docker logs {SERVE} 2>&1 | grep bootstrap-member").stdout
        assert ("--shutdown-timeout 25" in logs) == head, (n.name, logs)
        cmd = on_node(n, "docker", "exec", SERVE, "sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
                      check=False).stdout
        assert "--data-parallel-size 2" in cmd and ("--headless" in cmd) != head, (n.name, cmd[-2000:])
    r = cli("bench", "-i", inv, "-n", "24", "--concurrency", "4", "--max-tokens", "8", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] == 24, r.stderr[-2000:]
    engines = [x["engines"] for x in status(inv)["replicas"]]
    print(f"requests finished per engine, per replica: {engines}")
    assert all(e is not None and set(e) == {"0", "1"} and all(v >= 1 for v in e.values()) for e in engines), engines
    table = cli("status", "-i", inv)
    assert table.returncode == 0 and "engine 1:" in table.stdout, table.stdout[-3000:]


def test_a_killed_replica_is_contained_and_comes_back_without_a_command(fleet):
    """`docker kill` of replica 1's head (the API server and engine 0 of its data parallel pair, after
    the rollout above): requests sent after it all succeed (the router sends them to replica 0), and
    the keeper (its standby in the killed one's place) + the member supervisors bring the whole group
    back, both engines serving again."""
    sb, inv, served = fleet
    before = {r["replica"]: r["restarts"] for r in status(inv)["replicas"]}
    with Load(endpoint_of(served.stdout), key=KEY) as load:
        time.sleep(8)
        kill = on_node(sb.nodes[2], "docker", "kill", SERVE, check=False)
        # Docker 20.10 answers this when the killed processes are not gone 12 s after SIGKILL (seen once on
        # a loaded CI run, 2026-11-28: two DP engines' memory to free on two shared cores); the kill was
        # sent, and the keeper's "was Exited (137)" line below proves the container died of it
        assert kill.returncode == 0 or "did not receive an exit event" in kill.stderr, kill.stderr
        killed_at = time.time()  # once the kill is done: a request sent before it may have been on replica 1
        rc, doc = top_once(inv)  # the killed replica is a red row; the other serves on
        time.sleep(max(0.0, 20 - (time.time() - killed_at)))
    reps = {r["name"]: r for r in doc["replicas"]}
    print(f"top after the kill: {reps}")
    assert rc == 1 and reps["replica 0"]["up"] and not reps["replica 1"]["up"] and reps["replica 1"]["error"]
    lost = load.failed()
    after_kill = load.failed(after=killed_at)
    sent_after = [s for s in load.samples if s.started >= killed_at]
    print(f"kill: {len(load.samples)} requests, {len(lost)} failed (in flight at the kill), "
          f"{len(sent_after)} sent after it, {len(after_kill)} of those failed")
    assert len(sent_after) >= 10
    assert after_kill == [], [s.error for s in after_kill]
    took, st = wait_healthy(inv)
    print(f"kill: replica 1 back in rotation {took:.0f}s after the load stopped")
    # the whole group restarted (its worker fell with its head), replica 0 did not
    restarts = {r["replica"]: r["restarts"] for r in st["replicas"]}
    assert restarts[0] == before[0] and restarts[1] >= before[1] + 1, (before, restarts)
    assert [r["dp"] for r in st["replicas"]] == [2, 2]
    r = cli("bench", "-i", inv, "-n", "16", "--concurrency", "4", "--max-tokens", "8", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] == 16, r.stderr[-2000:]
    engines = status(inv)["replicas"][1]["engines"]  # counted since the restart: both engines are back
    assert engines is not None and set(engines) == {"0", "1"} and all(v >= 1 for v in engines.values()), engines
    keeper = on_node(sb.nodes[2], "docker", "logs", "bootstrap-vllm-keeper").stdout
    # the member's standby (cluster.standby, the default: vLLM imported, waiting) took the killed one's
    # place, and the killed one is the next standby
    assert f"{SERVE} was Exited (137) when it died: its standby took over" in keeper, keeper
    assert f"the dead {SERVE} is the next standby" in keeper, keeper
    assert st["replicas"][1]["standbys"] == {sb.nodes[2].name: "running", sb.nodes[3].name: "running"}, st
    # what a user reads afterwards: the keeper's line among the serve logs, and doctor's finding
    lg = cli("logs", "-i", inv, "--serve", "--since", "10m", sb.nodes[2].name)
    assert lg.returncode == 0, lg.stderr
    assert any(ln.split()[:2] == [sb.nodes[2].name, "keeper"] and f"{SERVE} was Exited (137)" in ln
               for ln in lg.stdout.splitlines()), lg.stdout[-3000:]
    assert any(ln.split()[:2] == [sb.nodes[2].name, "vllm"] for ln in lg.stdout.splitlines()), lg.stdout[-3000:]
    dr = cli("doctor", "-i", inv, "--json")
    found = {(f["id"], f["host"], f["source"]): f for f in json.loads(dr.stdout)["findings"]}
    print(f"doctor after the kill: {sorted(found)}")
    killed = found.get(("serve-container-exited", sb.nodes[2].name, "keeper"))
    assert killed and "137 is SIGKILL" in killed["fix"] and "OOMKilled" in killed["fix"], found
    assert not [k for k in found if k[0] == "serve-container-exited" and k[1] in (sb.nodes[0].name, sb.nodes[1].name)]
    assert not [k for k in found if k[0] == "ray-node-missing"], found  # each replica is its own Ray cluster


def test_down_leaves_nothing_of_the_fleet_on_any_node(fleet):
    """Last in this module: it tears the fleet down (the fixture's own `down` afterwards is a no-op).
    `bootstrap down` on the fleet (bootstrap.fleet.lifecycle.down_fleet) removes the keepers, the
    router, the serve containers and every replica's node containers, and leaves no container,
    volume, network or secret of ours on any node: nothing that was not there before the
    fleet came up, nothing named after the cluster's container_name or carrying its label."""
    sb, inv, served = fleet
    r = cli("down", "--yes", "-i", inv)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "removed the serve containers, the router and the keepers of 2 replicas", r.stdout
    torn = [h for ln in lines if ln.startswith("removed the container on ") for h in ln.split(": ", 1)[1].split(", ")]
    assert sorted(torn) == sorted(n.name for n in sb.nodes), r.stdout
    for n in sb.nodes:
        now, before = what_is_on(n), BEFORE[n.name]
        print(f"{n.name} after down: {now}")
        assert [c for c in now["containers"] if c.startswith(CONTAINER)] == [], (n.name, now)
        assert now["labelled"] == [], (n.name, now)
        assert set(now["containers"]) <= set(before["containers"]), (n.name, before, now)
        assert [v for v in now["volumes"] if v.startswith(CONTAINER)] == [], (n.name, now)
        assert set(now["volumes"]) <= set(before["volumes"]), (n.name, before, now)
        assert set(now["networks"]) <= set(before["networks"]), (n.name, before, now)
        assert now["secrets"] == [], (n.name, now)
    r = cli("down", "--yes", "-i", inv)  # a second run finds nothing to remove
    assert r.returncode == 0, r.stderr[-2000:]
    assert "removed the container on" not in r.stdout, r.stdout



def top_logprobs(endpoint, prompt, max_tokens=4):
    """Each generated token with the top 3 log-probabilities the engine gave at that position."""
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "skip_special_tokens": False, "logprobs": 3})
    with urllib.request.urlopen(urllib.request.Request(endpoint + "/completions", body.encode(),
                                                       {"Content-Type": "application/json"}), timeout=120) as resp:
        lp = json.loads(resp.read())["choices"][0]["logprobs"]
    return list(zip(lp["tokens"], lp["top_logprobs"]))


def test_a_one_node_prefill_and_a_two_node_decode_replica_serve_through_the_router_and_the_kv_cache_moves(
        fleet, tmp_path):
    """After the plain fleet is down, prefill/decode disaggregation with replicas of different sizes
    per role: every host pins its replica, node1 prefills with TP=1, node2 and node3 decode with TP=2
    across them (cluster.router.prefill: [0]); vLLM's NixlConnector moves the KV cache over the data
    network and maps the KV heads between the two TP sizes; vllm-router runs in PD mode. CPU nodes:
    the engines run eagerly with the connector, and the plan sets a 5 s KV lease and says why
    (docs/replicas.md).

    Before any member starts, `serve` checks the KV path itself (checks/kv_check.py: each decode node
    reads node1's buffer over NIXL): with node1's side channel port refused to node2 it stops in one
    line naming both and the cause; with the port open it prints each read's figures and transport.
    Correctness against the decode replica serving the same request whole: the first token's top
    log-probabilities agree (a KV cache read wrongly, for the wrong request or from freed blocks,
    moves them by far more than the float rounding between TP=1 and TP=2), and the greedy tokens are
    the same up to a near-tie of the model (the tiny random model has some: docs/replicas.md). The
    decode replica pulled the KV cache for every request and at most one pull failed (its own
    metrics, shown by `status`). One request through PD that never answers (vLLM-CPU's KV pull with
    no deadline, seen under load on CI) is asked again, with the replicas' logs in the report; a
    second one fails the test."""
    sb, _, _ = fleet
    n1, n2 = sb.nodes[:2]

    def mutate(doc):
        doc["hosts"] = doc["hosts"][:3]
        for i, h in enumerate(doc["hosts"]):
            h["replica"] = 0 if i == 0 else 1
        doc["cluster"]["replicas"] = 2
        doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2, "prefill": [0]}
        doc["cluster"]["secrets"] = [s for s in doc["cluster"].get("secrets", []) if s != "FLEET_KEY"]
        doc["cluster"]["env"].pop("VLLM_CPU_OMP_THREADS_BIND")  # the sandbox's own choice: here the plan makes it
    inv = write_inventory(sb.inventory, tmp_path / "pd.yaml", mutate)
    try:
        r = cli("up", "--yes", "-i", inv)
        assert r.returncode == 0, r.stderr[-3000:]
        r = cli("check-kv", "-i", inv)  # on its own, after up (the check serve runs too)
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
        assert r.stdout.splitlines()[-1] == "KV transfer check: PASS (2 pair(s))", r.stdout
        block = ["INPUT", "-p", "tcp", "--dport", "5600", "-s", n2.ip, "-j", "REJECT", "--reject-with", "tcp-reset"]
        on_node(n1, "iptables", "-I", *block)
        # a KV cache of 128 blocks (16k tokens): each decode worker registers the whole cache with NIXL before
        # its first forward, which took 83 s at vLLM-CPU's 1 GiB against 38 s at 256 blocks (docs/replicas.md)
        flags = [*FLAGS, "--num-gpu-blocks-override", "128"]
        try:
            t = time.monotonic()
            r = cli("serve", "-i", inv, MODEL, "--", *flags)
        finally:
            on_node(n1, "iptables", "-D", *block)
        print(f"serve with the KV port refused: exit {r.returncode} in {time.monotonic() - t:.0f}s")
        assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
        assert ("KV transfer check: node2 could not read KV from node1: exchange on the decode side: could not "
                f"reach the prefill side {n1.ip}:5600 in 20 s") in r.stderr, r.stderr[-2000:]
        ps = [on_node(n, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split() for n in sb.nodes[:3]]
        assert not [c for names in ps for c in names if c.startswith(SERVE)], ps  # no member was started
        r = cli("serve", "-i", inv, MODEL, "--", *flags)
        if r.returncode != 0:  # each replica's vLLM output into the report
            with contextlib.suppress(subprocess.TimeoutExpired):
                cli("logs", "-i", inv, "--serve", "--tail", "150", timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        out = r.stdout
        assert "replica 0 (prefill): node1 -> " in out and "  split: TP=1 PP=1" in out, out
        assert "replica 1 (decode): node2, node3 -> " in out and "  split: TP=2 PP=1" in out, out
        assert "(replicas 0 (prefill) TP=1 PP=1, 1 (decode) TP=2 PP=1, router" in out, out
        assert "--vllm-pd-disaggregation --prefill http://" in out, out
        assert '"kv_lease_duration":5' in out and "KV lease 5 s" in out, out
        # the sandbox's nodes have 2 CPUs: vLLM-CPU could keep none for NIXL, so the plan leaves the engines unbound
        assert ("2 CPUs, no more than vLLM-CPU keeps beside a disaggregated engine" in out
                and "VLLM_CPU_OMP_THREADS_BIND=nobind" in out), out
        kvs = [ln for ln in out.splitlines() if ln.startswith("kv-check: ")]
        print("\n".join(kvs))
        assert [ln.split(" read ")[0] for ln in kvs] == ["kv-check: node2 (decode)", "kv-check: node3 (decode)"], kvs
        for ln in kvs:
            assert " read 16 MiB of cpu memory from node1 (prefill) over NIXL via tcp/" in ln, ln
            assert float(ln.split(": ")[2].split(" GB/s")[0]) > 0, ln
        endpoint = endpoint_of(out)
        # the decode replica's own URL as serve printed it (a status call here took 14 s: NIXL's idle engines
        # keep the sandbox's cores busy, docs/replicas.md)
        decode = next(ln for ln in out.splitlines() if ln.startswith("replica 1 (decode): "))
        decode_url = decode.split(" -> ")[1].strip() + "/v1"
        compared, ties, hung = 0, 0, 0
        for i in range(4):
            prompt = f"{PROMPT} {i} jumps over the lazy dog and then"
            try:
                through = top_logprobs(endpoint, prompt)
            except OSError as exc:  # vLLM-CPU's KV pull that never ends (docs/replicas.md): seen under load on CI
                hung += 1
                print(f"prompt {i}: no answer through PD ({exc}); the replicas' vLLM output, then once more")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    cli("logs", "-i", inv, "--serve", "--tail", "150", timeout=120)
                assert hung == 1, "a second request through PD got no answer"
                through = top_logprobs(endpoint, prompt)
            alone = top_logprobs(decode_url, prompt)
            print(f"prompt {i}: through PD {through[0]}\n          decode alone {alone[0]}")
            first_pd, first_alone = through[0][1], alone[0][1]
            for tok, lp in first_alone.items():  # the same distribution over the first token
                if tok in first_pd:
                    assert abs(first_pd[tok] - lp) < 0.05, (i, through[0], alone[0])
            for (t_pd, _), (t_alone, lp) in zip(through, alone):
                if t_pd != t_alone:
                    top = sorted(lp.values(), reverse=True)
                    assert top[0] - top[1] < 0.02, (i, through, alone)  # only a near-tie may go either way
                    ties += 1
                    break
            else:
                compared += 1
        print(f"{compared} of 4 prompts token for token, {ties} parted at a near-tie, "
              f"{hung} answered only when asked again")
        assert compared >= 3
        # one request at a time: concurrent requests on the CPU decode can read blocks whose lease ended, or
        # never finish (2 of 4 at concurrency 2 on a CI run: docs/replicas.md, "vLLM-CPU's limits")
        b = cli("bench", "-i", inv, "-n", "2", "--concurrency", "1", "--max-tokens", "8", "--json")
        assert b.returncode == 0, b.stderr[-2000:]
        doc = json.loads(b.stdout)
        assert doc["ok"] == 2 and doc["spread"]["roles"] == {"0": "prefill", "1": "decode"}, doc
        lat = doc["spread"]["latency_ms"]
        print(f"per role, the engines' own means: {lat}; client TTFT p50 {(doc.get('ttft_ms') or {}).get('p50')} ms")
        assert lat["0"]["ttft_ms"] > 0 and lat["1"]["itl_ms"] > 0, lat
        st = status(inv)
        prefill, decode = st["replicas"]
        assert (prefill["role"], decode["role"]) == ("prefill", "decode"), st
        assert [x["health"] for x in st["replicas"]] == ["healthy", "healthy"], st
        print(f"KV pulls on the two-node decode replica: {decode['kv_transfers']} (failed {decode['kv_failed']})")
        # vLLM-CPU's decode pulls when the prefill's KV lease ends (docs/replicas.md, "vLLM-CPU's limits"), so a
        # pull can lose the race with the lease's release under load (seen once in 13 pulls on a loaded CI run)
        assert decode["kv_transfers"] >= 4 and decode["kv_failed"] <= 1, decode
        text = cli("status", "-i", inv).stdout
        assert "prefill/decode disaggregated" in text and "KV pulled (failed)" in text, text
    finally:
        d = cli("down", "--yes", "-i", inv)
    assert d.returncode == 0, d.stderr[-2000:]
