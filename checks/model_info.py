"""Read a model's config.json (and safetensors index) where vLLM will read it; print one JSON line.

Runs INSIDE the head container (fed on stdin), so it sees what vLLM will see: an absolute path
is read from the container's filesystem; a Hugging Face id is looked up in the container's HF
cache (huggingface_hub's try_to_load_from_cache), then fetched from the hub with the container's
own credentials (HF_TOKEN in its environment) unless HF_HUB_OFFLINE is set. Nothing else is
downloaded: only these two small JSON files.

Args: MODEL
Output: {"config": {...}|null, "index": {...}|null, "source": "path"|"hf-cache"|"hub"|null,
         "error": str|null}
"""
import json
import os
import socket
import sys

FILES = ("config.json", "model.safetensors.index.json")


def read_json(path):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def from_path(model):
    out = {"config": None, "index": None, "source": "path", "error": None}
    cfg = os.path.join(model, FILES[0])
    if not os.path.isfile(cfg):
        out["error"] = f"no {FILES[0]} under {model}"
        out["source"] = None
        return out
    out["config"] = read_json(cfg)
    idx = os.path.join(model, FILES[1])
    if os.path.isfile(idx):
        out["index"] = read_json(idx)
    return out


def from_hub(model):
    out = {"config": None, "index": None, "source": None, "error": None}
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache
    except ImportError:
        out["error"] = "huggingface_hub is not installed in the image"
        return out
    found = {}
    for name in FILES:
        p = try_to_load_from_cache(model, name)
        if isinstance(p, str):
            found[name] = p
    if FILES[0] in found:
        out["source"] = "hf-cache"
    elif os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        out["error"] = "not in the HF cache and HF_HUB_OFFLINE is set"
        return out
    else:
        socket.setdefaulttimeout(15)
        for name in FILES:
            try:
                found[name] = hf_hub_download(model, name, etag_timeout=10)
            except Exception as exc:  # noqa: BLE001 - a missing index is normal; the config's error is reported
                if name == FILES[0]:
                    out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    return out
        out["source"] = "hub"
    out["config"] = read_json(found[FILES[0]])
    if FILES[1] in found:
        out["index"] = read_json(found[FILES[1]])
    return out


def main(argv):
    model = argv[1]
    try:
        out = from_path(model) if model.startswith("/") else from_hub(model)
    except (OSError, ValueError) as exc:
        out = {"config": None, "index": None, "source": None, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
