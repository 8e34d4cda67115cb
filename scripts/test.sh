#!/usr/bin/env bash
# The whole test suite, sandbox tests included (they build the sandbox images on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/dev-setup.sh
# The gloo/NCCL check is exercised with real torch (the CPU wheel this machine kind provides).
python3 -c "import torch" 2>/dev/null || python3 -m pip install -q torch==2.13.0
# In CI the sandbox tests must run, never skip.
export BOOTSTRAP_REQUIRE_SANDBOX=${BOOTSTRAP_REQUIRE_SANDBOX:-1}
# Lint first (pyproject.toml [tool.ruff]): a finding fails the run like a failing test.
ruff check --no-cache .
# Two workers (pytest-xdist): the sandbox tests are one group on one worker, in their order
# (tests/sandbox/conftest.py); the other worker runs the unit tests beside them.
exec python3 -m pytest -v -rs --durations=15 -n 2 --dist loadgroup "$@"
