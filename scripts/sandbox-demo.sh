#!/usr/bin/env bash
# The main job on the local sandbox: simulated hosts with their own IP, sshd and Docker daemon,
# then `bootstrap up` brings up the Ray cluster of vLLM (CPU) containers and prints its status.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/dev-setup.sh
nodes=${NODES:-3}
bootstrap sandbox up --nodes "$nodes"
inv=${BOOTSTRAP_SANDBOX_DIR:-$HOME/.cache/bootstrap-sandbox}/inventory.yaml
bootstrap plan -i "$inv"
bootstrap up -i "$inv"
bootstrap status -i "$inv"
echo "The cluster stays up. Tear down with: bootstrap down -i $inv && bootstrap sandbox down" >&2
