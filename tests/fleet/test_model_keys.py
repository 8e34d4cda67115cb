"""A pool's models with API keys of their own (models[].api_key): the inventory refuses a bad one in
one line, each host's serve set holds the key of the model it serves (and no other model's), the
router holds every model's for its probe, clients (`bench --model`) and the exposure report use the
model's."""
from __future__ import annotations

import json

import pytest

from bootstrap.cluster.guard import fence as FE
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from tests.fleet.test_fleet_pure import CPU_SPLIT
from tests.fleet.test_pool import pool_yaml
from tests.support.checks import load_check
from tests.support.fleet_inventories import TOKEN, check, error, line_of, load, write

MODELS = """
models:
  - name: chat
    replicas: 2
    adapters: [{name: chat-sql, source: /loras/sql}]
  - name: coder
    nodes: 2
    api_key: CODER_KEY
"""
ENV = {"HF_TOKEN": TOKEN, "POOL_KEY": "pool-secret-1", "CODER_KEY": "coder-secret-2"}
CLUSTER = "secrets: [HF_TOKEN, POOL_KEY, CODER_KEY]\nrouter: {api_key: POOL_KEY}"


def pool(tmp_path, cluster: str = CLUSTER, models: str = MODELS, env=None):
    return load(tmp_path, pool_yaml(models=models, cluster=cluster), ENV if env is None else env)


def test_each_hosts_serve_set_holds_only_the_key_of_the_model_it_serves(tmp_path):
    inv = pool(tmp_path)
    h0, h1, h2, h3 = inv.hosts  # chat on h0 and h1, coder on h2 and h3
    for h in (h0, h1):
        files = SS.files(inv, h)
        assert files["serve/VLLM_API_KEY"] == "pool-secret-1"
        assert "coder-secret-2" not in json.dumps({k: v for k, v in files.items() if not k.startswith("router/")})
    for h in (h2, h3):
        files = SS.files(inv, h)
        assert files["serve/VLLM_API_KEY"] == "coder-secret-2"
        assert "serve/CODER_KEY" not in files and "serve/POOL_KEY" not in files  # API keys go as VLLM_API_KEY only
        assert files["serve/HF_TOKEN"] == TOKEN and "node/VLLM_API_KEY" not in files
        assert "node/CODER_KEY" not in files
    # the router's set: the pool's key under vLLM's name, and every name's key for its probe
    files = SS.files(inv, h2)
    assert files["router/VLLM_API_KEY"] == "pool-secret-1"
    assert json.loads(files["router/" + SS.MODEL_KEYS_ENV]) == {
        "chat": "pool-secret-1", "chat-sql": "pool-secret-1", "coder": "coder-secret-2"}
    assert SS.kind_names(inv, "serve", h2) == ("HF_TOKEN", "VLLM_API_KEY")
    assert SS.role_of(inv, "CODER_KEY") == SS.API_KEY


def test_without_a_pool_key_only_the_model_with_its_own_asks_for_one(tmp_path):
    inv = pool(tmp_path, cluster="secrets: [HF_TOKEN, CODER_KEY]")
    h0, _, h2, _ = inv.hosts
    assert "serve/VLLM_API_KEY" not in SS.files(inv, h0)
    assert SS.files(inv, h2)["serve/VLLM_API_KEY"] == "coder-secret-2"
    assert SS.kind_names(inv, "serve", h0) == ("HF_TOKEN",)
    assert SS.kind_names(inv, "router") == (SS.MODEL_KEYS_ENV,)
    assert json.loads(SS.files(inv, h0)["router/" + SS.MODEL_KEYS_ENV]) == {"coder": "coder-secret-2"}
    # the exposure report: each replica's vLLM port by its own model; the router's only when every model asks
    assert not FE.api_key_on(inv, h0) and FE.api_key_on(inv, h2) and not FE.api_key_on(inv)
    inv = pool(tmp_path)
    assert FE.api_key_on(inv, h0) and FE.api_key_on(inv, h2) and FE.api_key_on(inv)


def test_the_serve_containers_of_each_model_export_their_key_and_the_router_every_models(tmp_path):
    inv = pool(tmp_path)
    plan = FP.plan_fleet(inv, FP.pool_specs(inv, inv.cluster.image), [CPU_SPLIT for _ in inv.replicas], nofile={})
    for r in plan.replicas:
        argv = r.members[0].create
        entry = argv[argv.index("--entrypoint") + 1:]
        names = entry[entry.index(SS.ENTRY) + 2:entry.index("--")]
        assert list(names) == ["HF_TOKEN", "VLLM_API_KEY"], names
        assert "coder-secret-2" not in " ".join(argv) and "pool-secret-1" not in " ".join(argv)
    argv = plan.routers[0].run
    entry = argv[argv.index("--entrypoint") + 1:]
    assert list(entry[entry.index(SS.ENTRY) + 2:entry.index("--")]) == ["VLLM_API_KEY", SS.MODEL_KEYS_ENV]
    assert "coder-secret-2" not in " ".join(argv)
    assert plan.api_key_env == "POOL_KEY"  # serve's curl hint names the first model's key


def test_bench_of_a_model_sends_that_models_key(tmp_path):
    inv = pool(tmp_path)
    assert FRT.api_key(inv, "coder") == "coder-secret-2"
    assert FRT.api_key(inv, "chat") == FRT.api_key(inv, "chat-sql") == FRT.api_key(inv) == "pool-secret-1"
    assert FRT.api_key(inv, "unknown") == "pool-secret-1"


@pytest.mark.parametrize("cluster,models,env,field,parts", [
    ("secrets: [HF_TOKEN]", MODELS, None, "models[1].api_key",
     ("that name is not listed in cluster.secrets (the value is not shown",)),
    ("secrets: [HF_TOKEN, CODER_KEY]\nrouter:\n  vip: {address: 192.0.2.100, secret: CODER_KEY}", MODELS,
     {**ENV, "CODER_KEY": "vrrp8chr"}, "models[1].api_key", ("one secret in two roles", "VRRP's password")),
    ("secrets: [HF_TOKEN]", MODELS.replace("CODER_KEY", "HF_TOKEN"), None, "models[1].api_key",
     ("one secret in two roles", "Hugging Face token")),
    ("secrets: [HF_TOKEN, CODER_KEY, OTHER]", MODELS, {**ENV, "OTHER": "coder-secret-2"}, "models[1].api_key",
     ("has the same value as OTHER", "values are never shown")),
    ("secrets: [HF_TOKEN]", MODELS.replace("CODER_KEY", "''"), None, "models[1].api_key", ("must not be empty",)),

])
def test_a_bad_model_key_is_refused_in_one_line(tmp_path, cluster, models, env, field, parts):
    text = pool_yaml(models=models, cluster=cluster)
    path = write(tmp_path, text)
    err = error(tmp_path, text, ENV if env is None else env)
    # a bad value is reported on its line; a secret the pool cannot take, on the model's
    where = "api_key: ''" if "api_key: ''" in text else "- name: coder"
    check(err, path, line_of(path, where), field, *parts)
    assert "coder-secret-2" not in str(err)


def test_the_routers_probe_sends_each_model_its_own_key(monkeypatch):
    probe = load_check("fleet_probe")
    monkeypatch.setenv("VLLM_API_KEY", "pool")
    monkeypatch.setenv("BOOTSTRAP_MODEL_KEYS", json.dumps({"chat": "pool", "coder": "coder-key"}))
    assert probe.model_keys("coder") == ["coder-key"]
    # an adapter loaded at runtime is in no map: every key the container holds, the pool's first
    assert probe.model_keys("chat-runtime") == ["pool", "coder-key"]
    monkeypatch.setenv("BOOTSTRAP_MODEL_KEYS", "not json")
    assert probe.model_keys("coder") == ["pool"]
    sent = []

    def http(method, url, body=None, timeout=5.0, key=None):
        sent.append(key)
        return (200, b'{"choices": [1]}') if key == "coder-key" else (401, b"")
    monkeypatch.setattr(probe, "http", http)
    monkeypatch.setenv("BOOTSTRAP_MODEL_KEYS", json.dumps({"chat": "pool", "coder": "coder-key"}))
    assert probe.complete("http://r", "coder-lora")[0] == 200 and sent == ["pool", "coder-key"]


def test_a_pool_router_started_without_the_keys_it_now_needs_is_started_over(tmp_path):
    from types import SimpleNamespace

    from bootstrap.fleet import converge as CV
    from bootstrap.fleet import names as FN

    def router_state(inv):
        plan = FP.plan_fleet(inv, FP.pool_specs(inv, inv.cluster.image), [CPU_SPLIT for _ in inv.replicas],
                             nofile={})
        run = plan.routers[0].run
        labels = dict(a.split("=", 1) for a in run[run.index("--label") + 1::2] if a.startswith("bootstrap."))
        return plan, SimpleNamespace(running=True, args=run[-len(run) + run.index(inv.cluster.image) + 1:],
                                     labels=labels)

    keyed = pool(tmp_path)
    plan, st = router_state(keyed)
    assert st.labels[FN.LABEL_SECRETS] == "VLLM_API_KEY," + SS.MODEL_KEYS_ENV
    assert CV.router_ready(keyed, plan, {"h0": st}) is None
    # the same pool served before with the pool's key only (a router of an earlier version: no label)
    plain = pool(tmp_path, models=MODELS.replace("    api_key: CODER_KEY\n", ""))
    _, old = router_state(plain)
    assert old.labels[FN.LABEL_SECRETS] == "VLLM_API_KEY"
    assert CV.router_ready(plain, router_state(plain)[0], {"h0": SimpleNamespace(
        running=True, args=old.args, labels={})}) is None
    assert CV.router_ready(keyed, plan, {"h0": SimpleNamespace(running=True, args=st.args, labels={})}) == (
        "the secrets the router on h0 holds changed (a model's own API key: models[].api_key)")
    assert CV.router_ready(keyed, plan, {"h0": old}) is not None
