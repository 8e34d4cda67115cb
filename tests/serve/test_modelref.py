"""A model that cannot be served is refused before launch (serve/modelref.py), from what
checks/model_info.py says of the hub lookup it made where vLLM will make it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bootstrap.errors import ExitStatus, PreflightFailed, UsageError
from bootstrap.serve import modelref as MR

SCRIPT = Path(__file__).resolve().parents[2] / "checks" / "model_info.py"
spec = importlib.util.spec_from_file_location("model_info_check", SCRIPT)
CHECK = importlib.util.module_from_spec(spec)
spec.loader.exec_module(CHECK)


def hub_error(name, base=OSError, status=None):
    """An exception class named as huggingface_hub's (the check reads names: the image's version decides)."""
    cls = type(name, (base,), {})
    exc = cls(f"{name}: 404 Client Error")
    if status is not None:
        exc.response = type("R", (), {"status_code": status})()
    return exc


@pytest.mark.parametrize("exc, kind", [
    (hub_error("RepositoryNotFoundError"), "missing"),
    (hub_error("RevisionNotFoundError"), "missing"),
    (hub_error("RemoteEntryNotFoundError"), "missing"),
    (hub_error("GatedRepoError", base=type("RepositoryNotFoundError", (OSError,), {})), "denied"),
    (hub_error("HfHubHTTPError", status=403), "denied"),
    (hub_error("LocalEntryNotFoundError", base=FileNotFoundError), "unreachable"),
    (hub_error("ConnectTimeout"), "unreachable"),
    (hub_error("OfflineModeIsEnabled", base=ConnectionError), "unreachable"),
    (ValueError("something else"), "other"),
])
def test_the_check_names_the_kind_of_a_failed_hub_lookup(exc, kind):
    assert CHECK.kind_of(exc) == kind


def test_a_misspelt_hub_model_is_a_usage_error_naming_the_model_and_the_fix():
    err = MR.refusal("meta-llama/Llama-3.1-8B-Instruc", {"config": None, "kind": "missing",
                                                         "error": "RepositoryNotFoundError: 401 Client Error"}, "node1")
    assert isinstance(err, UsageError) and err.exit_status == ExitStatus.BAD_INPUT
    assert str(err).startswith("model 'meta-llama/Llama-3.1-8B-Instruc' is not on the Hugging Face hub nor in "
                               "node1's HF cache (RepositoryNotFoundError")
    assert "check the name" in str(err) and "HF_TOKEN" in str(err)


@pytest.mark.parametrize("kind, says, fix", [
    ("denied", "the Hugging Face hub refuses org/gated", "accept its terms"),
    ("unreachable", "org/gated is not in the container's HF cache and the Hugging Face hub does not answer",
     "cluster.hf_cache"),
])
def test_a_refused_or_unreachable_model_is_a_preflight_failure_on_the_head(kind, says, fix):
    err = MR.refusal("org/gated", {"config": None, "kind": kind, "error": "E: x"}, "node1")
    assert isinstance(err, PreflightFailed) and says in str(err) and fix in err.hint and err.host == "node1"


@pytest.mark.parametrize("model, info", [
    ("org/model", {"config": {"num_attention_heads": 8}, "kind": None}),  # read: go on
    ("/models/m.gguf", {"config": None, "kind": None, "error": "no config.json under /models/m.gguf"}),  # a file
    ("s3://bucket/model", {"config": None, "kind": "unreachable", "error": "E"}),  # not the HF hub
    ("org/model", {"config": None, "kind": "missing", "error": "E", "elsewhere": "VLLM_USE_MODELSCOPE"}),
    ("org/model", {"config": None, "kind": "other", "error": "ValueError: x"}),  # undecided: a note, not a stop
    ("org/model", {}),  # no answer at all: the note says so
])
def test_what_does_not_decide_is_not_refused(model, info):
    assert MR.refusal(model, info, "node1") is None
