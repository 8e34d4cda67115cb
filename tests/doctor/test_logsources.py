"""What `bootstrap logs` and `doctor` read (bootstrap/doctor/logsources.py, pure), the file filter for
--since, the findings per source (signatures.scan_sources), and doctor/run.py's reading of a host's
logs against fake hosts (the real thing: tests/sandbox, test_vllm_failure_shows_... and the fleet's
kill test)."""
import threading
from datetime import datetime, timezone

import pytest

from bootstrap.doctor import logsources as LS
from bootstrap.doctor import run as X
from bootstrap.errors import UsageError
from bootstrap.signatures import scan_sources
from tests.support.fake_hosts import FakeHost, fake_session
from tests.support.fleet_inventories import fleet_yaml, hosts_yaml, load


def single(tmp_path, extra=""):
    return load(tmp_path, "cluster:\n  accelerator: none\n" + extra + hosts_yaml(3), check_files=False)


def where(srcs):
    return [(s.host, s.source, s.container, s.path) for s in srcs]


def test_one_group_reads_each_node_container_and_the_serve_log_inside_it(tmp_path):
    inv = single(tmp_path)
    c = inv.cluster.container_name
    got = LS.candidates(inv)
    assert where(got) == [
        ("h0", "node", c, None), ("h0", "vllm", c, LS.SERVE_LOG), ("h0", "prometheus", f"{c}-prometheus", None),
        ("h1", "node", c, None), ("h1", "vllm", c, LS.SERVE_LOG),
        ("h2", "node", c, None), ("h2", "vllm", c, LS.SERVE_LOG)]
    assert where(LS.candidates(inv, ["h2"], LS.sources_for(["serve"]))) == [("h2", "vllm", c, LS.SERVE_LOG)]


def test_replicas_read_serve_containers_keepers_and_the_router_on_its_host(tmp_path):
    inv = load(tmp_path, fleet_yaml(4, 2, "monitor: {host: h3}"))
    c = inv.cluster.container_name
    got = where(LS.candidates(inv, sources=LS.sources_for(["serve", "router", "monitor"])))
    assert got == [
        ("h0", "vllm", f"{c}-serve", None), ("h0", "keeper", f"{c}-keeper", None),
        ("h0", "router", f"{c}-router", None),
        ("h1", "vllm", f"{c}-serve", None), ("h1", "keeper", f"{c}-keeper", None),
        ("h2", "vllm", f"{c}-serve", None), ("h2", "keeper", f"{c}-keeper", None),
        ("h3", "vllm", f"{c}-serve", None), ("h3", "keeper", f"{c}-keeper", None),
        ("h3", "prometheus", f"{c}-prometheus", None)]


def test_groups_choose_sources_and_an_unknown_group_is_refused():
    assert LS.sources_for([]) == LS.SOURCES
    assert LS.sources_for(["serve"]) == ("vllm", "keeper")
    assert LS.sources_for(["router", "node"]) == ("node", "router")
    with pytest.raises(UsageError, match="unknown log group 'vllm'"):
        LS.sources_for(["vllm"])


def test_present_keeps_what_a_host_holds(tmp_path):
    inv = single(tmp_path)
    c = inv.cluster.container_name
    cands = LS.candidates(inv, ["h0", "h1"], ("node", "vllm"))
    found, missing = LS.present(cands, {"h0": [c], "h1": [c, "other"]}, {"h0": [LS.SERVE_LOG]})
    assert where(found) == [("h0", "node", c, None), ("h0", "vllm", c, LS.SERVE_LOG), ("h1", "node", c, None)]
    assert where(missing) == [("h1", "vllm", c, LS.SERVE_LOG)]
    assert missing[0].describe() == f"vllm on h1 ({LS.SERVE_LOG} in {c})"


@pytest.mark.parametrize("text, back", [("30s", 30), ("10m", 600), ("2h", 7200), ("1d", 86400), ("1.5m", 90)])
def test_since_as_a_duration(text, back):
    assert LS.parse_since(text, 1_000_000.0) == 1_000_000.0 - back


def test_since_as_a_time_is_utc_unless_it_says_otherwise():
    t = datetime(2026, 11, 25, 22, 10, tzinfo=timezone.utc).timestamp()
    assert LS.parse_since("2026-11-25T22:10:00Z", 0) == t
    assert LS.parse_since("2026-11-25T22:10:00", 0) == t
    assert LS.parse_since("2026-11-25T23:10:00+01:00", 0) == t


@pytest.mark.parametrize("bad", ["", "10", "10x", "yesterday", "-5m", "2026-13-01"])
def test_since_that_is_neither_is_refused(bad):
    with pytest.raises(UsageError, match="neither a duration"):
        LS.parse_since(bad, 0)


@pytest.mark.parametrize("bad, words", [
    ("9" * 400 + "s", "goes back before 1970"), ("100000000000d", "goes back before 1970"),
    ("1e3s", "neither a duration"), ("1969-12-31T23:59:59Z", "is before 1970"),
    ("0001-01-01T00:00:00+00:01", "is before 1970"), ("9999-12-31T23:59:59-23:59", "is after 9998"),
])
def test_since_beyond_what_the_hosts_clocks_hold_is_refused(bad, words):
    with pytest.raises(UsageError, match=words) as info:
        LS.parse_since(bad, 1_000_000_000.0)
    assert "\n" not in str(info.value) and len(str(info.value)) < 300
    LS.SinceFilter(LS.parse_since("9998-12-31T00:00:00Z", 0))("INFO 12-31 00:00:00 [a.py:1] x")  # no overflow
    LS.SinceFilter(LS.parse_since("1970-01-01T00:00:00Z", 0))("INFO 01-01 00:00:00 [a.py:1] x")


def test_since_filter_keeps_lines_from_then_and_the_traceback_under_a_kept_line():
    since = datetime(2026, 11, 25, 22, 10, tzinfo=timezone.utc).timestamp()
    lines = [
        "untimed banner before anything",
        "(APIServer pid=7) INFO 11-25 22:09:59 [api_server.py:1] old",
        "Traceback (most recent call last):  (under the old line)",
        "(EngineCore_DP0 pid=9) ERROR 11-25 22:10:00 [core.py:708] ValueError: new",
        "Traceback (most recent call last):  (under the new line)",
        "WARNING 11-25 23:00:01 [x.py:2] later",
    ]
    keep = LS.SinceFilter(since)
    assert [ln for ln in lines if keep(ln)] == lines[3:]


def test_since_filter_puts_december_lines_in_the_year_before_a_january_since():
    since = datetime(2027, 1, 1, 0, 5, tzinfo=timezone.utc).timestamp()
    keep = LS.SinceFilter(since)
    assert not keep("INFO 12-31 23:59:00 [x.py:1] last year")
    assert keep("INFO 01-01 00:06:00 [x.py:1] this year")


def test_a_finding_names_its_source_and_a_cause_in_one_log_hides_its_symptom_in_another():
    vllm = "(APIServer pid=7) ERROR 11-25 22:10:00 [x.py:1] vllm: error: unrecognized arguments: --bogus\n"
    node = "keeper: bootstrap-vllm-serve was Exited (2) 1 second ago: started (204)\n"
    fs = scan_sources({("h0", "node"): "nothing here\n", ("h0", "vllm"): vllm, ("h1", "keeper"): node})
    assert [(f.host, f.source, f.id, f.severity) for f in fs] == [
        ("h0", "vllm", "vllm-bad-argument", "error"), ("h1", "keeper", "serve-container-exited", "warning")]
    assert "--bogus" in fs[0].fix and "exited with code 2" in fs[1].fix
    # the cause in Ray's log (the node container) hides vLLM's symptom on the same host, not on another
    wait = "INFO 11-25 22:10:00 [ray_utils.py:214] Waiting for creating a placement group of specs for 10 seconds.\n"
    cause = "Error: No available node types can fulfill resource request {'node:10.61.0.27': 0.001, 'GPU': 1.0}\n"
    fs = scan_sources({("h0", "node"): cause, ("h0", "vllm"): wait, ("h1", "vllm"): wait})
    assert [(f.host, f.source, f.id) for f in fs] == [
        ("h0", "node", "ray-ip-mismatch"), ("h1", "vllm", "placement-group-wait")]


def _logs_hosts(inv, holds):
    """FakeHosts: each lists its containers; h0's cluster container holds the serve log."""
    c = inv.cluster.container_name
    out = {}
    for h in inv.hosts:
        names = holds.get(h.name, [])
        out[h.name] = FakeHost(h.name, [
            ("docker ps -a --format", (0, "\n".join(names) + "\n", "")),
            (f"docker exec {c} test -f {LS.SERVE_LOG}", (0 if h.name == "h0" else 1, "", "")),
        ])
    return out


class StreamingHost(FakeHost):
    """A FakeHost whose stream_lines answers from a table too: (text in the command, lines, exit)."""

    def __init__(self, name, answers, streams):
        super().__init__(name, answers)
        self.streams = streams

    def stream_lines(self, argv, on_line, *, stop=None):
        import shlex
        cmd = shlex.join(argv)
        self.commands.append(cmd)
        for text, lines, code in self.streams:
            if text in cmd:
                for ln in lines:
                    on_line(ln)
                return code
        raise AssertionError(f"{self.name}: unexpected stream {cmd}")


def test_logs_streams_what_each_host_holds_filters_the_file_by_since_and_names_a_failed_read(tmp_path, monkeypatch):
    inv = single(tmp_path)
    c = inv.cluster.container_name
    base = _logs_hosts(inv, {"h0": [c], "h1": [c], "h2": []})
    since = datetime(2026, 11, 25, 22, 10, tzinfo=timezone.utc).timestamp()
    hosts = {
        "h0": StreamingHost("h0", base["h0"].answers, [
            (f"docker exec {c} tail -n 50 {LS.SERVE_LOG}", ["INFO 11-25 22:00:00 [a.py:1] before",
                                                          "ERROR 11-25 22:11:00 [a.py:1] after"], 0),
            (f"docker logs --tail 50 --since {since:.3f} {c}", ["ray line"], 0)]),
        "h1": StreamingHost("h1", base["h1"].answers, [(f"docker logs --tail 50 --since {since:.3f} {c}", [], 1)]),
        "h2": StreamingHost("h2", base["h2"].answers, []),
    }
    monkeypatch.setattr(X, "Session", lambda inv, **kw: fake_session(inv, hosts, **kw))
    got, lock = [], threading.Lock()

    def emit(src, line):
        with lock:
            got.append((src.host, src.source, line))
    res = X.logs(inv, emit, sources=("node", "vllm"), tail=50, since=since)
    assert sorted(got) == [("h0", "node", "ray line"), ("h0", "vllm", "ERROR 11-25 22:11:00 [a.py:1] after")]
    assert where(res.read) == [("h0", "node", c, None), ("h0", "vllm", c, LS.SERVE_LOG), ("h1", "node", c, None)]
    assert where(res.absent) == [("h1", "vllm", c, LS.SERVE_LOG), ("h2", "node", c, None),
                                 ("h2", "vllm", c, LS.SERVE_LOG)]
    assert res.failed == {f"node on h1 (container {c})": "the reading command exited 1"}


def test_doctor_reads_vllms_log_and_the_keeper_beside_the_node_container(tmp_path):
    inv = load(tmp_path, fleet_yaml(2, 2))
    c = inv.cluster.container_name
    h = FakeHost("h0", [
        ("docker ps -a --format", (0, f"{c}\n{c}-serve\n{c}-keeper\n{c}-router\n", "")),
        (f"docker logs --tail 100 {c}-serve", (0, "", "vllm: error: unrecognized arguments: --bogus\n")),
        (f"docker logs --tail 100 {c}-keeper", (0, "keeper: x was Exited (137) 1 second ago: started (204)\n", "")),
        (f"docker logs --tail 100 {c}-router", (0, "router up\n", "")),
    ])
    sess = fake_session(inv, {"h0": h, "h1": FakeHost("h1")})
    logs = X._service_logs(sess, inv.host("h0"), 100)
    assert logs == {"vllm": "vllm: error: unrecognized arguments: --bogus\n",
                    "keeper": "keeper: x was Exited (137) 1 second ago: started (204)\n", "router": "router up\n"}
    fs = scan_sources({("h0", s): t for s, t in logs.items()})
    assert [(f.source, f.id) for f in fs] == [("vllm", "vllm-bad-argument"), ("keeper", "serve-container-exited")]


def test_a_pools_vllm_logs_name_their_model_and_logs_model_picks_its_hosts(tmp_path):
    """In a pool (models:) each host's vLLM source carries the model its replica serves (`vllm[coder]`
    on each line, "model" in --json); `logs --model NAME` reads that model's hosts only; an idle host's
    vLLM names none."""
    from click.testing import CliRunner

    from bootstrap import face
    from bootstrap.cli import main
    from tests.fleet.test_pool import pool_yaml
    from tests.support.fleet_inventories import write

    inv = load(tmp_path, pool_yaml(5))
    vllm = [(s.host, s.label) for s in LS.candidates(inv, sources=["vllm"])]
    assert vllm == [("h0", "vllm[chat]"), ("h1", "vllm[chat]"), ("h2", "vllm[coder]"), ("h3", "vllm[coder]"),
                    ("h4", "vllm")]
    assert LS.candidates(inv, ["h2"], ["vllm"])[0].describe() == "vllm[coder] on h2 (container bootstrap-vllm-serve)"
    assert face.model_hosts(inv, "coder") == ("h2", "h3")
    assert face.model_hosts(inv, "chat", ("h1",)) == ("h1",)
    path = write(tmp_path, pool_yaml(5))
    # issue 68.5: a host named beside --model that serves no replica of it is refused, not dropped (c7795f8
    # read h1 alone for `--model chat h1 h3`)
    for args, words in ((["--model", "nope"], "--model: 'nope' is not a model of"),
                        (["--model", "chat", "h3"], "--model: h3 serves no replica of chat (its hosts: h0, h1)"),
                        (["--model", "chat", "h1", "h3"], "--model: h3 serves no replica of chat (its hosts: h0, h1)"),
                        (["--model", "chat", "h2", "h3"], "--model: h2, h3 serve no replica of chat")):
        r = CliRunner().invoke(main, ["logs", "-i", str(path), *args])
        assert r.exit_code == 2 and words in r.output, r.output
    (tmp_path / "single").mkdir()
    plain = write(tmp_path / "single", "cluster:\n  accelerator: none\n" + hosts_yaml(2))
    r = CliRunner().invoke(main, ["logs", "-i", str(plain), "--model", "chat"])
    assert r.exit_code == 2 and "has no models: section; name the hosts instead" in r.output, r.output
