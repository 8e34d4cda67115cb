"""The words after `--` read the way the image's vLLM reads them (serve/plan.check_extra_against),
against the option table vLLM 0.32.0's own `serve` parser printed in the sandbox image
(checks/vllm_options.py, recorded in tests/data/vllm-0.32.0-serve-options.json)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bootstrap.errors import ServePlanError
from bootstrap.serve import plan as P

ROOT = Path(__file__).resolve().parents[2]
OPTS = P.VllmOptions.from_doc(json.loads((ROOT / "tests/data/vllm-0.32.0-serve-options.json").read_text()))


def test_the_recorded_table_is_vllms():
    assert OPTS is not None and OPTS.version == "0.32.0" and OPTS.abbrev
    assert OPTS.dests["-tp"] == OPTS.dests["--tensor-parallel-size"] == "tensor_parallel_size"
    assert len(OPTS.dests) > 400


@pytest.mark.parametrize("words,flag,said", [
    (["--hos=0.0.0.0"], "--hos", "(vLLM reads it as --host) is set by the serve plan; do not pass it as an extra vllm "
                                 "argument (use --listen)"),
    (["--tensor_parallel_size", "2"], "--tensor_parallel_size", "(vLLM reads it as --tensor-parallel-size)"),
    (["--enforce-eager", "-n3"], "-n3", "(vLLM reads it as --nnodes)"),  # a short option, its value attached
    (["-tp2"], "-tp2", "is not an option"),  # vLLM refuses it too (exit 2, seen in the image)
    (["--no-enable-expert-parallel"], "--no-enable-expert-parallel", "(use --ep)"),
    (["-dpn", "1"], "-dpn", "(vLLM reads it as --data-parallel-rank)"),
    (["--node-r", "1"], "--node-r", "(use the inventory's hosts"),
    (["--served-model", "x"], "--served-model", "(use --served-model-name before --)"),
    (["--max-modle-len", "4096"], "--max-modle-len", "is not an option of vLLM 0.32.0's `vllm serve` (did you mean "
                                                     "--max-model-len?)"),
    (["--m", "1"], "--m", "is ambiguous to vLLM 0.32.0 (it could be"),
])
def test_a_word_vllm_would_read_as_a_plan_setting_or_not_at_all_is_refused(words, flag, said):
    with pytest.raises(ServePlanError) as ei:
        P.check_extra_against(words, OPTS, "native")
    text = str(ei.value)
    assert text.startswith(flag + " ") and said in text, text


@pytest.mark.parametrize("words", [
    ["--max-model-len", "4096", "--enforce-eager"], ["--max-model", "4096"], ["--seed", "-1"],
    ["--gpu-memory-utilization=0.8", "--kv-cache-dtype", "fp8"], ["--enable-prefix-caching"],
    ["--no-enable-prefix-caching"], ["-q", "fp8"], ["--override-generation-config", '{"temperature": -0.5}'],
])
def test_the_words_vllm_reads_as_its_own_settings_pass(words):
    P.check_extra_against(words, OPTS, "native")


def test_ray_backend_owns_fewer_flags_than_native():
    with pytest.raises(ServePlanError, match="use the inventory's hosts"):
        P.check_extra_against(["--nnodes", "2"], OPTS, "native")
    P.check_extra_against(["--headless"], OPTS, "ray")


def test_without_abbreviations_a_prefix_is_unknown():
    strict = P.VllmOptions(OPTS.version, OPTS.dests, abbrev=False)
    with pytest.raises(ServePlanError, match="is not an option"):
        P.check_extra_against(["--max-model", "4096"], strict, "native")


@pytest.mark.parametrize("doc", [None, {"error": "ImportError: no vllm"}, {"options": []}, {"options": {}},
                                 {"options": {"x": "y"}}, "garbage"])
def test_an_answer_without_a_table_is_unknown_not_a_refusal(doc):
    assert P.VllmOptions.from_doc(doc) is None


def test_the_script_reports_an_image_without_vllm_as_an_error_line():
    r = subprocess.run([sys.executable, str(ROOT / "checks/vllm_options.py")], capture_output=True, text=True,
                       timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/nonexistent"})
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(doc) == {"error"} and "vllm" in doc["error"].lower()


# -- the fuzzer: Python's own argparse, given vLLM's table, is the oracle --------------------------
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

OPTIONS = sorted(OPTS.dests)


def oracle(words):
    """What argparse (allow_abbrev, as vLLM's parser) makes of the words: the dests it sets, or None
    when it refuses them (unknown or ambiguous)."""
    import argparse

    class Refused(Exception):
        pass

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise Refused(message)

    parser = Parser(add_help=False, allow_abbrev=True, exit_on_error=False)
    by_dest: dict[str, list[str]] = {}
    for o, d in OPTS.dests.items():
        by_dest.setdefault(d, []).append(o)
    for d, names in by_dest.items():
        parser.add_argument(*names, dest=d, nargs="?", default=None, const=True)
    words = [w.replace("_", "-") if w.startswith("--") and "=" not in w else
             (w.split("=", 1)[0].replace("_", "-") + "=" + w.split("=", 1)[1] if w.startswith("--") else w)
             for w in words]  # FlexibleArgumentParser's `_` -> `-`
    try:
        ns, rest = parser.parse_known_args(words)
    except (Refused, argparse.ArgumentError):
        return None
    if any(w.startswith("-") and not P._NUMBER.fullmatch(w) for w in rest):
        return None  # an option it does not know (a stray value is not what is checked here)
    return {d for d, v in vars(ns).items() if v is not None}


@st.composite
def pass_through(draw):
    opt = draw(st.sampled_from(OPTIONS))
    how = draw(st.sampled_from(["whole", "prefix", "underscore", "equals", "attached", "typo"]))
    word = opt
    if how == "prefix" and len(opt) > 4:
        word = opt[:draw(st.integers(min_value=3, max_value=len(opt)))]
    elif how == "underscore" and opt.startswith("--"):
        word = "--" + opt[2:].replace("-", "_")
    elif how == "equals" and opt.startswith("--"):
        word = opt + "=" + draw(st.sampled_from(["1", "x", "0.0.0.0", ""]))
    elif how == "attached" and not opt.startswith("--") and len(opt) == 2:
        word = opt + draw(st.sampled_from(["1", "4", "x"]))
    elif how == "typo" and len(opt) > 4:
        i = draw(st.integers(min_value=2, max_value=len(opt) - 1))
        word = opt[:i] + draw(st.sampled_from(["x", "", "-"])) + opt[i + 1:]
    value = [] if "=" in word or draw(st.booleans()) else [draw(st.sampled_from(["1", "abc", "-1"]))]
    lead = draw(st.sampled_from([[], ["--max-model-len", "256"], ["--enforce-eager"]]))
    return [*lead, word, *value]


@settings(max_examples=int(__import__("os").environ.get("BOOTSTRAP_FUZZ_EXAMPLES", "150")) * 4, deadline=None,
          derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(words=pass_through(), backend=st.sampled_from(["native", "ray"]))
def test_pass_through_is_refused_exactly_when_vllm_would_refuse_it_or_read_a_plan_setting(words, backend):
    owned = {OPTS.dests[f] for f in ((P._OWNED_RAY if backend == "ray" else P._OWNED_NATIVE) + P._OWNED_DP
                                     + P._OWNED_EP) if f in OPTS.dests}
    sets = oracle(words)
    try:
        P.check_extra_against(words, OPTS, backend)
        refused = None
    except ServePlanError as exc:
        refused = str(exc)
        assert "\n" not in refused
    if sets is None:
        assert refused is not None, f"{words}: vLLM's parser refuses them, bootstrap let them through"
    elif sets & owned:
        assert refused is not None and "set by the serve plan" in refused, (words, sets & owned)
    else:
        assert refused is None, f"{words}: vLLM reads {sorted(sets)}, bootstrap refused: {refused}"
