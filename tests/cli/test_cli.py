"""The CLI as a user meets it: help everywhere, documented commands, one-line errors, exit codes."""
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from bootstrap.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: where every command is documented with its example: the commands page of the site
COMMANDS_PAGE = (ROOT / "docs" / "commands.md").read_text()


def commands(group=main, prefix=()):
    for name, cmd in group.commands.items():
        path = prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from commands(cmd, path)
        else:
            yield path, cmd


@pytest.mark.parametrize("path,cmd", list(commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_command_has_help_with_an_example_and_is_on_the_commands_page(path, cmd):
    assert cmd.help and "Example:" in cmd.help, path
    assert f"bootstrap {' '.join(path)}" in COMMANDS_PAGE, path


@pytest.mark.parametrize("path,cmd", list(commands()), ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_every_option_says_what_it_does(path, cmd):
    """A newcomer reads `--help`: no option is a bare name and a type."""
    bare = [p.opts[-1] for p in cmd.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert bare == [], f"bootstrap {' '.join(path)}: options without help: {bare}"


def test_serve_help_states_the_defaults_the_planner_uses():
    r = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    text = " ".join(r.output.split())
    assert "default: GPUs per node)" not in text  # what --tp said, and not what serve does
    assert "the split the planner picks from the model and the cluster" in text


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, capture_output=True,
                          text=True, env=env, timeout=60)


def test_missing_inventory_is_one_line_exit_2(tmp_path):
    r = run("validate", "-i", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "nope.yaml" in r.stderr and "Traceback" not in r.stderr


EXAMPLES = ("inventory/example.yaml", "inventory/ansible-hosts.yaml", "inventory/fleet.yaml", "inventory/pd.yaml")


def test_example_inventories_validate_offline_in_plan():
    for f in EXAMPLES:
        r = run("plan", "-i", f, "--json")
        assert r.returncode == 0, r.stderr
        assert "VLLM_HOST_IP=198.51.100.11" in r.stdout


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_inventories_validate_given_their_secrets_and_key_files(example, tmp_path):
    """What a user meets first: `validate` on each example passes once its key file exists and its
    secrets are exported; they set no runtime (it follows the image) and name a current image."""
    import yaml

    key = tmp_path / "id_ed25519"
    key.write_text("k")
    key.chmod(0o600)
    text = (ROOT / example).read_text()
    assert "~/.ssh/id_ed25519" in text
    path = tmp_path / Path(example).name
    path.write_text(text.replace("~/.ssh/id_ed25519", str(key)))
    env = {**os.environ, "HF_TOKEN": "hf_EXAMPLE", "FLEET_KEY": "fleet-example"}
    r = subprocess.run([sys.executable, "-m", "bootstrap", "validate", "-i", str(path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"{path}: ok: "), r.stderr
    doc = yaml.safe_load(text)
    cluster = doc.get("cluster") or doc["all"]["vars"]["bootstrap"]
    assert "runtime" not in cluster


#: An image of vLLM with its version in the tag: vllm/vllm-openai:v0.32.0, .../vllm-openai-router:v0.11
VLLM_IMAGE = re.compile(r"vllm-openai[\w.-]*:v?(\d+)\.(\d+)(?:\.(\d+))?")


def test_no_example_or_snippet_names_a_vllm_image_older_than_the_sandboxs():
    from bootstrap.sandbox.recipes import VLLM_VERSION

    floor = tuple(int(x) for x in VLLM_VERSION.split("."))
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "inventory").glob("*")),
             *sorted((ROOT / "bootstrap").rglob("*.py")), ROOT / "scripts" / "run_cluster.sh"]
    seen, old = 0, []
    for f in files:
        for m in VLLM_IMAGE.finditer(f.read_text()):
            seen += 1
            version = tuple(int(x or 0) for x in m.groups())
            if version < floor:
                old.append(f"{f.relative_to(ROOT)}: {m.group(0)}")
    assert seen >= 4 and old == [], old


CORPUS = sorted((ROOT / "tests" / "inventory_corpus").glob("*.yaml"))


@pytest.mark.parametrize("source", CORPUS, ids=lambda p: p.stem)
def test_every_malformed_inventory_is_one_line_exit_2_through_the_cli(source, tmp_path, monkeypatch):
    from click.testing import CliRunner

    touched = []
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", lambda self: touched.append(self.name))

    key = tmp_path / "id_0644"
    key.write_text("not really a key\n")
    key.chmod(0o644)
    path = tmp_path / source.name
    raw = source.read_bytes()
    path.write_bytes(raw.replace(b"@KEY_0644@", str(key).encode()))
    from bootstrap.inventory.envvars import looks_like_credential

    expect = raw.split(b"\n")[0][len(b"# expect: "):].decode()
    third = raw.split(b"\n")[2]
    field = third[len(b"# field: "):].decode().strip() if third.startswith(b"# field: ") else None
    for command in ("validate", "up", "down"):
        # MYKEY set: a file whose one mistake is elsewhere lists only it (validate names every unset secret too)
        r = CliRunner().invoke(main, [command, "-i", str(path)], env={"HF_TOKEN": "hf_TOPSECRET", "MYKEY": "mk-1"})
        assert r.exit_code == 2, r.output
        assert r.stdout == ""
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0]
        assert field is None or f": {field}: " in lines[0], lines[0]
        assert "Traceback" not in r.stderr and "hf_TOPSECRET" not in r.stderr
        # a credential in the inventory (a password in a URL, a token) is never printed
        assert "Hunter2pw" not in r.stderr and not looks_like_credential(r.stderr.replace("***", "")), r.stderr
    assert touched == []  # no host was contacted


def test_shell_metacharacters_in_an_image_name_are_rejected_before_any_host(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("cluster: {accelerator: none, image: 'vllm;touch /tmp/pwned'}\n"
                   "hosts: [{name: a, address: 192.0.2.1}]\n")
    r = run("up", "-i", str(inv))
    assert r.returncode == 2 and "cluster.image" in r.stderr and r.stderr.count("\n") == 1


def test_control_a_valid_inventory_does_reach_the_hosts(tmp_path, monkeypatch):
    """The positive control for the corpus test above: the connect probe does fire."""
    from click.testing import CliRunner

    from bootstrap.errors import HostUnreachable

    touched = []

    def connect(self):
        touched.append(self.name)
        raise HostUnreachable(self.name, "probe")
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", connect)
    inv = tmp_path / "ok.yaml"
    inv.write_text("cluster: {accelerator: none}\n"
                   "hosts: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2}]\n")
    r = CliRunner().invoke(main, ["up", "-i", str(inv)])
    assert r.exit_code == 3 and sorted(touched) == ["a", "b"], r.output


# -- markup and control characters: whatever a user, an inventory or a host supplies is printed
# literally (rich would read `[bold]` as a style and raise on a lone `[/]`), on its own line

MARKUP_INVENTORY = r"""cluster:
  name: markup
  accelerator: none
  env:
    A: "[bold]x[/]"
    B: "[/]"
    C: '\[red]y'
    D: 'tail\'
    E: "esc \e[31m red"
    F: ":smile: [link=http://x]y[/link]"
  ray_args: ["--x=[/]"]
hosts:
  - {name: node1, address: 192.0.2.1, env: {G: "[/bold]", H: "two\nlines"}}
  - {name: node2, address: 192.0.2.2}
"""


def test_markup_and_escapes_in_a_valid_inventory_and_its_path_are_printed_literally(tmp_path):
    folder = tmp_path / "[x]"
    folder.mkdir()
    inv = folder / "hosts [bold].yaml"
    inv.write_text(MARKUP_INVENTORY)
    r = run("validate", "-i", str(inv))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == f"{inv}: ok: 2 host(s), head node1 (192.0.2.1)\n"
    r = run("plan", "-i", str(inv))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    for shown in ("-e 'A=[bold]x[/]'", "-e 'B=[/]'", "-e 'C=\\[red]y'", "-e 'D=tail\\'",
                  "-e 'E=esc \\x1b[31m red'", "-e 'F=:smile: [link=http://x]y[/link]'", "-e 'G=[/bold]'",
                  "-e 'H=two\\nlines'", "'--x=[/]'"):
        assert shown in r.stdout, shown
    # the runtime line (cluster.runtime unset), the table (its header and a row per host), the head's line
    # and its whole command, the worker's line (what differs from the head's) (issue 51.8: was a line and a
    # whole command per host)
    assert "\x1b" not in r.stdout and len(r.stdout.splitlines()) == 7
    r = run("plan", "-i", str(inv), "--json")
    assert r.returncode == 0 and "A=[bold]x[/]" in r.stdout and "H=two\\nlines" in r.stdout


@pytest.mark.parametrize("field,value", [("name", "a[/]b"), ("name", "[bold]x"), ("name", "esc\x1b[2Jx"),
                                         ("cluster", "[/]"), ("cluster", "x\\[red]")])
def test_markup_in_a_refused_name_is_one_literal_line(tmp_path, field, value):
    host, cluster = (value, "ok") if field == "name" else ("node1", value)
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"cluster: {{name: {json.dumps(cluster)}, accelerator: none}}\n"
                   f"hosts: [{{name: {json.dumps(host)}, address: 192.0.2.1}}]\n")
    r = run("validate", "-i", str(inv))
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].isprintable(), r.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr
    assert repr(value)[1:-1] in lines[0]  # as repr shows it: markup literal, ESC as \x1b


NASTY = ["[bold]x[/]", "[/]", "\\[red]", "\\\\[red]", "a\\", "a\\\\", "a\\\\\\", "[", "]", "[1]", "\\[1", "[x]",
         ":smile:", "a\nb", "\x1b[31mred", "\x00", "\udcff", "\u2028", "x[/]\\", "[link=http://x]y[/link]"]


@pytest.mark.parametrize("value", NASTY)
def test_escape_prints_any_value_literally_in_any_markup(value):
    from bootstrap.cli.render import _escape

    con = Console(file=io.StringIO(), highlight=False, emoji=False, width=300, soft_wrap=True)
    shown = value.encode("unicode_escape").decode("ascii") if not value.isprintable() else value
    e = _escape(value)
    for template, expect in (("{}", shown), ("[red]{}[/]", shown), ("a {} [bold]b[/] c", f"a {shown} b c"),
                             ("[dim]{}[/] {}", f"{shown} {shown}")):
        con.file = io.StringIO()
        con.print(template.format(e, e), end="")
        assert con.file.getvalue() == expect, (template, e)
    t = Table()
    t.add_column("c")
    t.add_row(e)
    con.file = io.StringIO()
    con.print(t)
    assert shown in con.file.getvalue()


def test_escape_keeps_the_lines_of_a_report_and_nothing_else():
    from bootstrap.cli.render import _escape

    assert _escape("a\tb\r\nc\x1b[0m[/]", lines=True, markup=False) == "a\tb\nc\\x1b[0m[/]"
    assert _escape("a\tb\nc[/]", markup=False) == "a\\tb\\nc[/]"
    assert _escape("a\tb\nc[/]", lines=True) == "a\tb\nc\\[/]"


def test_remote_text_in_the_status_table_is_literal(tmp_path, monkeypatch):
    """Container states and errors come from the hosts: shown as they are, a newline as \\n."""
    from click.testing import CliRunner

    from bootstrap.cluster.run import ClusterStatus, NodeStatus

    inv = tmp_path / "ok.yaml"
    inv.write_text("cluster: {accelerator: none}\n"
                   "hosts: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2}]\n")
    rows = [NodeStatus("a", "192.0.2.1", "head", True, "[bold]running[/]", False, 0.0, "x[/]\n\x1b[2Jcleared"),
            NodeStatus("b", "192.0.2.2", "worker", False, "unknown", False, 0.0, "\\[red]down")]
    monkeypatch.setattr("bootstrap.cluster.run.cluster_status",
                        lambda inv, parallel, serving: ClusterStatus(rows, None, None))
    monkeypatch.setattr("bootstrap.monitor.run.running_url", lambda inv: None)  # never dial 192.0.2.1
    r = CliRunner().invoke(main, ["status", "-i", str(inv)])
    assert r.exit_code == 1 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert "[bold]running[/]" in r.stdout and "x[/]\\n\\x1b[2Jcleared" in r.stdout and "\\[red]down" in r.stdout
    assert "\x1b" not in r.stdout


def test_status_says_unknown_where_nobody_could_tell_never_no(tmp_path, monkeypatch):
    """Issue 67: a host that did not answer, or Ray's view unread on the head, is "unknown" in the ray and
    GPUs columns (and serving "unknown" with the reason), never "no" / "-" / "nothing"."""
    from bootstrap.cluster.run import ClusterStatus, NodeStatus

    inv = tmp_path / "ok.yaml"
    inv.write_text("cluster: {accelerator: none, runtime: ray}\n"
                   "hosts: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2}]\n")
    rows = [NodeStatus("a", "192.0.2.1", "head", False, "unknown", False, 0.0, "cannot connect over SSH"),
            NodeStatus("b", "192.0.2.2", "worker", True, "running", False, 0.0, "")]
    monkeypatch.setattr("bootstrap.monitor.run.running_url", lambda inv: None)  # never dial 192.0.2.1

    def table(st):
        monkeypatch.setattr("bootstrap.cluster.run.cluster_status", lambda inv, parallel, serving: st)
        r = CliRunner().invoke(main, ["status", "-i", str(inv)], terminal_width=200)
        cells = [[c.strip() for c in ln.split("│")[1:-1]] for ln in r.stdout.splitlines() if ln.startswith("│")]
        return {c[0]: c for c in cells}, r
    rows_of, r = table(ClusterStatus(rows, None, None, "ray", ray_error="the head did not answer",
                                     serving_error="the head did not answer"))
    assert rows_of["a"][4:6] == ["unknown", "?"] and rows_of["b"][4:6] == ["unknown", "?"], r.stdout
    assert "serving: unknown: the head did not answer" in r.stdout and "serving: nothing" not in r.stdout
    rows_of, r = table(ClusterStatus(rows, None, None, "ray"))  # Ray read: b is known not to be in it
    assert rows_of["a"][4:6] == ["unknown", "?"] and rows_of["b"][4:6] == ["no", "-"], r.stdout


def test_a_domain_error_with_markup_and_newlines_is_one_literal_line(capsys):
    from bootstrap.cli import _fail
    from bootstrap.errors import UsageError

    with pytest.raises(SystemExit) as e:
        _fail(UsageError("bad [bold]value[/] in\n'\\[x]'\x1b[2J"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: bad [bold]value[/] in\\n'\\[x]'\\x1b[2J\n"


def test_the_progress_line_shows_host_and_detail_literally():
    from bootstrap.cli import LineReporter

    con = Console(file=io.StringIO(), highlight=False, emoji=False, width=300, soft_wrap=True)
    LineReporter(console=con).event("n[/]", "connect", "failed", "reason [bold]x\\\n[/]")
    line = con.file.getvalue()
    assert line.count("\n") == 1 and "n[/]" in line and "reason [bold]x\\\\n[/]" in line


def test_bench_png_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    """matplotlib is an extra: --png without it is one usage line naming what to install, before
    any host is contacted."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    inv = tmp_path / "hosts.yaml"
    inv.write_text("cluster: {accelerator: none}\nhosts: [{name: a, address: 192.0.2.1}]\n")
    r = CliRunner().invoke(main, ["bench", "-i", str(inv), "--png", str(tmp_path / "out.png")])
    assert r.exit_code == 2, r.output
    assert "pip install matplotlib, or pip install '.[png]' in the clone" in r.output and "Traceback" not in r.output


def test_the_kv_cache_line_is_figures_not_vllms_log_line():
    """Seen on the main job: `KV cache: 524,288 tokens ((EngineCore pid=595) INFO ... Maximum concurrency)`."""
    from bootstrap.cli.render import kv_line
    from bootstrap.serve.kvlog import kv_capacity

    log = ("(EngineCore pid=595) INFO 11-25 10:00:00 [kv_cache_utils.py:1087] CPU KV cache size: 524,288 tokens\n"
           "(EngineCore pid=595) INFO 11-25 10:00:00 [kv_cache_utils.py:1091] Maximum concurrency for 256 tokens "
           "per request: 2048.00x\n")
    assert kv_line(kv_capacity(log)) == "KV cache: 524,288 tokens (2048 requests of 256 tokens at once)"
    assert kv_line(kv_capacity(log.splitlines()[0])) == "KV cache: 524,288 tokens"


def test_the_root_help_groups_every_command_and_lists_the_exit_codes():
    from click.testing import CliRunner

    from bootstrap.cli import EXIT_MEANINGS, SECTIONS
    from bootstrap.errors import ExitStatus

    placed = [n for _, names in SECTIONS for n in names]
    assert sorted(placed) == sorted(main.commands) and len(set(placed)) == len(placed)
    out = CliRunner().invoke(main, ["--help"]).output
    for title, names in SECTIONS:
        assert f"\n{title}:\n" in out and all(f"  {n}  " in out for n in names), title
    assert "\nother:" not in out
    for status in ExitStatus:
        assert f"  {int(status):<3}  {EXIT_MEANINGS[status]}"[:40] in out, status
    assert "_BOOTSTRAP_COMPLETE=bash_source bootstrap" in out


def test_shell_completion_completes_command_names(monkeypatch):
    import subprocess
    import sys

    env = {"COMP_WORDS": "bootstrap lo", "COMP_CWORD": "1", "_BOOTSTRAP_COMPLETE": "bash_complete"}
    r = subprocess.run([sys.executable, "-m", "bootstrap"], cwd=ROOT, capture_output=True, text=True,
                       env={**__import__("os").environ, **env}, timeout=60)
    assert r.returncode == 0 and r.stdout.split() == ["plain,logs"], (r.stdout, r.stderr)


#: Commands that read the inventory but contact no host (no SSH: no host keys, no parallelism).
OFFLINE = {("validate",), ("plan",), ("sudoers",)}
#: Commands that look at every host at once by design: a live view (top) or one endpoint (bench).
ALL_AT_ONCE = {("top",), ("bench",)}


@pytest.mark.parametrize("path,cmd", [(p, c) for p, c in commands() if p[0] != "sandbox"],
                         ids=lambda x: " ".join(x) if isinstance(x, tuple) else "")
def test_options_that_mean_the_same_are_on_every_command_that_needs_them(path, cmd):
    opts = {o for p in cmd.params for o in p.opts}
    assert {"-i", "--inventory"} <= opts, path
    if path in OFFLINE:
        assert "--accept-new-host-keys" not in opts and "--parallel" not in opts
        return
    assert {"--accept-new-host-keys", "--json"} <= opts, path
    assert ("--parallel" in opts) == (path not in ALL_AT_ONCE), path


def test_accept_new_host_keys_reaches_the_inventory_every_session_reads(tmp_path):
    from click.testing import CliRunner

    from bootstrap.cli.params import accept_keys_option, inventory_option, read_inventory

    inv_file = tmp_path / "hosts.yaml"
    inv_file.write_text("cluster: {accelerator: none}\nhosts:\n  - {name: a, address: 10.0.0.1}\n")
    seen = []

    @click.command()
    @inventory_option
    @accept_keys_option
    def probe(inventory):
        seen.append(read_inventory(inventory, check_files=False).cluster.ssh.accept_new_host_keys)

    assert CliRunner().invoke(probe, ["-i", str(inv_file)]).exit_code == 0
    assert CliRunner().invoke(probe, ["-i", str(inv_file), "--accept-new-host-keys"]).exit_code == 0
    assert seen == [False, True]


def test_down_prints_each_group_and_its_json_lists_them(capsys):
    import json

    from bootstrap.cli import render
    from bootstrap.cluster.run import DownResult

    groups = [DownResult(("n2", "n1"), ()), DownResult(("n4",), ("n3",))]
    render.down_result(groups, False, fleet={"n1": ("bootstrap-vllm-keeper",)})
    out = capsys.readouterr().out.splitlines()
    assert out == ["removed the serve containers, the router and the keepers of 2 replicas",
                   "removed the container on 2 host(s): n2, n1", "removed the container on 1 host(s): n4",
                   "nothing to remove on 1 host(s): n3"]
    render.down_result(groups, True)
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"groups": [{"removed": ["n2", "n1"], "absent": []}, {"removed": ["n4"], "absent": ["n3"]}]}


@pytest.mark.parametrize("env,says", [
    ({"BOOTSTRAP_SANDBOX_SUBNET": "not-a-net"}, "(BOOTSTRAP_SANDBOX_SUBNET) is not an IPv4 network"),
    ({"BOOTSTRAP_SANDBOX_SUBNET": "172.31.250.0/30"}, "set BOOTSTRAP_SANDBOX_SUBNET to a larger network"),
    ({"BOOTSTRAP_SANDBOX_REGISTRY_PORT": "99999"}, "BOOTSTRAP_SANDBOX_REGISTRY_PORT='99999' is not a port number"),
])
def test_a_bad_environment_variable_is_bad_input_exit_2_before_anything_starts(env, says):
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "bootstrap", "sandbox", "up", "--nodes", "3"], capture_output=True,
                       text=True, timeout=60, env={**os.environ, **env})
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr


def test_a_forced_split_that_one_replica_of_several_sizes_cannot_hold_is_refused_before_any_host(tmp_path):
    """Replicas of 1 and 2 nodes: --tp 2 fits the second and not the first; one line says which and
    how to have each replica planned for its own nodes (nothing is contacted: the address is unused)."""
    inv = tmp_path / "uneven.yaml"
    inv.write_text("cluster:\n  accelerator: none\n  replicas: 2\n  router:\n    prefill: [0]\nhosts:\n"
                   "  - {name: p, address: 192.0.2.1, replica: 0}\n  - {name: d1, address: 192.0.2.2, replica: 1}\n"
                   "  - {name: d2, address: 192.0.2.3, replica: 1}\n")
    r = run("serve", "-i", str(inv), "org/model", "--tp", "2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--tp/--pp: TP 2 x PP 1 = 2 workers, but the CPU cluster has 1 node(s)" in r.stderr
    assert "the replicas have 1/2 nodes: leave them out to have each replica's split planned" in r.stderr


def test_the_help_lists_every_commands_summary_whole():
    """Issue 67: every summary in `bootstrap --help` (and a group's) was cut with "..." at the terminal's width."""
    from click.testing import CliRunner

    for argv in (["--help"], ["monitor", "--help"], ["sandbox", "--help"]):
        out = CliRunner().invoke(main, argv, terminal_width=80).output
        cut = [ln for ln in out.splitlines() if ln.rstrip().endswith("...") and not ln.startswith("Usage:")]
        assert out.count("\n") > 10 and not cut, out
