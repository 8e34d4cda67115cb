"""serve's progress on a terminal (issue 51.2): while vLLM starts, a live row per node ticks in place
(its step and how long it has lasted) instead of a heartbeat line every 30 s; a new step is still a
line of its own, and every event still goes to the run log. Not on a terminal, or with --json: lines."""
from __future__ import annotations

import io

from rich.console import Console

from bootstrap.cli import show
from bootstrap.cli.show import LineReporter, LiveReporter, progress_reporter


def test_live_rows_replace_the_heartbeat_lines_and_end_with_the_step(monkeypatch):
    lines, logged = [], []
    monkeypatch.setattr(LineReporter, "event", lambda self, host, stage, status, detail="": lines.append(
        (host, status, detail)) or True)
    from bootstrap.cli import runlog
    monkeypatch.setattr(runlog, "event", logged.append)
    buf = io.StringIO()
    rep = LiveReporter(Console(file=buf, force_terminal=True, width=120))
    rep.event("node1", "vllm-start", "waiting", "loading weights")
    assert rep.live is not None  # the live rows started with the first step
    rep.event("node1", "vllm-start", "waiting", "loading weights (this step 30 s so far)")  # a heartbeat
    rep.event("node2", "vllm-start", "waiting", "KV cache: 524,288 tokens")
    rendered = Console(file=io.StringIO(), width=120)
    rendered.print(rep)
    shown = rendered.file.getvalue()
    assert "node1" in shown and "loading weights" in shown and "node2" in shown and " s" in shown
    assert lines == [("node1", "waiting", "loading weights"), ("node2", "waiting", "KV cache: 524,288 tokens")]
    assert any("this step 30 s so far" in x for x in logged)  # the heartbeat is in the run log
    rep.event("node1", "vllm-start", "done", "63s")
    assert set(rep.rows) == {"node2"} and lines[-1] == ("node1", "done", "63s")
    rep.event("node2", "vllm-start", "failed", "900s")
    assert rep.rows == {} and rep.live is None  # the live rows end with the last node's wait
    rep.event("node3", "vllm-start", "waiting", "compiling")
    rep.close()
    assert rep.live is None


def test_not_on_a_terminal_or_with_json_the_lines_stay(monkeypatch):
    assert type(progress_reporter(True)) is LineReporter and progress_reporter(True).quiet
    assert type(progress_reporter(False)) is LineReporter  # pytest's stderr is no terminal
    monkeypatch.setattr(show, "err", Console(file=io.StringIO(), force_terminal=True))
    assert type(progress_reporter(False)) is LiveReporter
    assert type(progress_reporter(True)) is LineReporter
