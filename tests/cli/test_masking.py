"""Credentials never printed: every line the CLI prints goes through render.mask_credentials (by way of
_escape, _json and _argv), wherever the value came from: the words after `--`, an inventory's image
reference or mirror URL, a host's error."""
from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from bootstrap.cli import main, render
from bootstrap.errors import UsageError
from bootstrap.inventory.envvars import looks_like_credential

PASSWORD = "Hunter2pw"


@pytest.mark.parametrize("text,shown", [
    ("vllm serve m --api-ke Hunter2pw --max-model-len 4", "vllm serve m --api-ke *** --max-model-len 4"),
    ("vllm serve m --hf_tok=Hunter2pw", "vllm serve m --hf_tok=***"),
    ("vllm serve m '--api-k=Hunter2pw and more'", "vllm serve m '--api-k=***'"),
    ("('--api-key', 'Hunter2pw x')", "('--api-key', '***')"),
    ('["--hf-token", "Hunter2pw"]', '["--hf-token", "***"]'),
    ("a --password Hunter2pw and --auth-token=Hunter2pw", "a --password *** and --auth-token=***"),
    ("HF_TOKEN=Hunter2pw next", "HF_TOKEN=*** next"),
    ("https://bob:Hunter2pw@mirror.example.com/v2", "https://bob:***@mirror.example.com/v2"),
    ("'bob:Hunter2pw@registry.example.com/vllm:1' is not", "'bob:***@registry.example.com/vllm:1' is not"),
    ("token hf_" + "a" * 30 + " and sk-" + "b" * 20, "token *** and ***"),
])
def test_a_credential_shaped_value_is_masked(text, shown):
    assert render.mask_credentials(text) == shown
    assert render.mask_credentials(shown) == shown  # masking twice changes nothing


@pytest.mark.parametrize("text", [
    "--api-key would put a credential on every node's command line (ps, docker inspect, logs)",
    "--api-ke (vLLM reads it as --api-key) would put a credential",
    "--hf-tok is an abbreviation vLLM would read as --hf-token, which would put a credential",
    "vllm/vllm-openai:v0.32.0@sha256:" + "0" * 64, "ubuntu:22.04@sha256:" + "1" * 64,
    "root@192.0.2.1:22", "/models/task-classification-model-v2", "--tokenizer org/tok --max-num-batched-tokens 8192",
    "--api-server-count 2 --hf-config-path /m", "http://10.0.0.1:8000/v1", "eos_token=</s> max_num_batched_tokens=8",
])
def test_words_that_are_no_credential_are_shown_as_they_are(text):
    assert render.mask_credentials(text) == text


def test_an_argv_and_a_json_document_mask_the_value_after_a_credential_flag():
    argv = ["vllm", "serve", "m", "--api-ke", "plain", "--hf-token=two words", "--max-model-len", "4"]
    assert render._argv(argv) == "vllm serve m --api-ke '***' '--hf-token=***' --max-model-len 4"
    with render.out.capture() as cap:
        render._json({"argv": argv, "url": "https://bob:Hunter2pw@example.com"})
    text = cap.get()
    assert "plain" not in text and "two words" not in text and PASSWORD not in text and '"4"' in text


def test_an_error_line_masks_what_it_carries():
    with render.err.capture() as cap:
        render.failure(UsageError(f"gpu-a: vllm serve m --api-key {PASSWORD}1 failed; HF_TOKEN=hf_{'c' * 30}"))
    text = cap.get()
    assert PASSWORD not in text and not looks_like_credential(text) and text.startswith("error: ")


def _inventory(tmp_path, **cluster) -> str:
    key = tmp_path / "id_test"
    key.write_text("not really a key\n")
    key.chmod(0o600)
    (tmp_path / "known_hosts").write_text("")
    doc = {"cluster": {"name": "mask", "accelerator": "none", **cluster,
                       "ssh": {"user": "root", "key": str(key), "known_hosts": str(tmp_path / "known_hosts")}},
           "hosts": [{"name": "node1", "address": "192.0.2.1"}]}
    path = tmp_path / "hosts.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.parametrize("field,value", [
    ("image", f"bob:{PASSWORD}@registry.example.com/vllm:1"),
    ("image", f"https://bob:{PASSWORD}@registry.example.com/vllm:1"),
    ("image_mirror", f"https://bob:{PASSWORD}@mirror.example.com"),
])
def test_a_password_in_an_image_reference_or_a_mirror_url_is_not_echoed_in_the_refusal(tmp_path, field, value):
    for command in ("validate", "plan"):
        r = CliRunner().invoke(main, [command, "-i", _inventory(tmp_path, **{field: value})],
                               env={"BOOTSTRAP_INVENTORY": None, "HF_TOKEN": None})
        lines = r.stderr.strip("\n").split("\n")
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.stderr
        assert f"cluster.{field}" in lines[0] and PASSWORD not in r.output + r.stderr, lines[0]
