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
from bootstrap.serve import flags as P
from bootstrap.serve import passthrough as PT

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


#: (the words, the word refused, what vLLM 0.32 reads it as, the reason said)
FENCED_WORDS = [
    (["--api-ke", "Hunter2pw"], "--api-ke", "--api-key", "would put a credential on every node's command line"),
    (["--hf-tok=Hunter2pw"], "--hf-tok", "--hf-token", "list HF_TOKEN under cluster.secrets"),
    (["--api_key", "Hunter2pw"], "--api_key", "--api-key", "list VLLM_API_KEY under cluster.secrets"),
    (["--grpc"], "--grpc", None, "would start vLLM's gRPC server"),
    (["--grpc-p", "50051"], "--grpc-p", "--grpc-port", "would start vLLM's gRPC server"),
    (["--uds=/tmp/v.sock"], "--uds", None, "would move vLLM's API to a Unix socket"),
    (["--kv-events-config.endpoint=tcp://*:5557"], "--kv-events-config.endpoint", "--kv-events-config",
     "ZMQ sockets of vLLM's own"),
    (["-dph"], "-dph", "--data-parallel-hybrid-lb", "would start API servers beyond the head's"),
    (["--data-parallel-external"], "--data-parallel-external", "--data-parallel-external-lb", "use --dp ("),
    (["--data-parallel-sup", "1"], "--data-parallel-sup", "--data-parallel-supervisor-port", "open to anyone"),
    (["--allowed-local-media", "/"], "--allowed-local-media", "--allowed-local-media-path",
     "read the container's files"),
    (["--ssl_keyfile", "/k.pem"], "--ssl_keyfile", "--ssl-keyfile", "a key file inside every container"),
    (["--ssl-certf", "/c.pem"], "--ssl-certf", "--ssl-certfile", "TLS on vLLM's own endpoint"),
    (["--config", "/m/args.yaml"], "--config", None, "bootstrap cannot check against the plan"),
]


@pytest.mark.parametrize("words,word,as_,said", FENCED_WORDS)
def test_a_credential_listener_or_file_flag_is_refused_in_any_spelling_vllm_reads(words, word, as_, said):
    """With the image's table: the setting vLLM reads the word as decides (passthrough.FENCED)."""
    for backend in ("native", "ray"):
        with pytest.raises(ServePlanError) as ei:
            P.check_extra_against(words, OPTS, backend)
        text = str(ei.value)
        assert text.startswith(word + " ") and said in text and "Hunter2pw" not in text, text
        assert (f"(vLLM reads it as {as_})" in text) == (as_ is not None), text


@pytest.mark.parametrize("words,word,as_,said", FENCED_WORDS)
def test_without_the_images_table_the_same_spellings_are_refused(words, word, as_, said):
    """Offline (the CLI's first look, a plan built before any host is read): resolved against the
    spellings bootstrap knows, prefixes included."""
    with pytest.raises(ServePlanError) as ei:
        P.check_extra(words)
    text = str(ei.value)
    assert text.startswith(word + " ") and said in text and "Hunter2pw" not in text, text


@pytest.mark.parametrize("words", [["--no-data-parallel-hybrid-lb"], ["--no-data-parallel-ext"],
                                   ["--allowed-media-domains", "example.com"], ["--ssl-cert-reqs", "0"],
                                   ["--config-format", "auto"], ["--api-server-count", "2"]])
def test_the_off_form_of_a_fenced_switch_and_its_neighbours_pass(words):
    P.check_extra_against(words, OPTS, "native")
    P.check_extra(words)


def test_a_disaggregated_fleets_connector_flag_is_refused_in_any_spelling():
    """The flag the disaggregated plan sets (fleet/plan.PD_FLAGS): abbreviated, `_` or dotted, with the
    image's table and without it."""
    from bootstrap.errors import FleetError
    from bootstrap.fleet import plan as FP

    for word in ("--kv-transfer", "--kv_transfer_config={}", "--kv-transfer-config.kv_role=kv_producer", "--kv-tr"):
        with pytest.raises(ServePlanError, match="is set by the serve plan.*use cluster.router.prefill"):
            P.check_extra_against([word, "{}"], OPTS, "native", FP.PD_FLAGS)
    P.check_extra_against(["--kv-transfer", "{}"], OPTS, "native")  # not disaggregated: the user's own connector

    class Inv:  # what check_pd_flags reads of an inventory
        class cluster:
            replicas = 2

            class router:
                prefill = (0,)
    for word in ("--kv-transfer", "--kv_transfer_config={}", "--kv-transfer-config.kv_role=x"):
        with pytest.raises(FleetError, match="is set by the plan on a disaggregated fleet"):
            FP.check_pd_flags(Inv, [word])
    FP.check_pd_flags(Inv, ["--kv-cache-dtype", "fp8", "--kv-offloading-size", "4"])


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
    for o, d in OPTS.dests.items():  # a `--no-` form (it turns a switch off) sets "not:" + its dest
        negation = o.startswith("--no-") and OPTS.dests.get("--" + o[5:]) == d
        by_dest.setdefault("not:" + d if negation else d, []).append(o)
    for d, names in by_dest.items():
        parser.add_argument(*names, dest=d.replace(":", "_"), nargs="?", default=None, const=True)
    words = [w.replace("_", "-") if w.startswith("--") and "=" not in w else
             (w.split("=", 1)[0].replace("_", "-") + "=" + w.split("=", 1)[1] if w.startswith("--") else w)
             for w in words]  # FlexibleArgumentParser's `_` -> `-`
    try:
        ns, rest = parser.parse_known_args(words)
    except (Refused, argparse.ArgumentError):
        return None
    if any(w.startswith("-") and not PT.NUMBER.fullmatch(w) for w in rest):
        return None  # an option it does not know (a stray value is not what is checked here)
    return {d.replace("not_", "not:", 1) if d.startswith("not_") else d for d, v in vars(ns).items()
            if v is not None}


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
    fenced = sorted(d for d in sets or () if d in P.PT.FENCED)  # a `--no-` form turns a switch off: it passes
    if sets is None:
        assert refused is not None, f"{words}: vLLM's parser refuses them, bootstrap let them through"
    elif {d.removeprefix("not:") for d in sets} & owned:
        assert refused is not None and "set by the serve plan" in refused, (words, sets & owned)
    elif fenced:
        assert refused is not None and P.PT.FENCED[fenced[0]].why in refused, (words, fenced, refused)
    else:
        assert refused is None, f"{words}: vLLM reads {sorted(sets)}, bootstrap refused: {refused}"


# -- the fuzzer of fenced spellings: prefixes, `_` and `=` forms of every credential, listener, file and
# plan-set option of the image's table, with credential-shaped values
def _positive(o):
    return not (o.startswith("--no-") and OPTS.dests.get("--" + o[5:]) == OPTS.dests[o])


FENCED_OR_OWNED = sorted(o for o, d in OPTS.dests.items() if _positive(o) and (
    d in P.PT.FENCED or d in {OPTS.dests[f] for f in P._owned(None) if f in OPTS.dests}))
SECRETS = ["sk-" + "Q" * 24, "hf_" + "Z" * 30, "http://bob:Hunter2pw@example.com", "Hunter2pw"]


@st.composite
def fenced_spellings(draw):
    """(the words, the spelling among them)."""
    opt = draw(st.sampled_from(FENCED_OR_OWNED))
    word = opt
    if opt.startswith("--"):
        word = opt[:draw(st.integers(min_value=3, max_value=len(opt)))]
        if draw(st.booleans()):
            word = "--" + word[2:].replace("-", "_")
    value = draw(st.sampled_from(SECRETS))
    how = draw(st.sampled_from(["bare", "equals", "value"]))
    words = [word + "=" + value] if how == "equals" else [word, value] if how == "value" else [word]
    return [*draw(st.sampled_from([[], ["--enforce-eager"], ["--max-model-len", "256"]])), *words], word


@settings(max_examples=int(__import__("os").environ.get("BOOTSTRAP_FUZZ_EXAMPLES", "150")) * 4, deadline=None,
          derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(case=fenced_spellings(), backend=st.sampled_from(["native", "ray"]))
def test_a_spelling_of_a_fenced_or_plan_set_option_is_refused_or_reads_as_an_allowed_one(case, backend):
    """Each spelling is refused in one line that shows no credential, or vLLM's own parser (the oracle)
    reads it as an option bootstrap allows; without the image's table, every spelling vLLM reads as a
    fenced or plan-set option is refused too (a long one from its fourth character), and none that it
    reads as an allowed one."""
    words, word = case
    owned = {OPTS.dests[f] for f in P._owned(backend) if f in OPTS.dests}
    sets = oracle(words)
    base = {d.removeprefix("not:") for d in sets} if sets is not None else None
    bad = base is not None and bool(base & (owned | set(P.PT.FENCED)))
    said = []
    for check in (lambda: P.check_extra_against(words, OPTS, backend), lambda: P.check_extra(words, backend)):
        try:
            check()
            said.append(None)
        except ServePlanError as exc:
            text = str(exc)
            assert "\n" not in text and not any(v in text for v in SECRETS), text
            said.append(text)
    with_table, offline = said
    assert (with_table is not None) == (sets is None or bad), (words, sets, with_table)
    credential = any(P.PT.looks_like_credential(w) for w in words)
    if bad and (len(word) > 3 if word.startswith("--") else word in OPTS.dests):
        assert offline is not None and (offline.startswith(word) or credential), (words, base, offline)
    if base is not None and not bad and not credential:
        assert offline is None, (words, offline)
