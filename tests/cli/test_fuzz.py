"""A fuzzer that keeps bad input refused in one line (hypothesis).

Generated inventories (random YAML structures; valid inventories with one field replaced by a
hostile value: control characters, rich markup, unicode, huge numbers, deep nesting; raw YAML
text with tags and aliases) go through `validate` and `plan`, and generated argument lists
through the argument parser of every command, in-process. Every outcome must be exit 0, or exit
2 with exactly one printable `error:` line on stderr, never a traceback, never over 2 s, and no
host contacted (SSH connect is a probe: an argument list that gets as far as connecting was
accepted whole, which is also fine).

CI runs a fixed seed (derandomize) with BOOTSTRAP_FUZZ_EXAMPLES examples per property (default
150). For a longer local run:  BOOTSTRAP_FUZZ_EXAMPLES=5000 python3 -m pytest tests/test_fuzz.py
"""
import os
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootstrap.cli import main
from bootstrap.errors import HostUnreachable

EXAMPLES = int(os.environ.get("BOOTSTRAP_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
LIMIT_S = 2.0

WORK = Path(tempfile.mkdtemp(prefix="bootstrap-fuzz-"))


def teardown_module(module):
    import shutil

    shutil.rmtree(WORK, ignore_errors=True)

KEY = WORK / "id_test"
KEY.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n")
KEY.chmod(0o600)

# Strings a hostile user would try: control characters, markup, shell words, unicode, huge numbers.
NASTY = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["[bold]x[/]", "\\[red]", "[", "]", "[/]", "a\nb", "\x1b[31mred", "\x00", "\x07", "\t",
                     "$(touch /tmp/pwned)", "; id", "fe80::1%eth0 --block; id", "::ffff:10.0.0.1", "255.255.255.255",
                     "0.0.0.0", "-rf", "--help", "🙂", "ℕ", "²", "nan", "inf", "-1", "0", "1e309", "9" * 5000,
                     "~/x", "/", "a:b:c", "", " ", "null", "yes", "no", "0x10", "1_000"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), NASTY)
TREE = st.recursive(SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(NASTY, st.integers()), inner, max_size=4)),
    max_leaves=25)

BASE = {"cluster": {"name": "fuzz", "accelerator": "none",
                    "ssh": {"user": "root", "key": str(KEY), "known_hosts": str(WORK / "known_hosts")}},
        "hosts": [{"name": "node1", "address": "192.0.2.1"}, {"name": "node2", "address": "192.0.2.2"}]}
PATHS = [("cluster", "name"), ("cluster", "image"), ("cluster", "env"), ("cluster", "secrets"), ("cluster", "mounts"),
         ("cluster", "hf_cache"), ("cluster", "nofile"), ("cluster", "ports"), ("cluster", "dashboard_host"),
         ("cluster", "ray_args"), ("cluster", "gpus_per_node"), ("cluster", "ssh"), ("hosts", 0, "name"),
         ("hosts", 0, "address"), ("hosts", 1, "ip"), ("hosts", 0, "env"), ("hosts", 1, "role"), ("hosts", 0, "gpus"),
         ("hosts", 1, "jump"), ("hosts",), ("cluster",)]

RAW_YAML = st.sampled_from([
    "cluster: {accelerator: none}\nhosts: [{name: !!int abc, address: 192.0.2.1}]\n",
    "cluster: {accelerator: !!bool maybe}\nhosts: [{name: a, address: 192.0.2.1}]\n",
    "cluster: {nofile: !!float x}\nhosts: [{name: a, address: 192.0.2.1}]\n",
    "cluster: {name: !!timestamp nope}\nhosts: [{name: a, address: 192.0.2.1}]\n",
    "cluster: {nofile: " + "9" * 5000 + "}\nhosts: [{name: a, address: 192.0.2.1}]\n",
    "a: &a [x, x, x, x]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nhosts: [*c, *c]\n",
    "cluster: {name: \"\x07\"}\nhosts: [{name: a, address: 192.0.2.1}]\n",
    "cluster: {name: x}\x00\nhosts: []\n",
    "hosts:\n  - name: a\n\taddress: 192.0.2.1\n",
    "all:\n  children:\n    g: &g {hosts: {h1: {ansible_host: 192.0.2.1}}}\n    h: {children: {g: *g, i: *g}}\n",
    "- just\n- a list\n", "", "{{{{", "cluster: [\n",
])


def _set(doc, path, value):
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _run(args, probe):
    runner = CliRunner()
    t = time.monotonic()
    # in a scratch folder: whatever a generated command writes (a --png of a bench run) stays there
    with runner.isolated_filesystem(temp_dir=WORK):
        r = runner.invoke(main, args, env={"HF_TOKEN": "hf_FUZZSECRET", "BOOTSTRAP_INVENTORY": None})
    took = time.monotonic() - t
    return r, took


def check_outcome(args, r, took, touched):
    where = f"bootstrap {' '.join(map(repr, args))}"
    assert took < LIMIT_S, f"{where}: took {took:.2f}s"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        import traceback
        raise AssertionError(f"{where}: traceback\n{''.join(traceback.format_exception(r.exception))}")
    assert "Traceback" not in r.stderr, f"{where}: {r.stderr[-2000:]}"
    assert "hf_FUZZSECRET" not in r.output + r.stderr
    if touched:
        return "reached"  # every argument was accepted; the probe stopped it at the first connect
    assert r.exit_code in (0, 2), f"{where}: exit {r.exit_code}: {r.stderr[-800:]}"
    if r.exit_code == 2:
        lines = r.stderr.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}: {r.stderr!r}"
        assert lines[0].isprintable(), f"{where}: unprintable: {lines[0]!r}"
    return r.exit_code


@pytest.fixture
def probe(monkeypatch):
    touched = []

    def connect(self):
        touched.append(self.name)
        raise HostUnreachable(self.name, "fuzz probe")
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", connect)
    return touched


def _inventory_outcomes(text: str, probe) -> None:
    path = WORK / "inv.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    for command in ("validate", "plan"):
        probe.clear()
        args = [command, "-i", str(path)]
        r, took = _run(args, probe)
        check_outcome(args, r, took, probe)
        assert not probe, f"{command} contacted a host"


@FUZZ
@given(tree=TREE)
def test_random_yaml_structures_are_refused_in_one_line(tree, probe):
    _inventory_outcomes(yaml.safe_dump(tree, allow_unicode=True), probe)


@FUZZ
@given(path=st.sampled_from(PATHS), value=TREE)
def test_one_hostile_field_in_a_valid_inventory(path, value, probe):
    import copy

    doc = copy.deepcopy(BASE)
    _set(doc, path, value)
    _inventory_outcomes(yaml.safe_dump(doc, allow_unicode=True), probe)


@FUZZ
@given(text=RAW_YAML, junk=st.sampled_from(["", "\x00", "\x07", "\x1b[2J", "[bold]", "\ufeff"]),
       at=st.integers(min_value=0, max_value=80))
def test_raw_yaml_text_with_tags_aliases_and_control_characters(text, junk, at, probe):
    _inventory_outcomes(text[:at] + junk + text[at:], probe)


COMMANDS = {
    "validate": [], "plan": ["--json"], "up": ["--dry-run", "--parallel", "--wait", "--lock-wait", "--json"],
    "status": ["--parallel", "--json"], "down": ["--lock-wait"],
    "check-nccl": ["--sizes", "--iters", "--deadline", "--json"], "doctor": ["--json"],
    "exec": ["--hosts", "--timeout", "--container", "--json"], "logs": ["--tail", "--follow"],
    "serve": ["--tp", "--pp", "--backend", "--wait", "--listen", "--served-model-name", "--dry-run", "--stop"],
    "bench": ["--url", "--model", "-n", "--concurrency", "--max-tokens", "--timeout", "--png", "--json"],
}


@FUZZ
@given(command=st.sampled_from(sorted(COMMANDS)), data=st.data())
def test_generated_argument_lists_are_accepted_or_refused_in_one_line(command, data, probe):
    inv = WORK / "ok.yaml"
    if not inv.exists():
        inv.write_text(yaml.safe_dump(BASE))
    args = [command, "-i", str(inv)] if command != "bench" else [command]
    for _ in range(data.draw(st.integers(min_value=0, max_value=4))):
        opt = data.draw(st.sampled_from(COMMANDS[command] or ["--bogus"]))
        args.append(opt)
        if not opt.startswith("--json") and opt not in ("--dry-run", "--stop", "--container", "--follow"):
            args.append(data.draw(NASTY))
    if command in ("serve", "exec", "logs"):
        args += data.draw(st.lists(NASTY, max_size=3))
    if command == "bench":
        args += ["--url", "http://127.0.0.1:9"]  # nothing listens there: a load would fail fast on loopback
        if "-n" not in args:
            args += ["-n", "1", "--timeout", "0.5"]
    probe.clear()
    r, took = _run(args, probe)
    if command == "bench" and r.exit_code == 1 and not probe:
        return  # a valid bench ran its bounded load against a closed loopback port
    check_outcome(args, r, took, probe)
