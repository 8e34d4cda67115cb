"""Conventions a newcomer meets (issue 51, points 9 and 10): one connection failure printed once;
`monitor` and `sandbox` list their own commands; -i before the command as after it."""
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from bootstrap.cli import main

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [["up"], ["down", "--yes"], ["up", "--json"]])
def test_one_connection_failure_is_printed_as_it_happens_and_in_the_error_line_not_again(tmp_path, command):
    """Before: three times (the progress line, the `error:` line, the FAILED table). The `error:` line
    always carries the reason (the line a user acts on and a script reads); the table names the host
    only; the progress line says it as it happens (a stage whose failures a command may tolerate) or,
    with --json, nothing is printed live."""
    (tmp_path / "known_hosts").write_text("")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(f"cluster: {{accelerator: none, ssh: {{port: {free_port()}, known_hosts: {tmp_path}/known_hosts,"
                   " connect_retries: 0}}\nhosts: [{name: a, address: 127.0.0.1, ip: 192.0.2.10}]\n")
    r = subprocess.run([sys.executable, "-m", "bootstrap", *command, "-i", str(inv)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    said = r.stderr.count("cannot connect over SSH")
    assert said == (1 if "--json" in command else 2), r.stderr
    error = next(ln for ln in r.stderr.splitlines() if ln.startswith("error: "))
    assert "[a]" in error and "cannot connect over SSH" in error, r.stderr
    assert [ln.split() for ln in r.stderr.splitlines() if "FAILED" in ln] == [["a", "FAILED"]], r.stderr


@pytest.mark.parametrize("group", ["monitor", "sandbox"])
def test_subgroups_list_their_commands_under_their_own_heading(group):
    r = CliRunner().invoke(main, [group, "--help"])
    assert r.exit_code == 0
    headings = [line for line in r.output.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["Options:", "Commands:"], r.output


INVENTORY = "cluster: {accelerator: none}\nhosts: [{name: a, address: 192.0.2.1}]\n"


def test_inventory_before_the_command(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(INVENTORY)
    after = CliRunner().invoke(main, ["validate", "-i", str(inv)])
    for args in (["-i", str(inv), "validate"], ["--inventory", str(inv), "validate"],
                 ["-i", str(inv), "validate", "-i", str(inv)]):
        r = CliRunner().invoke(main, args)
        assert (r.exit_code, r.stdout) == (after.exit_code, after.stdout), r.output
    assert after.exit_code == 0


def test_inventory_before_and_after_with_different_values_is_one_line(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(INVENTORY)
    b.write_text(INVENTORY)
    r = CliRunner().invoke(main, ["-i", str(a), "validate", "-i", str(b)])
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "-i" in lines[0] and str(a) in lines[0] and str(b) in lines[0], r.stderr


def test_inventory_before_a_command_that_reads_none_is_refused(tmp_path):
    r = CliRunner().invoke(main, ["-i", str(tmp_path / "a.yaml"), "sandbox", "down"])
    assert r.exit_code == 2 and "inventory" in r.stderr, r.stderr
