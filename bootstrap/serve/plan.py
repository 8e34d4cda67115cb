"""The names of the old serve plan that the CLI imports, kept here: pure, no I/O.

The plan for `bootstrap serve` is split by concern (re-floor, issue 50): serve/mode.py decides the
serving mode and is the one place the split rules are applied; serve/split.py (TP x PP, DP for a
model's shape), serve/flags.py (the flags the plan owns, the checks of the user's), serve/argv.py
(each node's `vllm serve` argv), serve/sizing.py (weight bytes and fit), serve/manifest.py (the model
files on every node), serve/kvlog.py (the KV capacity in vLLM's log).
"""
from __future__ import annotations

from bootstrap.errors import ModelSplitError, ServePlanError  # noqa: F401 (the CLI reads them here)
from bootstrap.serve.flags import check_extra, check_model_ref  # noqa: F401 (moved to serve/flags.py (re-floor))
from bootstrap.serve.split import data_parallel, parallelism, split_label  # noqa: F401 (moved to serve/split.py (re-floor))
