"""The A/B's workloads and trace files (serve/workloads.py) and its table (serve/abtest.py): pure."""
from __future__ import annotations

import json

import pytest

from bootstrap.errors import UsageError
from bootstrap.serve import abtest as AB
from bootstrap.serve import benchstats as BS
from bootstrap.serve import workloads as W


def common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_each_workload_has_its_shape_and_the_same_seed_gives_the_same_prompts():
    for name in W.WORKLOADS:
        a, b, other = W.build(name, 24, 80, 0), W.build(name, 24, 80, 0), W.build(name, 24, 80, 1)
        assert len(a) == 24 and a == b, name
        assert [r.prompt for r in a] != [r.prompt for r in other], name  # another arm: other words
    shared = W.build("shared-prefix", 32, 80)
    assert len({r.session for r in shared}) == W.USERS
    assert min(common_prefix(shared[0].prompt, r.prompt) for r in shared[1:]) > len(shared[0].prompt) * 0.6
    few = W.build("few-shot", 8, 80)
    assert min(common_prefix(few[0].prompt, r.prompt) for r in few[1:]) > len(few[0].prompt) * 0.7
    rnd = W.build("random", 8, 80)
    assert max(common_prefix(rnd[0].prompt, r.prompt) for r in rnd[1:]) < 30  # a word or two, by chance
    assert all(abs(len(r.prompt.split()) - 80) <= 2 for r in rnd)
    assert all(r.session is None and r.at is None and r.max_tokens is None for r in rnd + few)


def test_multi_turn_sessions_grow_turn_after_turn_and_name_their_session():
    reqs = W.build("multi-turn", W.SESSIONS * W.TURNS, 40)
    by_session: dict[str, list[str]] = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r.prompt)
    assert len(by_session) == W.SESSIONS
    for turns in by_session.values():
        assert len(turns) == W.TURNS
        for before, after in zip(turns, turns[1:]):  # each turn repeats the conversation so far
            assert after.startswith(before[:-len("assistant:")]) and len(after) > len(before)
    assert [r.session for r in reqs[:W.SESSIONS]] == [f"session-{s}" for s in range(W.SESSIONS)]  # first turns first


def test_a_trace_is_read_with_times_from_its_first_line_and_a_bad_line_is_named(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(d) for d in (
        {"timestamp": 100.0, "prompt": "hello there", "output_tokens": 5, "session": "a"},
        {"timestamp": 100.5, "prompt_tokens": 12},
        {"prompt": "no time"})) + "\n\n")
    reqs = W.read_trace(str(p))
    assert [(r.max_tokens, r.session, r.at) for r in reqs] == [(5, "a", 0.0), (None, None, 0.5), (None, None, None)]
    assert reqs[0].prompt == "hello there" and len(reqs[1].prompt.split()) == 12
    for line, msg in ((json.dumps({"prompt": "x", "prompt_tokens": 3}), "give either prompt"),
                      (json.dumps({"prompt_tokens": 0}), "prompt_tokens must be a whole number >= 1"),
                      (json.dumps({"prompt": "x", "output_tokens": "9"}), "output_tokens must be a whole number"),
                      (json.dumps({"prompt": "x", "timestamp": True}), "timestamp must be a number"),
                      ("[1]", "each line is a JSON object"), ("{nope", "not JSON")):
        p.write_text(json.dumps({"prompt": "ok"}) + "\n" + line + "\n")
        with pytest.raises(UsageError, match=f"^{p}:2: {msg}"):
            W.read_trace(str(p))
    p.write_text("\n")
    with pytest.raises(UsageError, match="has no requests"):
        W.read_trace(str(p))
    with pytest.raises(UsageError, match="cannot read the trace"):
        W.read_trace(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UsageError, match="no workload 'chat'"):
        W.build("chat", 1, 10)


def test_arms_are_interleaved_so_no_policy_always_goes_first():
    assert AB.order(["a", "b", "c"], 3) == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "b"), (1, "a"),
                                             (2, "a"), (2, "b"), (2, "c")]


def sample(ttft: float | None, ok: bool = True, error: str | None = None) -> BS.Sample:
    return BS.Sample(ok, ttft, (0.01, 0.02) if ok else (), (ttft or 0) + 0.05, 3 if ok else 0, error)


def arm(policy, repeat, samples, wall, q=None, h=None, per=None) -> AB.Arm:
    return AB.Arm(policy, repeat, BS.summarize(samples, wall), q, h, per or {})


def test_the_table_pools_each_policys_arms_and_names_the_best():
    arms = [arm("rr", 0, [sample(0.1), sample(0.3), sample(None, False, "HTTP 503: no workers")], 2.0, 100, 20,
                {0: 2, 1: 1}),
            arm("ca", 0, [sample(0.05), sample(0.06), sample(2.0)], 1.0, 100, 80, {0: 3, 1: 0}),
            arm("rr", 1, [sample(0.2), sample(None, False, "timeout")], 2.0, 100, 30, {0: 1, 1: 1})]
    rr, ca = AB.table(["rr", "ca"], arms, slo_ms=500)
    assert (rr.arms, rr.requests, rr.ok, rr.failed, rr.shed) == (2, 5, 3, 2, 1)
    assert rr.requests_per_s == pytest.approx(3 / 4.0) and rr.goodput == pytest.approx(3 / 4.0)
    assert rr.prefix_hit_pct == pytest.approx(25.0) and rr.per_replica == {0: 3, 1: 2} and rr.spread == 1.5
    assert rr.ttft_p50_ms == pytest.approx(200) and rr.ttft_p99_ms == pytest.approx(300)
    assert rr.itl_p50_ms == pytest.approx(10)
    assert (ca.requests_per_s, ca.goodput, ca.prefix_hit_pct, ca.spread) == (3.0, 2.0, 80.0, None)
    assert AB.best([rr, ca]) == {"requests/s": "ca", "goodput": "ca", "TTFT p50": "ca", "TTFT p99": "rr",
                                 "prefix hit": "ca"}
    doc = AB.AbResult("shared-prefix", ["rr", "ca"], arms, [rr, ca], "rr").to_dict()
    assert doc["rows"][0]["ttft_ms"] == {"p50": 200.0, "p99": 300.0} and doc["best"]["TTFT p99"] == "rr"
    assert [a["repeat"] for a in doc["arms"]] == [1, 1, 2] and doc["restored_policy"] == "rr"


def test_a_measure_no_engine_exported_is_left_out_not_made_up():
    arms = [arm("a", 0, [sample(0.1)], 1.0), arm("b", 0, [sample(0.1)], 1.0, 10, 5)]
    a, b = AB.table(["a", "b"], arms, 100)
    assert a.prefix_hit_pct is None and b.prefix_hit_pct == 50.0
    assert "prefix hit" not in AB.best([a, b]) and "TTFT p50" not in AB.best([a, b])  # one value; a tie


def test_time_per_output_token_counts_tokens_not_chunks():
    s = [BS.Sample(True, 0.1, (0.05,), 0.5, 5, None),  # 4 tokens after the first in 0.4 s, whatever the chunks
         BS.Sample(True, 0.2, (), 0.2, 1, None),  # one token: no time per token
         BS.Sample(False, None, (), 1.0, 0, "timeout")]
    assert AB.tpot_ms(s) == pytest.approx(100.0)
    assert AB.tpot_ms(s[1:]) is None
