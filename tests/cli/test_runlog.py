"""The run log (issue 51.9): one file per command under $BOOTSTRAP_RUNS (default ~/.cache/bootstrap/runs),
named under an error that is not the user's input, holding the command line, every event and remote
command, and how the run ended; -v/--verbose before or after the command's name."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bootstrap.cli import app, runlog
from tests.cli.test_confirm import free_port

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, *argv, runs="runs"):
    env = {**os.environ, "BOOTSTRAP_RUNS": str(tmp_path / runs) if runs else "off"}
    return subprocess.run([sys.executable, "-m", "bootstrap", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL)


def unreachable(tmp_path) -> Path:
    (tmp_path / "known_hosts").write_text("")
    p = tmp_path / "hosts.yaml"
    p.write_text(f"cluster: {{name: t, accelerator: none, ssh: {{port: {free_port()}, known_hosts: "
                 f"{tmp_path}/known_hosts, connect_retries: 0, connect_timeout: 2}}}}\n"
                 "hosts: [{name: a, address: 127.0.0.1, ip: 192.0.2.10}]\n")
    return p


def test_a_failed_run_names_its_log_and_the_log_holds_the_command_the_events_and_the_end(tmp_path):
    inv = unreachable(tmp_path)
    r = run(tmp_path, "up", "-i", str(inv))
    assert r.returncode == 3, r.stderr
    logs = sorted((tmp_path / "runs").glob("*-up.log"))
    assert len(logs) == 1, logs
    assert r.stderr.rstrip().splitlines()[-1] == f"  run log: {logs[0]}", r.stderr
    text = logs[0].read_text()
    assert f"up -i {inv}" in text.splitlines()[0]
    assert "a                connect" in text and "failed" in text  # the event the screen showed
    assert "error: connect failed on 1 of 1 host(s) [a]: a: cannot connect over SSH" in text, text
    assert text.rstrip().endswith("exit 3"), text
    assert "Traceback" not in text  # a host's failure is its line, not a bug


def test_bad_input_stays_one_line_and_the_log_says_exit_2(tmp_path):
    r = run(tmp_path, "status", "-i", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    (log,) = (tmp_path / "runs").glob("*-status.log")
    assert "no such file" in log.read_text() and log.read_text().rstrip().endswith("exit 2")


def test_verbose_before_or_after_the_command_and_off_writes_no_log(tmp_path):
    inv = unreachable(tmp_path)
    for argv in (["-v", "up", "-i", str(inv)], ["up", "-v", "-i", str(inv)], ["up", "--verbose", "-i", str(inv)]):
        r = run(tmp_path, *argv, runs="")
        assert r.returncode == 3 and "run log:" not in r.stderr, (argv, r.stderr)
        # -v shows the start of every stage, which the screen hides without it
        assert "connect        start" in r.stderr, (argv, r.stderr)
    assert not (tmp_path / "runs").exists()
    assert app._take_verbose(["-i", "x", "--", "ls", "-v"]) == ["-i", "x", "--", "ls", "-v"]
    assert app._take_verbose(["-v", "-i", "x", "--", "-v"]) == ["-i", "x", "--", "-v"]


def test_the_log_masks_credentials_and_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.setenv(runlog.RUNS_ENV, str(tmp_path))
    monkeypatch.setattr(runlog, "KEEP", 3)
    monkeypatch.setattr(runlog, "mask", lambda s: s.replace("sk-secret", "***"))
    for _ in range(5):
        log = runlog.start(["bootstrap", "serve", "--", "--api-key", "sk-secret"])
        assert log is not None
        runlog.command("h1", "docker ps", 0, 0.25)
        path = runlog.finish(0)
    assert len(list(tmp_path.glob("*.log"))) == 3
    text = path.read_text()
    assert "sk-secret" not in text and "--api-key ***" in text
    assert "h1: $ docker ps  -> 0 in 0.25s" in text


def test_a_folder_shared_with_other_logs_keeps_every_one_of_theirs(tmp_path, monkeypatch):
    """Issue 68.1: $BOOTSTRAP_RUNS pointing at a folder that holds 150 other programs' *.log files (dated
    earlier, so they sort first): pruning takes run logs only, and never the one just opened."""
    monkeypatch.setenv(runlog.RUNS_ENV, str(tmp_path))
    monkeypatch.setattr(runlog, "KEEP", 3)
    theirs = [tmp_path / f"access-2019{i:04d}.log" for i in range(150)]
    for p in theirs:
        p.write_text("theirs\n")
    (tmp_path / "20190101T000000.000000Z-.log").write_text("not one of ours either\n")
    paths = []
    for argv in (["bootstrap", "plan"], ["bootstrap", "./x"], ["bootstrap", "up"], ["bootstrap", "serve"],
                 ["bootstrap", "status"]):
        assert runlog.start(argv) is not None
        paths.append(runlog.finish(0))
    assert all(p.read_text() == "theirs\n" for p in theirs)
    assert (tmp_path / "20190101T000000.000000Z-.log").exists()
    ours = sorted(p for p in tmp_path.glob("*.log") if runlog.OWN.fullmatch(p.name))
    assert ours == paths[-3:], (ours, paths)
    assert paths[1].name.endswith("-x.log"), paths[1]
