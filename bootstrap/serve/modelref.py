"""Whether the model a `serve` names can be served at all, before anything starts (pure).

checks/model_info.py reads the model's config.json in the head's container, where vLLM will read
it, and says what kind of failure a hub lookup was. vLLM makes the same lookup from the same
container, so a model the hub does not have, refuses, or that the container can neither fetch nor
find in its cache would fail minutes later, after every node started: refused here instead, in one
line with the fix. A lookup that does not decide (vLLM told to read ModelScope, a URI such as
s3://, a failure of another kind) stays a note and vLLM is launched.
"""
from __future__ import annotations

from bootstrap.errors import BootstrapError, PreflightFailed, UsageError


def refusal(model: str, info: dict, head: str) -> BootstrapError | None:
    """The error to stop `serve` with for what model_info.py said (None: go on, perhaps with a note)."""
    if info.get("config") is not None or model.startswith("/") or "://" in model or info.get("elsewhere"):
        return None
    kind, error = info.get("kind"), info.get("error") or "no answer"
    if kind == "missing":
        return UsageError(f"model {model!r} is not on the Hugging Face hub nor in {head}'s HF cache ({error}): check "
                          "the name (owner/name as on huggingface.co; case matters), give a path inside the container, "
                          "or, for a private model, a token with access (cluster.secrets: [HF_TOKEN])")
    if kind == "denied":
        return PreflightFailed(head, f"the Hugging Face hub refuses {model} ({error})",
                               "a gated or private model: accept its terms on huggingface.co and give the containers a "
                               "token with access (cluster.secrets: [HF_TOKEN])")
    if kind == "unreachable":
        return PreflightFailed(head, f"{model} is not in the container's HF cache and the Hugging Face hub does not "
                                     f"answer ({error}); vLLM would fail the same way",
                               "download it into the HF cache (cluster.hf_cache) beforehand, serve a path, or let the "
                               "host reach huggingface.co (HF_ENDPOINT for a mirror)")
    return None
