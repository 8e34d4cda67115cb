"""serve --dry-run --offline (issue 67): the plan from the inventory and a config.json on this machine,
with no host contacted (no SSH session is ever made), and the same refusals as serve on the hosts."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bootstrap.cli import main
from bootstrap.remote import session as S
from tests.support.checks import ROOT

EXAMPLE = str(ROOT / "inventory" / "example.yaml")  # 2 nodes x 8 GPUs, documentation addresses
FLEET = str(ROOT / "inventory" / "fleet.yaml")
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 64,
         "num_key_value_heads": 8, "num_hidden_layers": 80, "hidden_size": 8192, "vocab_size": 128256}


@pytest.fixture
def no_hosts(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("an SSH session was made")
    monkeypatch.setattr(S.Session, "__init__", refuse)
    monkeypatch.delenv("HF_TOKEN", raising=False)


def config(tmp_path, **changes):
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return str(tmp_path)


def serve(*args):
    return CliRunner().invoke(main, ["serve", "-i", EXAMPLE, "org/llama-70b", "--dry-run", "--offline", *args])


def test_the_plan_comes_from_the_inventory_and_a_local_config_without_any_host(tmp_path, no_hosts):
    r = serve("--model-config", config(tmp_path))
    assert r.exit_code == 0, r.output
    assert "split:   TP=8 PP=2: TP = GPUs per node, PP = nodes" in r.output, r.output
    assert "--tensor-parallel-size 8 --pipeline-parallel-size 2" in r.output and "--node-rank 1" in r.output
    assert "64 attention heads, 8 KV heads, 80 layers; config.json from " in r.output
    assert "planned offline: no host was contacted" in r.output and "nothing was started" in r.output
    r = serve("--json", "--model-config", str(tmp_path / "config.json"))
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert (doc["dry_run"], doc["tp"], doc["pp"]) == (True, 8, 2) and "no host was contacted" in doc["notes"][0], doc


def test_a_split_the_model_refuses_is_refused_offline_as_on_the_hosts(tmp_path, no_hosts):
    r = serve("--tp", "16", "--model-config", config(tmp_path, num_attention_heads=40))
    assert r.exit_code == 2, r.output
    assert "40 attention heads do not divide by TP=16; this cluster can serve it with TP=8 PP=2" in r.output
    r = serve("--model-config", config(tmp_path), "--", "--tensor-parallel-size", "4")
    assert r.exit_code == 2 and "is set by the serve plan" in r.output, r.output


def test_without_a_config_it_plans_and_says_the_split_is_not_checked(no_hosts):
    r = serve()
    assert r.exit_code == 0, r.output
    assert "no config.json here (org/llama-70b): the split is not checked against the model" in r.output


@pytest.mark.parametrize("args, words", [
    (["serve", "-i", EXAMPLE, "org/m", "--offline"], "--offline plans without the hosts: it goes with --dry-run"),
    (["serve", "-i", EXAMPLE, "org/m", "--model-config", "/x"], "--model-config goes with --dry-run --offline"),
    (["serve", "-i", EXAMPLE, "org/m", "--dry-run", "--offline", "--model-config", "/nonexistent"],
     "--model-config: /nonexistent: no config.json there"),
    (["serve", "-i", FLEET, "org/m", "--dry-run", "--offline"], "--offline: plans one cluster's serve"),
])
def test_what_offline_refuses_is_one_line(args, words, no_hosts, monkeypatch):
    monkeypatch.setenv("FLEET_KEY", "x")
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and words in r.output, r.output
