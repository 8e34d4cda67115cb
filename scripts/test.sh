#!/usr/bin/env bash
# The whole test suite, sandbox tests included (they build the sandbox images on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/dev-setup.sh
# In CI the sandbox tests must run, never skip.
export BOOTSTRAP_REQUIRE_SANDBOX=${BOOTSTRAP_REQUIRE_SANDBOX:-1}
exec python3 -m pytest -v -rs --durations=15 "$@"
