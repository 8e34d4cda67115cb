"""`validate` as a linter (issue 51.4): every mistake of the file at once, one line each in the order of
the file; `--json` for a CI job; `--offline` checks the file alone, so the examples pass out of the box."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "inventory").glob("*.yaml"))

BAD = """\
cluster:
  image: vllm/vllm-openai:v0.32.0
  gpus_per_nod: 8
  ports: {vllm: 99999}
  shm_size: lots
hosts:
  - {name: a, address: 192.0.2.1, ip: 198.51.100.300}
  - {name: b, address: 192.0.2.2, gpus: many}
"""


def validate(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "FLEET_KEY", "BOOTSTRAP_INVENTORY")}
    return subprocess.run([sys.executable, "-m", "bootstrap", "validate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**environ, **(env or {})})


def test_every_mistake_is_listed_at_once_in_the_order_of_the_file(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text(BAD)
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == [
        f"error: {p}:3: cluster: unknown key 'gpus_per_nod' (did you mean 'gpus_per_node'?)",
        f"error: {p}:4: cluster.ports.vllm: must be between 1 and 65535, got 99999",
        f"error: {p}:5: cluster.shm_size: 'lots' is not a size: expected e.g. '10.24g', '512m' or 1073741824",
        f"error: {p}:7: hosts[0].ip: '198.51.100.300' is not an IPv4 or IPv6 address",
        f"error: {p}:8: hosts[1].gpus: expected an integer, got string 'many'",
    ]


def test_json_is_one_document_a_ci_job_can_read(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text(BAD)
    r = validate("--offline", "--json", "-i", str(p))
    assert r.returncode == 2, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["checked"] == {"key_files": False, "secrets": False}
    assert [(e["line"], e["field"]) for e in doc["errors"]] == [
        (3, "cluster"), (4, "cluster.ports.vllm"), (5, "cluster.shm_size"), (7, "hosts[0].ip"), (8, "hosts[1].gpus")]
    assert all(e["text"].startswith(f"{p}:{e['line']}: ") for e in doc["errors"])


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_offline_every_example_passes_out_of_the_box(example):
    """No HF_TOKEN, no FLEET_KEY, no ~/.ssh key: the file alone is checked, and it is right."""
    r = validate("--offline", "-i", str(example))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{example}: ok: ") and "offline: the key files and the secrets' values not checked" \
        in r.stdout
    doc = json.loads(validate("--offline", "--json", "-i", str(example)).stdout)
    assert doc["ok"] is True and doc["errors"] == [] and doc["hosts"] >= 2


def test_without_offline_what_up_needs_on_this_machine_is_checked_too(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text("cluster: {ssh: {key: /nonexistent/id_ed25519}}\nhosts: [{name: a, address: 192.0.2.1, gpus: 8}]\n")
    r = validate("-i", str(p))
    assert r.returncode == 2 and "cluster.ssh.key: /nonexistent/id_ed25519: no such file" in r.stderr, r.stderr
    q = tmp_path / "secret.yaml"
    q.write_text("cluster: {secrets: [HF_TOKEN]}\nhosts: [{name: a, address: 192.0.2.1, gpus: 8}]\n")
    r = validate("-i", str(q))
    assert r.returncode == 2 and "cluster.secrets: HF_TOKEN is not set in your environment" in r.stderr, r.stderr
    assert validate("--offline", "-i", str(p)).returncode == 0 and validate("--offline", "-i", str(q)).returncode == 0


def test_every_kind_of_mistake_at_once_unset_secrets_and_missing_key_files_hide_nothing(tmp_path):
    """Issue 67: two secrets unset, two key files missing and a field error in one file: validate lists all
    five in one run (before, the first unset secret was the only line, and the others came one per run)."""
    p = tmp_path / "hosts.yaml"
    p.write_text("cluster:\n  accelerator: none\n  secrets: [HF_TOKEN, OTHER_TOKEN]\n  ssh: {key: /nonexistent/k1}\n"
                 "hosts:\n  - {name: a, address: 192.0.2.1, key: /nonexistent/k2}\n"
                 "  - {name: b, address: 192.0.2.2, gpus: -1}\n")
    r = validate("-i", str(p))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == [
        f"error: {p}:3: cluster.secrets: HF_TOKEN is not set in your environment",
        f"error: {p}:3: cluster.secrets: OTHER_TOKEN is not set in your environment",
        f"error: {p}:4: cluster.ssh.key: /nonexistent/k1: no such file",
        f"error: {p}:6: hosts[0].key: /nonexistent/k2: no such file",
        f"error: {p}:7: hosts[1].gpus: must be between 0 and 64, got -1",
    ], r.stderr
    r = validate("-i", str(p), env={"HF_TOKEN": "hf_x", "OTHER_TOKEN": "y"})  # set: only the rest remains
    assert [ln.split(": ")[2] for ln in r.stderr.splitlines()] == ["cluster.ssh.key", "hosts[0].key", "hosts[1].gpus"]


def test_a_yaml_syntax_error_is_still_one_line(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text("hosts:\n  - {name: a, address: 192.0.2.1\n")
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith(f"error: {p}:"), r.stderr


def test_other_commands_still_stop_at_the_first_mistake(tmp_path):
    p = tmp_path / "hosts.yaml"
    p.write_text(BAD)
    r = subprocess.run([sys.executable, "-m", "bootstrap", "plan", "-i", str(p)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.splitlines() == [
        f"error: {p}:3: cluster: unknown key 'gpus_per_nod' (did you mean 'gpus_per_node'?)"], r.stderr


POOL_MISTAKES = """\
cluster: {accelerator: none, secrets: [HF_TOKEN]}
models:
  - name: bad name!
    adapters:
      - {name: sql!, source: /loras/sql}
  - name: coder
    args: [--max-model-len, '4096', --port, '9000']
  - name: other
    args: [--max-lora-rank, '64']
hosts:
  - {name: a, address: 192.0.2.1}
  - {name: b, address: 192.0.2.2}
  - {name: c, address: 192.0.2.3}
"""


def test_a_pools_mistakes_are_listed_once_each_with_no_false_missing_name(tmp_path):
    """Issue 68.4: a model or adapter whose name is refused is not also said to have none (c7795f8 added
    "name is missing"); a file whose fields pass has its models' args judged as serve judges them, at the line
    of each args: (the plan's own flags, LoRA's included), by validate and by every command before any contact."""
    p = tmp_path / "pool.yaml"
    p.write_text(POOL_MISTAKES)
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    lines = r.stderr.splitlines()
    assert [ln.split(": ")[2] for ln in lines] == ["models[0].name", "models[0].adapters[0].name"], lines
    assert not any("is missing" in ln for ln in lines), lines
    p.write_text(POOL_MISTAKES.replace("bad name!", "chat").replace("sql!", "sql"))
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == [
        f"error: {p}:7: models[1].args: --port is set by the serve plan; do not pass it as an extra vllm argument "
        "(use cluster.ports.vllm in the inventory)",
        f"error: {p}:9: models[2].args: --max-lora-rank is set by the serve plan; do not pass it as an extra vllm "
        "argument (use adapters: and lora_rank: on the model, from which the plan sets vLLM's LoRA flags)"]
    for command in (["plan"], ["serve", "--dry-run"], ["rollout", "--model", "coder"], ["adapter", "list", "chat"]):
        r = subprocess.run([sys.executable, "-m", "bootstrap", *command, "-i", str(p)], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, env={**os.environ, "HF_TOKEN": "hf_x"})
        assert r.returncode == 2 and r.stderr.startswith(f"error: {p}:7: models[1].args: --port is set"), (
            command, r.stderr)


def test_a_key_in_a_models_args_is_refused_without_being_shown(tmp_path):
    p = tmp_path / "pool.yaml"
    key = "Zq8vN3mK9pL2xR7tY4wB6cD1"
    p.write_text(POOL_MISTAKES.replace("bad name!", "chat").replace("sql!", "sql")
                 .replace("--port, '9000'", f"--api-key, {key}").replace("--max-lora-rank, '64'", "--enforce-eager"))
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 2 and key not in r.stderr, r.stderr
    assert r.stderr.startswith(f"error: {p}:7: models[1].args: --api-key would put a credential"), r.stderr


def test_a_pool_model_without_source_whose_name_is_no_model_id_gets_a_note(tmp_path):
    """Issue 67: `- name: chat` with no source loads `chat` as a Hugging Face id (a late download failure);
    validate passes it (a bare id like gpt2 is a model) with one note naming the line and the fix; a model
    with source:, or named org/name, gets none; --json carries the notes."""
    p = tmp_path / "pool.yaml"
    p.write_text("cluster: {accelerator: none}\nmodels:\n  - name: chat\n  - {name: small, source: gpt2}\n"
                 "  - name: org/model\nhosts:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
                 "  - {name: c, address: 192.0.2.3}\n")
    r = validate("--offline", "-i", str(p))
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stdout.splitlines() if ln.startswith("note: ")]
    assert notes == [f"note: {p}:3: models[0]: no source: vLLM loads 'chat' itself as the model (a Hugging Face id); "
                     "if it is only the name clients send, say what to load with source: (org/name or /path)"], r.stdout
    doc = json.loads(validate("--offline", "--json", "-i", str(p)).stdout)
    assert doc["ok"] is True and [n.split(": ")[1] for n in doc["notes"]] == ["models[0]"], doc
