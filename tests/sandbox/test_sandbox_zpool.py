"""Several models behind one endpoint on the sandbox: the inventory's models: on 4 nodes, two tiny
models of different architectures (a Llama as `chat` with 2 one-node replicas and a LoRA adapter of
it, `chat-lora`; a Qwen2 as `coder` with one two-node replica, TP=2), one vllm-router in its
multi-model mode routing by the request's model. One pool is shared by every test here; it runs
after the fleet module (4 nodes, the image already on every node).

What a user meets is real: sshd, Docker in each node, vLLM (CPU build) in each serve container,
vllm-router, `docker kill`.
"""
import json
import os
import re
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest
import yaml

from tests.support.fleet_load import Load, complete, wait_healthy
from tests.support.sandbox import cli, on_node, up_serve_down, write_inventory

pytestmark = pytest.mark.sandbox
FLAGS = ["--enforce-eager", "--max-model-len", "256"]
CHAT, CODER, LORA = "/opt/models/tiny-llama", "/opt/models/tiny-qwen", "/opt/models/tiny-llama-lora"
PROMPT = "The quick brown fox"
ROUTER, SERVE = "bootstrap-vllm-router", "bootstrap-vllm-serve"
#: each model's own API key (models[].api_key; chat has none): a secret of the environment, made per run
KEYS = {"coder": "coder-" + secrets.token_hex(8), "embed": "embed-" + secrets.token_hex(8)}
KEY_VARS = {"coder": "CODER_KEY", "embed": "EMBED_KEY"}


@pytest.fixture(scope="module")
def pool(_sandbox_session, tmp_path_factory):
    from bootstrap import sandbox as S
    from tests.support.sandbox import shared_sandbox

    sb = S.sandbox_up(4, log=lambda m: print(f"sandbox: {m}", flush=True), **shared_sandbox())
    saved = {v: os.environ.get(v) for v in KEY_VARS.values()}
    os.environ.update({KEY_VARS[m]: k for m, k in KEYS.items()})  # what the user's shell holds

    def mutate(doc):
        doc["cluster"]["runtime"] = "none"  # vLLM's native multi-node mode: no Ray to start per group
        doc["cluster"]["router"] = {"policy": "round_robin", "health_interval": 2}
        doc["cluster"]["secrets"] = ["CODER_KEY"]
        doc["models"] = [{"name": "chat", "source": CHAT, "replicas": 2, "args": FLAGS, "lora_rank": 8,
                          "adapters": [{"name": "chat-lora", "source": LORA}]},
                         {"name": "coder", "source": CODER, "nodes": 2, "args": FLAGS, "policy": "power_of_two",
                          "api_key": "CODER_KEY"}]
    inv = write_inventory(sb.inventory, tmp_path_factory.mktemp("pool") / "pool.yaml", mutate)
    try:
        for served in up_serve_down(sb, inv):
            yield sb, inv, served
    finally:
        for var, value in saved.items():
            os.environ.pop(var, None) if value is None else os.environ.__setitem__(var, value)


def endpoint_of(serve_out):
    line = next(ln for ln in serve_out.splitlines() if ln.startswith("serving "))
    return line.split(" on ", 1)[1].split(" ", 1)[0]


def post(url, body, timeout=120, key=None):
    """POST with the model's own key (KEYS), or `key` ("" sends none)."""
    key = KEYS.get(body.get("model")) if key is None else key
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json", **auth})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def client(endpoint, key="none"):
    """OpenAI's own Python client on the endpoint (it sends a key always: "none" opens what asks none)."""
    return openai.OpenAI(base_url=endpoint, api_key=key, max_retries=0, timeout=30)


def listed(endpoint, key=None):
    """The ids `models.list()` gives with KEY; None: with every key of the pool, merged."""
    ids = set()
    for k in [key] if key is not None else ["none", *KEYS.values()]:
        try:
            ids |= {m.id for m in client(endpoint, k).models.list().data}
        except openai.AuthenticationError:
            pass
    return sorted(ids)


def routed_names(sb) -> set[str]:
    """The names the router's workers file routes (what a restarted router adds)."""
    doc = json.loads(on_node(sb.nodes[0], "docker", "exec", ROUTER, "cat", "/opt/bootstrap/workers.json").stdout)
    return {w["model_id"] for w in doc}


def test_one_endpoint_routes_each_model_to_its_own_replicas(pool):
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    assert any(ln.startswith(f"serving chat, coder on {endpoint} ") for ln in served.stdout.splitlines())
    plan = json.loads(cli("plan", "-i", inv, "--json").stdout)
    placed = [(r["model"], [h["host"] for h in r["hosts"]]) for r in plan["replicas"]]
    assert placed == [("chat", ["node1"]), ("chat", ["node2"]), ("coder", ["node3", "node4"])]
    assert plan["models"] == ["chat", "coder"]
    # OpenAI's client lists each model and adapter with a healthy replica that its key opens (issue 67)
    assert listed(endpoint, "none") == ["chat", "chat-lora"]  # coder asks for its own key
    assert listed(endpoint, KEYS["coder"]) == ["chat", "chat-lora", "coder"]
    assert listed(endpoint, KEYS["embed"]) == ["chat", "chat-lora"]
    assert client(endpoint).models.retrieve("chat-lora").model_extra["parent"] == "chat"
    with pytest.raises(openai.NotFoundError):
        client(endpoint, KEYS["coder"]).models.retrieve("no-such-model")
    coder = client(endpoint, KEYS["coder"]).completions.create(model="coder", prompt=PROMPT, max_tokens=2)
    assert coder.model == "coder" and coder.choices[0].text, coder
    with pytest.raises(openai.AuthenticationError):
        client(endpoint).completions.create(model="coder", prompt=PROMPT, max_tokens=2)
    chat = client(endpoint).chat.completions.create(model="chat", max_tokens=4, messages=[
        {"role": "user", "content": PROMPT}], extra_body={"ignore_eos": True})
    assert chat.model == "chat" and chat.choices[0].message.role == "assistant", chat
    pieces = [c.choices[0].delta.content for c in client(endpoint).chat.completions.create(
        model="chat-lora", max_tokens=4, stream=True, messages=[{"role": "user", "content": PROMPT}],
        extra_body={"ignore_eos": True}) if c.choices]
    assert len(pieces) >= 4, pieces  # streamed through router and front, a chunk per token
    texts = {}
    urls = {m: [r["url"] for r in plan["replicas"] if r["model"] == m] for m in ("chat", "coder")}
    urls["chat-lora"] = urls["chat"]  # the adapter is served by its model's replicas
    for model, replicas in urls.items():
        key = KEYS.get(model)
        through = [complete(endpoint, PROMPT, key, model=model) for _ in range(4)]  # round robin: every replica
        direct = [complete(url + "/v1", PROMPT, key, model=model) for url in replicas]
        assert set(through) == set(direct) and len(set(direct)) == 1, (model, through, direct)
        texts[model] = direct[0]
        code, doc = post(endpoint + "/completions", {"model": model, "prompt": PROMPT, "max_tokens": 2})
        assert code == 200 and doc["model"] == model, doc
    assert len(set(texts.values())) == 3, texts  # two models and an adapter, not one behind three names
    # a model the pool does not serve reaches a vLLM that refuses it: 404, never another model's text
    # (with coder's key: a replica of coder refuses a request without it, 401, before it looks at the model)
    code, doc = post(endpoint + "/completions", {"model": "no-such-model", "prompt": PROMPT, "max_tokens": 2},
                     key=KEYS["coder"])
    assert code == 404 and "no-such-model" in json.dumps(doc), (code, doc)
    # coder asks for its own key (its replicas' vLLM checks it, through the router or not); chat for none
    body = {"model": "coder", "prompt": PROMPT, "max_tokens": 2}
    for url in (endpoint, urls["coder"][0] + "/v1"):
        assert post(url + "/completions", body, key="")[0] == 401
        assert post(url + "/completions", body, key=KEYS["embed"])[0] == 401
    assert post(endpoint + "/completions", {"model": "chat", "prompt": PROMPT, "max_tokens": 2}, key="")[0] == 200
    r = cli("bench", "-i", inv, "--model", "coder", "-n", "4", "--max-tokens", "4", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["failed"] == 0, (r.stdout[-1500:], r.stderr[-1500:])
    assert KEYS["coder"] not in r.stdout + r.stderr + served.stdout + served.stderr


def test_status_groups_the_replicas_by_model(pool):
    sb, inv, _ = pool
    r = cli("status", "-i", inv, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    models = {m["model"]: m for m in json.loads(r.stdout)["models"]}
    assert models["chat"]["replicas"] == [0, 1] and models["chat"]["source"] == CHAT
    assert models["coder"]["replicas"] == [2] and models["coder"]["source"] == CODER
    assert all(m["healthy"] == m["in_router"] == len(m["replicas"]) for m in models.values()), models
    assert models["chat"]["adapters"] == {"chat-lora": 2} and models["coder"]["adapters"] == {}, models
    text = cli("status", "-i", inv).stdout
    assert ("model chat (/opt/models/tiny-llama): replicas 0, 1; 2/2 healthy, 2/2 in the router; "
            "adapter chat-lora on 2/2; KV cache ") in text, text
    # each model's KV cache as its fullest replica's own gauge says (vllm:kv_cache_usage_perc)
    assert all(0 <= m["kv_cache_usage"] <= 1 for m in models.values()), models


def test_a_killed_replica_of_one_model_leaves_the_other_models_requests_whole(pool):
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    with Load(endpoint, concurrency=2, model="coder", pause=0.2, key=KEYS["coder"]) as coder, \
            Load(endpoint, concurrency=1, model="chat", pause=0.2) as chat:
        time.sleep(5)
        killed = time.time()
        on_node(sb.nodes[0], "docker", "kill", SERVE)
        time.sleep(20)
        # a dead worker of chat (the router has marked it by now) leaves the list whole: chat has another
        assert listed(endpoint) == ["chat", "chat-lora", "coder"]
    assert coder.samples and not coder.failed(), coder.failed()[:3]
    late = [s for s in chat.samples if s.started >= killed + 10]
    assert late and all(s.ok for s in late), [s for s in late if not s.ok][:3]  # chat's other replica serves
    wait_healthy(inv, deadline=300)  # the keeper puts the standby (or a fresh container) in its place


def test_an_adapter_is_added_and_removed_at_runtime_without_a_restart_or_a_failed_request(pool):
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    started = {n.name: on_node(n, "docker", "inspect", "--format", "{{.State.StartedAt}}", SERVE).stdout
               for n in sb.nodes[:2]}
    lora_text = complete(endpoint, PROMPT, model="chat-lora")
    with Load(endpoint, concurrency=2, model="chat", pause=0.2) as chat:
        r = cli("adapter", "add", "-i", inv, "chat", "chat-sql", LORA)
        assert r.returncode == 0, r.stderr[-2000:]
        assert "chat-sql loaded on every replica of chat; routed by node1" in r.stdout, r.stdout
        assert complete(endpoint, PROMPT, model="chat-sql") == lora_text  # the same weights, another name
        assert listed(endpoint) == ["chat", "chat-lora", "chat-sql", "coder"]  # OpenAI's client sees it
        assert "chat-sql" in routed_names(sb)  # a router restarted later routes it too
        shown = json.loads(cli("adapter", "list", "-i", inv, "chat", "--json").stdout)
        assert [sorted(a["name"] for a in r["adapters"]) for r in shown["replicas"]] == [["chat-lora", "chat-sql"]] * 2
        r = cli("adapter", "remove", "-i", inv, "chat", "chat-sql")
        assert r.returncode == 0, r.stderr[-2000:]
        code, doc = post(endpoint + "/completions", {"model": "chat-sql", "prompt": PROMPT, "max_tokens": 2},
                         key=KEYS["coder"])  # a name no replica serves may reach coder's, which asks for its key
        assert code == 404, (code, doc)
        assert wait_models(endpoint, ["chat", "chat-lora", "coder"], 30) == ["chat", "chat-lora", "coder"]
        assert routed_names(sb) == {"chat", "chat-lora", "coder"}
        assert complete(endpoint, PROMPT, model="chat-lora") == lora_text  # the inventory's adapter stays
    assert chat.samples and not chat.failed(), chat.failed()[:3]
    assert {n.name: on_node(n, "docker", "inspect", "--format", "{{.State.StartedAt}}", SERVE).stdout
            for n in sb.nodes[:2]} == started  # no replica restarted
    r = cli("adapter", "remove", "-i", inv, "chat", "chat-lora")
    assert r.returncode == 2 and "is in " in r.stderr and "adapters" in r.stderr, r.stderr


def test_a_router_killed_behind_bootstraps_back_comes_back_with_every_models_workers(pool):
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    on_node(sb.nodes[0], "docker", "kill", ROUTER)
    # the keeper starts it again; its entry adds the workers
    assert wait_models(endpoint, ["chat", "chat-lora", "coder"]) == ["chat", "chat-lora", "coder"]
    for model in ("chat", "chat-lora", "coder"):
        code, doc = post(endpoint + "/completions", {"model": model, "prompt": PROMPT, "max_tokens": 2})
        assert code == 200 and doc["model"] == model, (model, code, doc)
    workers = on_node(sb.nodes[0], "docker", "logs", ROUTER, check=False)
    added = [ln for ln in (workers.stdout + workers.stderr).splitlines() if ln.startswith("router_entry: added")]
    assert len(added) == 10, added  # 5 (3 replicas, chat's 2 also as chat-lora) at serve, 5 after the restart


def test_a_rollout_of_one_model_changes_only_its_replicas_and_no_request_fails(pool):
    """The user edits one model's flags in models: and rolls that model out: its replicas change one at
    a time behind the router; the other model's replicas are not touched and lose no request."""
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    r = cli("serve", "-i", inv, CHAT)
    assert r.returncode == 2 and "serves its models: (chat, coder): run serve with no MODEL" in r.stderr, r.stderr
    r = cli("rollout", "-i", inv)
    assert r.returncode == 2 and "name the one to roll out with --model" in r.stderr, r.stderr
    coder_started = {n.name: on_node(n, "docker", "inspect", "--format", "{{.State.StartedAt}}", SERVE).stdout
                     for n in sb.nodes[2:]}
    doc = yaml.safe_load(Path(inv).read_text())
    doc["models"][0]["args"] = [*FLAGS, "--max-num-seqs", "8"]
    Path(inv).write_text(yaml.safe_dump(doc))
    # paced (as the fleet's rollout test): requests in flight through every step, while the two cores
    # stay free enough for the new replicas to start (closed-loop load here took 355 s instead of ~90 s)
    with Load(endpoint, concurrency=2, model="coder", pause=2, key=KEYS["coder"]) as coder, \
            Load(endpoint, concurrency=1, model="chat", pause=2) as chat:
        r = cli("rollout", "-i", inv, "--model", "chat")
    assert r.returncode == 0, r.stderr[-3000:]
    assert coder.samples and not coder.failed(), coder.failed()[:3]
    assert chat.samples and not chat.failed(), chat.failed()[:3]
    fleet = json.loads(cli("status", "-i", inv, "--json").stdout)["fleet"]
    extra = {r["replica"]: r["extra"] for r in fleet["replicas"]}
    assert all("--max-num-seqs" in extra[k] for k in (0, 1)) and "--max-num-seqs" not in extra[2], extra
    assert {n.name: on_node(n, "docker", "inspect", "--format", "{{.State.StartedAt}}", SERVE).stdout
            for n in sb.nodes[2:]} == coder_started  # coder's replica was not touched
    code, doc = post(endpoint + "/completions", {"model": "chat-lora", "prompt": PROMPT, "max_tokens": 2})
    assert code == 200 and doc["model"] == "chat-lora", (code, doc)  # the adapter is routed again


def test_serve_stop_of_one_model_leaves_the_others_serving_and_serve_starts_it_again(pool):
    """`serve --stop --model coder` under load on chat: coder's replica leaves the router (and its
    workers file), drains and stops; chat loses no request and its replicas are not touched; `serve`
    with no MODEL then starts coder again, and only coder."""
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    chat_started = started_at(sb.nodes[:2])
    with Load(endpoint, concurrency=1, model="chat", pause=0.5) as chat:
        r = cli("serve", "-i", inv, "--stop", "--model", "coder", "--yes", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout) == {"stopped": True, "model": "coder", "replicas": [2], "hosts": ["node3", "node4"]}
    assert chat.samples and not chat.failed(), chat.failed()[:3]
    assert started_at(sb.nodes[:2]) == chat_started
    for n in sb.nodes[2:]:
        names = on_node(n, "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert SERVE not in names, (n.name, names)
    assert wait_models(endpoint, ["chat", "chat-lora"], 30) == ["chat", "chat-lora"]
    assert routed_names(sb) == {"chat", "chat-lora"}  # a router restarted now would not add it back
    models = {m["model"]: m for m in json.loads(cli("status", "-i", inv, "--json").stdout)["models"]}
    assert models["coder"]["healthy"] == 0 and models["chat"]["healthy"] == 2, models
    r = cli("serve", "-i", inv, "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    changes = [ln.split(":", 2)[1].split() for ln in r.stdout.splitlines() if ln.startswith("change: ")]
    assert changes == [["keep", "chat"], ["keep", "chat"], ["start", "coder"]], r.stdout
    assert started_at(sb.nodes[:2]) == chat_started
    code, body = post(endpoint + "/completions", {"model": "coder", "prompt": PROMPT, "max_tokens": 2})
    assert code == 200 and body["model"] == "coder", (code, body)


def test_a_models_policy_changed_alone_changes_in_the_router_in_place(pool):
    """coder's policy edited in models: and `serve` again, under load on coder: the router takes the new
    policy in place (coder's workers out, the last one out and back in one write); no replica restarts.
    A coder request may meet the window (about a millisecond) in which vllm-router 0.1.17 has no worker
    of coder and sends it to a chat replica: at most one such, refused 404 by chat's vLLM, and serve
    says so (perf/router_repolicy.py measured 1 in 2,700 at 4 clients; docs/models.md)."""
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    before = started_at(sb.nodes)
    doc = yaml.safe_load(Path(inv).read_text())
    doc["models"][1]["policy"] = "round_robin"
    Path(inv).write_text(yaml.safe_dump(doc))
    with Load(endpoint, concurrency=2, model="coder", pause=0.05, key=KEYS["coder"]) as coder:
        time.sleep(2)
        r = cli("serve", "-i", inv, "--yes")
        time.sleep(2)
    assert r.returncode == 0, r.stderr[-3000:]
    changes = [ln.split(":", 2)[1].split() for ln in r.stdout.splitlines() if ln.startswith("change: ")]
    assert changes == [["keep", "chat"], ["keep", "chat"], ["policy", "coder"]], r.stdout
    assert "router policy power_of_two -> round_robin, in place" in r.stdout, r.stdout
    assert "with no worker of coder in the router: a request of it in that moment may have been refused 404" \
        in r.stdout + r.stderr, r.stderr[-3000:]
    failed = coder.failed()
    assert coder.samples and len(failed) <= 1, failed[:3]
    assert all("HTTP 404" in f.error and "does not exist" in f.error for f in failed), failed
    assert started_at(sb.nodes) == before  # nothing restarted
    logs = on_node(sb.nodes[0], "docker", "logs", ROUTER, check=False)
    text = re.sub(r"\x1b\[[0-9;]*m", "", logs.stdout + logs.stderr)
    assert "Assigning policy round_robin to new model coder" in text, text[-2000:]
    r = cli("serve", "-i", inv)  # the routers hold it now: nothing to change
    assert r.returncode == 0 and "nothing changed" in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


def started_at(nodes):
    return {n.name: on_node(n, "docker", "inspect", "--format", "{{.State.StartedAt}}", SERVE).stdout for n in nodes}


def wait_models(endpoint, want, deadline=120):
    """What OpenAI's client lists (every key's, merged) once it is WANT, or at the deadline."""
    models = None
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline:
        try:
            models = listed(endpoint)
            if models == want:
                break
        except openai.APIError:
            pass
        time.sleep(1)
    return models


def test_serve_converges_the_pool_to_an_edited_models_section_and_leaves_the_rest_serving(pool):
    """`serve -i INV` on a pool that serves: unchanged, it touches nothing; after the user reshapes the
    coder (one node instead of two) and adds a model on the freed host (a pooling model, `embed`, whose
    embeddings OpenAI's client gets through the same endpoint), it says what changes, asks (no
    terminal here: --yes), replaces only those replicas while the chat model's requests all succeed, and
    a router restarted afterwards adds the new model's worker again (its workers file was rewritten)."""
    sb, inv, served = pool
    endpoint = endpoint_of(served.stdout)
    before = started_at(sb.nodes)
    r = cli("serve", "-i", inv)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("change: ")]
    assert [(ln.split(" (")[0], ln.split(") ")[1]) for ln in lines] == [
        (f"change: keep     {m}: replica {k}", f"on {n}: unchanged")
        for k, (m, n) in enumerate([("chat", "node1"), ("chat", "node2"), ("coder", "node3, node4")])], r.stdout
    assert "nothing changed; kept 3 replicas as they were" in r.stdout, r.stdout
    assert started_at(sb.nodes) == before  # nothing restarted
    doc = yaml.safe_load(Path(inv).read_text())
    doc["models"][1].pop("nodes")
    # a pooling model (vLLM's --runner pooling: embeddings, no completions) with a key of its own
    doc["models"].append({"name": "embed", "source": CODER, "args": [*FLAGS, "--runner", "pooling"],
                          "api_key": "EMBED_KEY"})
    doc["cluster"]["secrets"].append("EMBED_KEY")  # a model's own key: the other models' replicas are kept
    Path(inv).write_text(yaml.safe_dump(doc))
    r = cli("serve", "-i", inv)
    assert r.returncode == 2 and "No terminal to ask: pass --yes" in r.stderr, r.stderr
    assert started_at(sb.nodes) == before  # refused: nothing changed
    with Load(endpoint, concurrency=1, model="chat", pause=1) as chat:
        r = cli("serve", "-i", inv, "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    changes = [ln.split(":", 2)[1].split() for ln in r.stdout.splitlines() if ln.startswith("change: ")]
    assert changes == [["keep", "chat"], ["keep", "chat"], ["replace", "coder"], ["replace", "embed"]], r.stdout
    assert chat.samples and not chat.failed(), chat.failed()[:3]
    after = started_at(sb.nodes)
    assert [after[n] == before[n] for n in ("node1", "node2", "node3", "node4")] == [True, True, False, False]
    assert wait_models(endpoint, ["chat", "chat-lora", "coder", "embed"], 30) == [
        "chat", "chat-lora", "coder", "embed"]
    for model in ("coder", "chat-lora"):
        code, body = post(endpoint + "/completions", {"model": model, "prompt": PROMPT, "max_tokens": 2})
        assert code == 200 and body["model"] == model, (model, code, body)
    # the pooling model's embeddings through the same endpoint, with OpenAI's client and embed's own key
    vectors = client(endpoint, KEYS["embed"]).embeddings.create(model="embed", input=[PROMPT, "def fib(n):"])
    assert vectors.model == "embed" and len(vectors.data) == 2 and len(vectors.data[0].embedding) > 8, vectors
    with pytest.raises(openai.AuthenticationError):
        client(endpoint, KEYS["coder"]).embeddings.create(model="embed", input=PROMPT)
    on_node(sb.nodes[0], "docker", "kill", ROUTER)  # back by its restart policy or the keeper: from its file
    assert wait_models(endpoint, ["chat", "chat-lora", "coder", "embed"]) == [
        "chat", "chat-lora", "coder", "embed"]
    # embed removed from models: (node4 stays in the pool, idle): only it is drained and stopped
    kept = started_at(sb.nodes[:3])
    doc["models"].pop()
    Path(inv).write_text(yaml.safe_dump(doc))
    with Load(endpoint, concurrency=1, model="coder", pause=1, key=KEYS["coder"]) as coder:
        r = cli("serve", "-i", inv, "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    changes = [ln.split(":", 2)[1].split() for ln in r.stdout.splitlines() if ln.startswith("change: ")]
    assert changes == [["keep", "chat"], ["keep", "chat"], ["keep", "coder"], ["remove", "embed"],
                       ["stop", "embed"]], r.stdout
    assert coder.samples and not coder.failed(), coder.failed()[:3]
    assert started_at(sb.nodes[:3]) == kept
    gone = on_node(sb.nodes[3], "docker", "ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert SERVE not in gone, gone
    assert wait_models(endpoint, ["chat", "chat-lora", "coder"], 30) == ["chat", "chat-lora", "coder"]
