#!/usr/bin/env bash
# The main job on the local sandbox, from a fresh machine to a served completion: simulated hosts
# with their own IP, sshd and Docker daemon; `bootstrap up` brings up the Ray cluster of vLLM (CPU)
# containers; `check-nccl` proves the nodes can talk; `serve` picks the split from the model
# (no parallelism flags) and waits until it answers; one completion is printed; `status` shows it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/dev-setup.sh
nodes=${NODES:-3}
model=/opt/models/tiny-llama
bootstrap sandbox up --nodes "$nodes"
inv=${BOOTSTRAP_SANDBOX_DIR:-$HOME/.cache/bootstrap-sandbox}/inventory.yaml
bootstrap plan -i "$inv"
bootstrap up -i "$inv"
bootstrap check-nccl -i "$inv"
bootstrap serve -i "$inv" "$model"
endpoint=$(bootstrap status -i "$inv" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serving"]["endpoint"])')
python3 - "$endpoint" "$model" <<'PY'
import json, sys, urllib.request
endpoint, model = sys.argv[1:3]
body = json.dumps({"model": model, "prompt": "The cluster", "max_tokens": 16, "temperature": 0}).encode()
req = urllib.request.Request(endpoint + "/completions", body, {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=300) as r:
    text = json.loads(r.read())["choices"][0]["text"]
print(f"completion from {endpoint}: 'The cluster' -> {text!r}")
PY
bootstrap status -i "$inv"
echo "The cluster stays up and serving. Stop with: bootstrap serve -i $inv --stop --yes; tear down with:" \
     "bootstrap down -i $inv && bootstrap sandbox down" >&2
