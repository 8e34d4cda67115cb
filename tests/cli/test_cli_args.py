"""Bad command-line arguments: one line on stderr naming the option and the value, exit 2, no host
contacted. The cases are in tests/args_corpus.yaml; the inventories here are valid and point at
unreachable TEST-NET addresses (192.0.2.x), so an argument that slipped through would try SSH and
end with exit 3 instead. The line is printable: a newline or ESC in a value is shown escaped."""
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml

from bootstrap.errors import ServePlanError
from bootstrap.inventory.envvars import looks_like_credential
from bootstrap.serve import run as V
from bootstrap.serve.argv import native_serve_argvs, ray_serve_argv
from bootstrap.serve.flags import check_model_ref
from bootstrap.serve.split import Parallelism

ROOT = Path(__file__).resolve().parents[2]
CORPUS = yaml.safe_load((ROOT / "tests" / "args_corpus.yaml").read_text())
FAST = 20.0


def write_inventory(tmp_path: Path, name: str, cluster: str, hosts: int = 2) -> Path:
    key = tmp_path / "id_test"
    if not key.exists():
        key.write_text("not really a key\n")
        key.chmod(0o600)
        (tmp_path / "known_hosts").write_text("")
    inv = tmp_path / name
    inv.write_text(
        f"cluster:\n  name: args\n  {cluster}\n"
        f"  ssh: {{user: root, key: {key}, known_hosts: {tmp_path / 'known_hosts'}, "
        "connect_timeout: 1, connect_retries: 0}\n"
        "hosts:\n" + "".join(f"  - {{name: node{k}, address: 192.0.2.{k}}}\n" for k in range(1, hosts + 1)))
    return inv


@pytest.fixture
def subst(tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    table = {"@INV@": str(write_inventory(tmp_path, "cpu.yaml", "accelerator: none")),
             "@GPU@": str(write_inventory(tmp_path, "gpu.yaml", "accelerator: gpu\n  gpus_per_node: 8")),
             # a fleet of 2 replicas, and one disaggregated (replica 0 prefills)
             "@FLEET@": str(write_inventory(tmp_path, "fleet.yaml", "accelerator: none\n  replicas: 2", hosts=4)),
             "@PD@": str(write_inventory(tmp_path, "pd.yaml", "accelerator: none\n  replicas: 2\n"
                                         "  router: {prefill: [0]}", hosts=4)),
             "@TMP@": str(scratch), "@HUGE@": "4" * 5000}

    def apply(args):
        out = []
        for a in args:
            for k, v in table.items():
                a = a.replace(k, v)
            out.append(a)
        return out
    return apply


def cli(*args, timeout=60, env=None):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "bootstrap", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=env)
    return r, time.monotonic() - t0


def test_the_corpus_is_big_enough_and_well_formed():
    assert len(CORPUS) >= 127
    for case in CORPUS:
        assert set(case) == {"args", "exit", "message"}, case
        assert case["exit"] == 2 and case["message"] and all(isinstance(a, str) for a in case["args"]), case


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: " ".join(c["args"])[:80])
def test_bad_argument_is_one_line_exit_2_before_any_host(case, subst):
    r, took = cli(*subst(case["args"]))
    lines = r.stderr.splitlines()
    assert r.returncode == case["exit"], r.stderr
    assert len(lines) == 1 and lines[0].strip() and lines[0].isprintable(), r.stderr
    assert lines[0].startswith("error: ") and case["message"] in lines[0], lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert "Hunter2pw" not in r.stderr  # a password in a URL is never echoed
    assert not looks_like_credential(r.stderr.replace("***", "")), r.stderr  # nor a token
    assert took < FAST, f"took {took:.1f}s: was a host contacted?"


@pytest.mark.parametrize("value,message", [
    ("/nope.yaml", "status: $BOOTSTRAP_INVENTORY: /nope.yaml: no such file (bootstrap status --help)"),
    ("/tmp/", "status: $BOOTSTRAP_INVENTORY: /tmp/: is a directory, not an inventory file"),
    ("/nope\n[bold]x[/].yaml", "status: $BOOTSTRAP_INVENTORY: /nope\\n[bold]x[/].yaml: no such file"),
])
def test_an_inventory_named_by_the_environment_is_named_in_the_error(value, message):
    r, took = cli("status", env=dict(os.environ, BOOTSTRAP_INVENTORY=value))
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].isprintable(), r.stderr
    assert lines[0].startswith("error: ") and message in lines[0] and took < FAST


def test_no_inventory_at_all_names_the_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BOOTSTRAP_INVENTORY"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "bootstrap", "down"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("error: down: no inventory: pass -i FILE, set BOOTSTRAP_INVENTORY, or create "
                                "./hosts.yaml (bootstrap down --help)")


# -- positive controls: the same harness sees success, and a good argument does reach the hosts

def test_valid_inventory_validates_and_plans(subst):
    r, _ = cli(*subst(["validate", "-i", "@INV@"]))
    assert r.returncode == 0 and "ok: 2 host(s)" in r.stdout, r.stderr
    r, _ = cli(*subst(["plan", "-i", "@GPU@", "--json"]))
    assert r.returncode == 0 and "VLLM_HOST_IP=192.0.2.2" in r.stdout, r.stderr


def test_help_and_version_still_work():
    r, _ = cli("--version")
    assert r.returncode == 0 and "version" in r.stdout
    r, _ = cli("serve", "--help")
    assert r.returncode == 0 and "Usage: bootstrap serve" in r.stdout and r.stderr == ""
    r, _ = cli("-h")
    assert r.returncode == 0 and "check-nccl" in r.stdout


def test_good_values_of_the_checked_options_reach_the_hosts(subst):
    """A trailing comma in --hosts, the smallest --timeout, 0 for --lock-wait: accepted, so SSH is
    tried (and only on the host selected)."""
    r, took = cli(*subst(["exec", "-i", "@INV@", "--hosts", "node2,", "--timeout", "0.1", "--", "true"]))
    assert r.returncode == 1 and "unreachable: node2" in r.stderr and "node1" not in r.stderr, r.stderr
    r, took = cli(*subst(["down", "-i", "@INV@", "--lock-wait", "0", "--yes"]))
    assert r.returncode == 3 and "cannot connect over SSH" in r.stderr, r.stderr


def test_a_model_path_with_spaces_is_not_an_argument_error(subst):
    """Legal arguments pass validation and go on to SSH: the unreachable hosts give exit 3."""
    r, took = cli(*subst(["serve", "-i", "@INV@", "/models/my model", "--tp", "2", "--", "--max-model-len", "256"]))
    assert r.returncode == 3, r.stderr
    assert "cannot connect over SSH" in r.stderr and "Traceback" not in r.stderr
    assert took < FAST


def test_a_usage_error_through_the_click_runner_is_one_line_too(subst):
    from click.testing import CliRunner

    from bootstrap.cli import main

    r = CliRunner().invoke(main, ["up", "-i", subst(["@INV@"])[0], "--parallel", "0"])
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: up: --parallel: 0 is not in the range 1<=x<=1024 (bootstrap up --help)"


# -- pure: a model path with spaces is one argv element from the plan to the container

SPACED = "/models/my model (v2)"


def test_spaced_model_path_is_one_element_of_the_ray_argv():
    check_model_ref(SPACED)
    argv = ray_serve_argv(SPACED, Parallelism(2, 1, 2), port=8000, host="10.0.0.1", extra=("--max-model-len", "256"))
    assert argv[:3] == ("vllm", "serve", SPACED)
    assert argv.count(SPACED) == 1 and argv[-2:] == ("--max-model-len", "256")


def test_spaced_model_path_is_one_element_of_every_native_argv_and_survives_the_shell():
    argvs = native_serve_argvs(SPACED, Parallelism(2, 1, 2), ["10.0.0.1", "10.0.0.2"], port=8000, host="10.0.0.1",
                               master_port=29501)
    for argv in argvs:
        assert argv[2] == SPACED
        cmd = V._detached("vllm-node", argv)
        # The transport sends shlex.join(argv) to the remote shell; `sh -c ... "$@"` re-expands it.
        assert shlex.split(shlex.join(cmd)) == list(cmd)
        assert cmd[-len(argv):] == argv
    echo = ("sh", "-c", 'for a in "$@"; do printf "%s\\n" "$a"; done', "sh", *argvs[0])
    out = subprocess.run(["sh", "-c", shlex.join(echo)], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == list(argvs[0])


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-405B-Instruct", "gpt2", "Qwen/Qwen2.5-0.5B-Instruct",
                                   "/models/llama", "/opt/models/tiny-llama", "/m/with space"])
def test_good_model_references(model):
    check_model_ref(model)


@pytest.mark.parametrize("model,why", [("", "no model"), ("./m", "relative"), ("../m", "relative"),
                                       ("~/m", "relative"), (".", "relative"), ("my model", "neither"),
                                       ("org/name/extra", "neither"), ("org--x/y", "neither"),
                                       ("/m\nx", "control character")])
def test_bad_model_references(model, why):
    with pytest.raises(ServePlanError, match=why):
        check_model_ref(model)



def _string_params():
    """(words, spelling, plain) of every option and argument of the CLI that takes a string as it is
    (plain: it has no check of its own, Text's message is the one)."""
    import click

    from bootstrap.cli import main
    from bootstrap.cli.params import OWN_EMPTY_CHECK, Text

    def walk(group, path=()):
        for name, cmd in sorted(group.commands.items()):
            if isinstance(cmd, click.Group):
                yield from walk(cmd, (*path, name))
            else:
                yield (*path, name), cmd
    for words, cmd in walk(main):
        for p in cmd.params:
            if getattr(p, "is_flag", False) or not isinstance(p.type, (click.types.StringParamType, Text)):
                continue
            plain = isinstance(p.type, Text)
            assert plain or p.callback is not None or p.name in OWN_EMPTY_CHECK[cmd.name], (words, p.name)
            yield words, p.opts[0] if isinstance(p, click.Option) else None, plain


@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_value_is_refused_for_every_string_option_and_argument(monkeypatch, value):
    from click.testing import CliRunner

    from bootstrap.cli import main

    touched = []
    monkeypatch.setattr("bootstrap.remote.ssh.SSHHost.connect", lambda self: touched.append(self.name))
    found = list(_string_params())
    assert ((("serve",), "--all2all", True) in found and (("sandbox", "up"), "--node-link", True) in found
            and (("rollout",), "--image", False) in found and (("bench",), "--prompt", False) in found)
    for words, opt, plain in found:
        args = [*words, *((opt,) if opt else ()), value]
        if words in (("serve",), ("rollout",)) and opt != "--all2all":
            args = [*words, "-i", str(ROOT / "inventory" / "example.yaml"), *args[len(words):]]
        r = CliRunner().invoke(main, args, env={"BOOTSTRAP_INVENTORY": None, "HF_TOKEN": "x"})
        lines = r.output.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, r.output)
        assert opt is None or opt in lines[0], (args, lines)
        assert not plain or "is empty" in lines[0], (args, lines)
    assert touched == []


def test_every_time_limit_is_a_timeout_and_the_old_names_still_work(subst):
    """One vocabulary: every option that limits a time is --timeout (or --X-timeout where a command
    has two), in --help and the reference; the former names (--wait, --deadline, --lock-wait,
    --drain, and --hosts for --limit) are hidden aliases for one release, read with a note, and
    refused beside their new name."""
    from bootstrap.cli import main
    from bootstrap.cli.params import Seconds

    def commands(group, path=()):
        for name, cmd in group.commands.items():
            yield (*path, name), cmd
            if isinstance(cmd, click.Group):
                yield from commands(cmd, (*path, name))

    limits = {}
    for path, cmd in commands(main):
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and isinstance(p.type, Seconds):
                limits[(" ".join(path), p.opts[-1])] = p
    assert ("up", "--timeout") in limits and ("serve", "--drain-timeout") in limits
    odd = sorted(k for k in limits if not k[1].endswith("timeout") and k[1] != "--interval")
    assert odd == [], f"time limits not named --timeout: {odd}"
    r, _ = cli("up", "--help")
    assert "--timeout" in r.stdout and "--wait" not in r.stdout and "--lock-wait" not in r.stdout
    # the old name is read as the new one, with a note
    r, _ = cli(*subst(["exec", "-i", "@INV@", "--hosts", "node2", "--timeout", "0.1", "--", "true"]))
    assert r.returncode == 1 and "unreachable: node2" in r.stderr and "node1" not in r.stderr, r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == "note: --hosts is now --limit; --hosts goes in the next release"
    r, _ = cli(*subst(["exec", "-i", "@INV@", "--hosts", "node1,nosuch", "--", "true"]))  # refused: one line
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--limit: unknown host(s) nosuch" in r.stderr
    r, _ = cli(*subst(["up", "-i", "@INV@", "--wait", "0"]))
    assert r.returncode == 2 and "--wait: 0 is not a positive number of seconds" in r.stderr, r.stderr
    # both names at once: one line, nothing contacted
    r, took = cli(*subst(["up", "-i", "@INV@", "--wait", "5", "--timeout", "5"]))
    assert r.returncode == 2 and "--wait is the old name of --timeout: give one of them" in r.stderr, r.stderr
    assert took < FAST
