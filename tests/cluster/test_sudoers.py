"""The least-privilege sudoers rule (cluster/guard/sudoers.py, `bootstrap sudoers`): real visudo parses
it, it names every command bootstrap runs as root, and the `sh -c` scripts it allows cannot be split into
another script (sudo compares the words joined by spaces): each split is run for real with sh."""
from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from bootstrap.cluster.guard import fence as FN
from bootstrap.cluster.guard import rootsh as RS
from bootstrap.cluster.guard import secretstore as SS
from bootstrap.cluster.guard import sudoers as SU
from bootstrap.inventory import load_inventory
from tests.support.sandbox import ROOT, cli

EXAMPLE = ROOT / "inventory" / "example.yaml"


def _example():
    return load_inventory(str(EXAMPLE), check_files=False, require_secrets=False)


@pytest.fixture(scope="module")
def inv():
    return _example()


def test_real_visudo_accepts_the_rule_and_it_names_each_root_command_once(inv):
    visudo = shutil.which("visudo") or "/usr/sbin/visudo"
    text = SU.snippet(inv, ["ops"])
    r = subprocess.run([visudo, "-cf", "-"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    commands = SU.root_commands(inv)
    assert len(commands) == len(set(commands)) == text.count("    /usr/")
    assert {a[0] for a in commands} <= set(SU.PATHS)
    # the fence (both backends), the secrets (write, add, remove), the exposure report and sudo's check
    name = inv.cluster.name
    for argv in (FN.install_argv(), FN.list_argv(inv), FN.iptables_jump_argv(inv), FN.iptables_remove_argv(inv),
                 SS.write_argv(name, prune=True), SS.remove_argv(name), FN.LISTENERS, ("true",)):
        assert argv in commands, argv
    assert text.rstrip().endswith("ops ALL=(root) BOOTSTRAP_LLAMA_405B"), text[-200:]
    assert "NOPASSWD" not in text and "ALL=(root) NOPASSWD: BOOTSTRAP" in SU.snippet(inv, ["ops"], nopasswd=True)
    assert "*" not in text.replace("\\*", "")  # no wildcard: each command line whole


def test_the_cli_prints_the_rule_for_every_non_root_ssh_user_and_refuses_a_bad_user(tmp_path):
    r = cli("sudoers", "-i", str(EXAMPLE))
    assert r.returncode == 0, r.stderr
    users = [ln.split()[0] for ln in r.stdout.splitlines() if " ALL=(root) " in ln]
    assert users == sorted({h.ssh.user for h in _example().hosts} - {"root"}), users
    r = cli("sudoers", "-i", str(EXAMPLE), "--user", "bad user")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--user" in r.stderr, r.stderr


def _sh_scripts(inv):
    return [a for a in SU.root_commands(inv) if a[:2] == ("sh", "-c")]


def test_every_other_split_of_an_allowed_sh_command_line_runs_nothing(inv, tmp_path):
    """Each allowed `sh -c SCRIPT ARGV0 ARGS` line, split at every other space into a script and its
    arguments (what the same sudo rule would also let through): sh refuses it (exit MISUSED, or a syntax
    error) and nothing is made where it ran."""
    work, shims = tmp_path / "cwd", tmp_path / "bin"
    shims.mkdir()
    for tool in ("mkdir", "chmod", "mv", "rm", "rmdir", "stat", "dirname", "iptables", "ip6tables", "cat"):
        (shims / tool).write_text(f'#!/bin/sh\n: > "$HOME/ran-{tool}"\n')  # a program run leaves a mark
        (shims / tool).chmod(0o755)
    for argv in _sh_scripts(inv):
        words = " ".join(argv[2:]).split(" ")
        real = len(argv[2].split(" "))
        for cut in range(1, len(words) + 1):
            if cut == real:
                continue
            work.mkdir()
            r = subprocess.run(["/bin/sh", "-c", " ".join(words[:cut]), *words[cut:]], cwd=work, capture_output=True,
                               input=b"serve/HF_TOKEN=x\n", timeout=30, env={"PATH": str(shims), "HOME": str(work)})
            assert r.returncode != 0 and not list(work.iterdir()), (cut, words[cut - 1:cut + 1], r.returncode, r.stderr)
            work.rmdir()


def test_the_guard_lets_the_script_run_whole_and_stops_it_with_another_argv0_or_count():
    ok = RS.root_sh('echo "ran $1"', "a")
    assert subprocess.run(ok, capture_output=True, text=True).stdout == "ran a\n"
    for argv in (ok[:3] + ("sh", "a"), ok + ("b",), ok[:4]):
        r = subprocess.run(argv, capture_output=True, text=True)
        assert (r.returncode, r.stdout) == (RS.MISUSED, ""), argv


@pytest.mark.parametrize("name", ["../../etc/x", "serve/../x", "serve/a b", "/x", "serve/x/y", "noslash", "serve/",
                                  "serve/1X"])
def test_the_secrets_script_refuses_a_name_that_is_not_set_slash_name_and_writes_nothing(name):
    if not Path("/dev/shm").is_dir():
        pytest.fail("/dev/shm is missing on this machine: the test needs a tmpfs")
    root = Path("/dev/shm") / f"bootstrap-test-{uuid.uuid4().hex[:8]}"
    try:
        r = subprocess.run(SS.write_argv("c1", prune=True, root=str(root)), input=f"{name}=s3cret-v\n".encode(),
                           capture_output=True, timeout=30)
        assert r.returncode == 4 and b"not SET/NAME=value" in r.stderr and b"s3cret" not in r.stderr, r.stderr
        assert not [p for p in root.rglob("*") if p.is_file()], list(root.rglob("*"))
    finally:
        subprocess.run(["rm", "-rf", str(root)])
