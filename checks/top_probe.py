"""One look at a node for `bootstrap top`; prints one JSON line.

Runs INSIDE a node's container (host network), fed on stdin, standard library only:

  top_probe.py [METRICS_URL]

Prints the node's CPU line of /proc/stat and /proc/meminfo (the host's: /proc is not namespaced
for these), `nvidia-smi` utilisation and memory rows when the container has GPUs, and the text of
vLLM's /metrics at METRICS_URL (a replica's head) with only the vllm: series kept.
"""
import json
import os
import shutil
import subprocess
import sys
import urllib.request


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def gpus():
    if not shutil.which("nvidia-smi"):
        return None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,memory.total",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def metrics(url):
    headers = {}
    if os.environ.get("VLLM_API_KEY"):  # /metrics is not guarded by vLLM, but a proxy in front may be
        headers["Authorization"] = "Bearer " + os.environ["VLLM_API_KEY"]
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            text = r.read().decode(errors="replace")
    except Exception as exc:  # refused while starting, timeout, HTTP error: the row says why
        why = getattr(exc, "reason", None) or exc
        return None, f"vLLM {url}: {why}"[:200]
    keep = [ln for ln in text.splitlines()
            if ln.startswith("vllm:") or ln.startswith("# HELP vllm:") or ln.startswith("# TYPE vllm:")]
    return "\n".join(keep) + "\n", None


def main(argv):
    stat = read("/proc/stat")
    doc = {"stat": stat.splitlines()[0] if stat else "", "meminfo": read("/proc/meminfo"), "gpus": gpus()}
    if argv:
        doc["metrics"], doc["metrics_error"] = metrics(argv[0])
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
