"""What `serve` says while vLLM starts: the steps read from vLLM's own log (serve/progress.py), and the
thread that polls it (serve/watch.py) with a scripted log and clock."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from bootstrap.serve import progress as P
from bootstrap.serve import watch as W

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
START = (LOGS / "clean__vllm_0.32_cpu_start.log").read_text()  # a real start of vLLM 0.32 (CPU, TP=2)
SHARDS = (LOGS / "clean__vllm_multinode.log").read_text()  # a 191-shard load, from vllm-project/vllm#6689


def steps_in_order(text):
    seen = []
    for ln in P.lines_of(text):
        s = P.step_of(ln)
        if s is not None and (not seen or seen[-1] != s.name):
            seen.append(s.name)
    return seen


def test_a_real_vllm_start_goes_through_its_steps_in_order():
    assert steps_in_order(START) == ["config", "workers", "loading", "shards", "loaded", "kv-cache",
                                     "engine-ready", "api-server"]
    texts = [P.step_of(ln).text for ln in P.lines_of(START) if P.step_of(ln)]
    assert "resolved the model: LlamaForCausalLM" in texts
    assert "connecting the 2 ranks" in texts
    assert "KV cache: 524,288 tokens" in texts
    assert "engine ready (profile, KV cache, warm-up took 5.7 s)" in texts
    assert "API server starting on http://172.31.240.11:8000" in texts


def test_the_latest_step_of_a_partial_log_is_where_vllm_is():
    lines = START.splitlines()
    upto = next(i for i, ln in enumerate(lines) if "Starting to load model" in ln)
    assert P.latest_step("\n".join(lines[:upto + 1])).name == "loading"
    assert P.latest_step("\n".join(lines[:3])) is None  # the banner only: nothing recognized yet
    assert P.latest_step(START).name == "api-server"


@pytest.mark.parametrize("line, text", [
    ("Loading safetensors checkpoint shards:  49% Completed | 94/191 [08:33<15:40,  9.70s/it]",
     "loading the weights: 94/191 checkpoint shards (49%), 15:40 left"),
    ("Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]",
     "loading the weights: 0/1 checkpoint shards (0%)"),
    ("(Worker_TP0 pid=1) INFO 12-01 10:00:00 [gpu_model_runner.py:5150] Model loading took 131.4 GiB memory and "
     "412.518302 seconds", "weights loaded: 131.4 GiB in 412.5 s"),
    ("(Worker_TP0 pid=1) INFO 12-01 10:07:00 [backends.py:1167] Dynamo bytecode transform time: 12.31 s",
     "torch.compile (the first start of a model compiles; later ones read the cache)"),
    ("(EngineCore pid=1) INFO 12-01 10:08:00 [kv_cache_utils.py:2328] GPU KV cache size: 643,232 tokens, Maximum",
     "KV cache: 643,232 tokens"),
    ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  40%|####      | 27/67 [00:03<00:04,  8.9it/s]",
     "capturing CUDA graphs"),
    ("(Worker_TP0 pid=1) INFO 12-01 10:09:00 [gpu_model_runner.py:6582] Graph capturing finished in 14 secs, "
     "took 0.52 GiB", "CUDA graphs captured in 14 s"),
])
def test_gpu_and_long_load_lines_name_their_step(line, text):
    assert P.step_of(line).text == text


def test_a_progress_bar_redrawn_with_carriage_returns_reads_as_its_newest_redraw():
    bar = ("Loading safetensors checkpoint shards:  10% Completed | 19/191 [01:33<14:00, 4.9s/it]\r"
           "Loading safetensors checkpoint shards:  11% Completed | 21/191 [01:43<13:50, 4.9s/it]")
    assert P.latest_step(bar).text == "loading the weights: 21/191 checkpoint shards (11%), 13:50 left"
    assert P.latest_step(SHARDS).name == "shards"


def test_progress_reports_a_new_step_at_once_a_moving_one_every_ten_seconds_and_a_heartbeat():
    p = P.Progress()

    def shard(n):
        return P.step_of(f"Loading safetensors checkpoint shards:  {n}% Completed | {n}/100 [00:01<00:09]")
    assert p.update(None, 0.0) == P.STARTING.text  # nothing logged yet: say so at once
    assert p.update(None, 5.0) is None
    assert p.update(None, 31.0) == f"{P.STARTING.text} (this step 31 s so far)"
    assert p.update(shard(1), 32.0).startswith("loading the weights: 1/100")  # a new step: at once
    assert p.update(shard(2), 35.0) is None  # moving, but within 10 s
    assert p.update(shard(5), 42.5) == "loading the weights: 5/100 checkpoint shards (5%), 00:09 left"
    assert p.update(shard(5), 60.0) is None
    assert p.update(shard(5), 73.0) == "loading the weights: 5/100 checkpoint shards (5%), 00:09 left " \
                                       "(this step 41 s so far)"
    # a tail read that lost the newest lines never takes the report back to an earlier step
    assert p.update(P.step_of("non-default args: {}"), 74.0) is None and p.shown.name == "shards"


def test_the_watcher_reports_each_step_as_the_log_grows_and_nothing_after_the_wait():
    log, said = [""], []
    lines = [ln for ln in START.splitlines() if not ln.startswith("#")]
    grown = threading.Event()

    def read():
        if len(log) < 12:
            log.append("\n".join(lines[:len(log) * 6]))
        else:
            grown.set()
        return log[-1]
    with W.watching(said.append, read, poll=0.01):
        assert grown.wait(5)
    n = len(said)
    time.sleep(0.05)
    assert len(said) == n  # stopped with the block
    assert said[0] == P.STARTING.text or said[0].startswith("read the arguments") or "resolved" in said[0]
    assert said[-1] == "API server starting on http://172.31.240.11:8000"
    assert len(said) == len(set(said))  # each step once (no heartbeat within the test)


def test_a_read_that_fails_skips_a_report_and_the_watcher_goes_on():
    calls, said = [], []
    done = threading.Event()

    def read():
        calls.append(1)
        if len(calls) == 1:
            raise OSError("connection reset")
        done.set()
        return "(APIServer pid=1) INFO [model.py:733] Resolved architecture: Qwen3ForCausalLM"
    with W.watching(said.append, read, poll=0.01):
        assert done.wait(5)
        deadline = time.monotonic() + 5
        while not said and time.monotonic() < deadline:
            time.sleep(0.01)
    assert said == ["resolved the model: Qwen3ForCausalLM"]
